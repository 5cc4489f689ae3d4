"""A thin, typed layer over confluent-kafka: the producer, the consumer and topic admin.

It is the only module that imports ``confluent_kafka`` (the schema registry client aside), so its
types, errors and callbacks stop here: callers see :class:`OutgoingMessage`, :class:`Received`,
:class:`Partition`, :class:`Offset` and the :class:`TransportError` family. Every client is
configured here and only here, from one :class:`~scheduler.kafka.connection.KafkaConnection`, so
TLS and SASL apply to all of them and delivery guarantees are decided in one place: producers are
idempotent with ``acks=all`` and a failed delivery is a :class:`DeliveryError` instead of a message
that vanished; consumers never auto-commit and read only committed transactional data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as _Consumer
from confluent_kafka import Producer as _Producer
from confluent_kafka.admin import AdminClient, NewTopic, TopicMetadata  # type: ignore[attr-defined]
from prometheus_client import Gauge

from scheduler.kafka.connection import KafkaConnection
from scheduler.runtime.service import Check

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]

# A 1 MiB payload is valid (docs/architecture.md) and its job message adds the schedule's other fields on top;
# librdkafka's default (1,000,000 bytes) would refuse it before it reached the broker.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class TransportError(RuntimeError):
    """Kafka failed us: every error of this module is one, none of confluent-kafka's escapes it."""

    def __init__(self, message: str, *, code: str | None = None, retriable: bool = False) -> None:
        super().__init__(message)
        self.code = code  # librdkafka's error name, e.g. "MSG_SIZE_TOO_LARGE" or "_TRANSPORT"
        self.retriable = retriable


class DeliveryError(TransportError):
    """A message (or a batch: see ``failures``) that Kafka did not acknowledge; it is not sent."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retriable: bool = False,
        failures: Sequence[DeliveryError] = (),
    ) -> None:
        super().__init__(message, code=code, retriable=retriable)
        self.failures = tuple(failures)

    @property
    def too_large(self) -> bool:
        """Refused for its size (by the client's or the topic's limit): sending it again cannot help."""
        return self.code == "MSG_SIZE_TOO_LARGE"


class KafkaUnavailable(TransportError):
    """The cluster did not answer in time."""


class ConsumerError(TransportError):
    """The consumer reported an error (a commit refused, a topic it may not read, ...)."""


_E = TypeVar("_E", bound=TransportError)


def _error(kind: type[_E], prefix: str, err: KafkaError) -> _E:
    return kind(f"{prefix}{err.str()}", code=err.name(), retriable=err.retriable())


def _from_exception(kind: type[_E], prefix: str, exc: KafkaException) -> _E:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return _error(kind, prefix, err)
    return kind(f"{prefix}{exc}")


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    topic: str
    value: bytes
    key: bytes | None = None
    headers: Headers = field(default_factory=list)


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Offset:
    """Where a consumer group resumes: ``offset`` is the next one to read, as Kafka's commit wants."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None
    """The message's timestamp (its producer's, or the broker's append time), if it has one."""

    def header(self, name: str) -> bytes | None:
        """The first value of header ``name``, or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


DeliveryCallback = Callable[[DeliveryError | None], None]
"""Called once per message, from whichever thread serves delivery reports (poll or flush)."""
RebalanceCallback = Callable[[list[Partition]], None]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Kafka's answer to an asynchronous commit, for one partition: confirmed when ``error`` is None."""

    offset: Offset
    error: ConsumerError | None = None


CommitCallback = Callable[[list[CommitResult]], None]
"""Called with the answer to each asynchronous commit, from inside a later consume, poll or close."""


ERROR_LOG_EVERY_S = 60.0


class _ClientErrors:
    """librdkafka's error events as our own log lines: one warning per kind of error a minute,
    not librdkafka's own line per reconnect attempt (hundreds a minute while a broker is down)."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._logged: dict[str, float] = {}

    def __call__(self, err: KafkaError) -> None:
        now = time.monotonic()
        name = err.name()
        if now - self._logged.get(name, -ERROR_LOG_EVERY_S) >= ERROR_LOG_EVERY_S:
            self._logged[name] = now
            log.warning("Kafka client %s: %s (%s)", self.client_id, err.str(), name)


_ERRORS_BY_CLIENT: dict[str, _ClientErrors] = {}


def _client_errors(client_id: str) -> _ClientErrors:
    """One log of errors per client name: a worker's consumer and producer share theirs, and the
    same broker's error reached each, so the same line was logged twice."""
    return _ERRORS_BY_CLIENT.setdefault(client_id, _ClientErrors(client_id))


def _base_config(connection: KafkaConnection, client_id: str) -> dict[str, Any]:
    return connection.librdkafka() | {
        "client.id": client_id,
        "socket.keepalive.enable": True,
        # Only librdkafka's critical lines reach stderr unformatted; its errors (a refused
        # connection, a failed SASL handshake) come through error_cb as our own warnings.
        "log_level": 2,
        "error_cb": _client_errors(client_id),
    }


def producer_config(
    connection: KafkaConnection, client_id: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    config = _base_config(connection, client_id) | {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000,
        "message.timeout.ms": 30_000,
        "message.max.bytes": DEFAULT_MAX_MESSAGE_BYTES,
    }
    return config | dict(overrides or {})


def _of_partitions(message: Message, partitions: set[Partition]) -> bool:
    topic, partition = message.topic(), message.partition()
    return topic is not None and partition is not None and Partition(topic, partition) in partitions


def _batch_length(held: Sequence[Received], max_messages: int, max_bytes: int | None) -> int:
    """How many of ``held`` the next batch takes: up to ``max_messages``, and with ``max_bytes``
    only as many as that holds, but always one."""
    taken = min(max_messages, len(held))
    if max_bytes is None:
        return taken
    size = 0
    for index, message in enumerate(held[:taken]):
        size += len(message.value)
        if size > max_bytes and index > 0:
            return index
    return taken


# How many messages a byte-bounded consume takes from librdkafka at a time.
_BYTES_CHUNK = 64


def consumer_config(
    connection: KafkaConnection,
    group_id: str,
    client_id: str,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    config = _base_config(connection, client_id) | {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        # How long the broker holds a fetch that finds nothing (librdkafka's default); a message
        # arriving answers it at once, so this paces a quiet consumer's requests: 2 a second
        # rather than 20 at 50 ms, each costing the broker CPU (bench/README.md, Kafka's requests).
        # The cost: librdkafka keeps one fetch in flight per broker, so a partition assigned or
        # resumed meanwhile is first fetched when that one returns, up to 500 ms later.
        "fetch.wait.max.ms": 500,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        # What librdkafka fetches ahead of the application, as C memory outside Python's: 64 MiB by
        # default, counted per partition (librdkafka issue 4137), so a reconciler assigned the 36
        # partitions of its three topics prefetched a whole backlog of dead letters (540 MB of
        # them: 470 MiB resident before its first batch). 1 MiB a partition is thousands of
        # ordinary messages, or one large one, ready for the next batch.
        "queued.max.messages.kbytes": 1024,
        "fetch.max.bytes": 16 * 1024 * 1024,
    }
    return config | dict(overrides or {})


class Producer:
    """An idempotent producer (acks=all). Safe to use from several threads, as librdkafka's is."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._producer = _Producer(dict(config))

    def produce(self, message: OutgoingMessage, on_delivery: DeliveryCallback | None = None) -> None:
        """Queue ``message``; ``on_delivery`` learns its outcome once Kafka answered.

        Raises :class:`DeliveryError` when the client refuses it at once (too large, unknown
        partition); then ``on_delivery`` is not called.
        """
        callback = None if on_delivery is None else _delivery_report(on_delivery)
        while True:
            try:
                self._producer.produce(
                    message.topic,
                    value=message.value,
                    key=message.key,
                    headers=message.headers or None,
                    on_delivery=callback,
                )
                return
            except BufferError:
                # The local queue is full: serve delivery reports to make room, then try again.
                # librdkafka lets several threads poll at once, so this is safe from any thread,
                # but the reports served here run their callbacks in this thread.
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise _from_exception(DeliveryError, f"{message.topic}: ", exc) from None

    def send(self, messages: Sequence[OutgoingMessage], timeout_s: float = 60.0) -> None:
        """Produce a batch and wait for every acknowledgement; raise :class:`DeliveryError` otherwise.

        The batch is all or nothing for the caller: after an error some of it may be on Kafka,
        none of it counts as sent.
        """
        failures: list[DeliveryError] = []
        acked = 0

        def on_delivery(error: DeliveryError | None) -> None:
            nonlocal acked
            if error is None:
                acked += 1
            else:
                failures.append(error)

        for message in messages:
            try:
                self.produce(message, on_delivery)
            except DeliveryError as exc:
                failures.append(exc)
        remaining = self.flush(timeout_s)
        if failures or remaining or acked != len(messages):
            raise _batch_error(len(messages), acked, failures, remaining, timeout_s)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports (their callbacks run in this thread); returns how many were served."""
        return self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        """Wait for every queued message's outcome; returns how many are still unanswered."""
        return self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        remaining = self.flush(timeout_s)
        if remaining:
            log.warning("%d messages still unacknowledged when the producer closed", remaining)


def _delivery_report(on_delivery: DeliveryCallback) -> Callable[[KafkaError | None, Message], None]:
    def report(err: KafkaError | None, message: Message) -> None:
        on_delivery(None if err is None else _error(DeliveryError, f"{message.topic()}: ", err))

    return report


def _batch_error(
    total: int, acked: int, failures: Sequence[DeliveryError], remaining: int, timeout_s: float
) -> DeliveryError:
    reasons: dict[str, int] = {}
    for failure in failures:
        reasons[str(failure)] = reasons.get(str(failure), 0) + 1
    if remaining:
        reasons[f"no answer within {timeout_s:.0f} s"] = remaining
    listed = "; ".join(f"{reason} (x{count})" if count > 1 else reason for reason, count in reasons.items())
    first = failures[0] if failures else None
    return DeliveryError(
        f"{total - acked} of {total} messages not acknowledged: {listed or 'no delivery report'}",
        code=None if first is None else first.code,
        retriable=all(f.retriable for f in failures),
        failures=failures,
    )


class Consumer:
    """A member of a consumer group with manual commits: an offset is committed only when asked.

    Subscribed at construction. The rebalance callbacks run inside :meth:`consume` and
    :meth:`poll`; ``on_assign`` runs once the partitions are assigned (so it may pause them),
    ``on_revoke`` and ``on_lost`` while they still are (so ``on_revoke`` may commit them).
    ``on_lost`` defaults to ``on_revoke``, as in librdkafka. ``on_commit`` learns Kafka's answer to
    each asynchronous commit (a commit counts as done only once confirmed). Use from one thread only.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        *,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
        on_commit: CommitCallback | None = None,
    ) -> None:
        config = dict(config)
        if on_commit is not None:
            config["on_commit"] = _commit_report(on_commit)
        self._consumer = _Consumer(config)
        # Under the cooperative protocol a rebalance hands over only what changes, and the
        # assignment must be changed incrementally; the eager protocol replaces it whole.
        self._cooperative = "cooperative" in str(config.get("partition.assignment.strategy", "")) or (
            str(config.get("group.protocol", "")) == "consumer"
        )
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost or on_revoke
        # Errors that came in a batch with good messages: raised by the next call, so that the
        # messages already taken from librdkafka are returned rather than dropped.
        self._pending_errors: list[TransportError] = []
        # A message that arrived during poll(): handed out by the next consume().
        self._held: list[Received] = []
        # What a byte-bounded consume has taken from librdkafka so far, chunk by chunk.
        self._collecting: list[Message] = []
        self._closed = False
        with _consumer_errors("subscribe"):
            self._consumer.subscribe(
                list(topics), on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
            )

    # -- rebalances (called by librdkafka from inside consume/poll) -------------------------------

    def _assigned(self, _consumer: _Consumer, partitions: list[TopicPartition]) -> None:
        if self._cooperative:
            self._consumer.incremental_assign(partitions)
        else:
            self._consumer.assign(partitions)
        if self._on_assign is not None:
            self._on_assign(_partitions(partitions))

    def _revoked(self, _consumer: _Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(partitions, self._on_revoke)

    def _lost(self, _consumer: _Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(partitions, self._on_lost)

    def _let_go(self, partitions: list[TopicPartition], callback: RebalanceCallback | None) -> None:
        gone = _partitions(partitions)
        # A held message of a partition we give up is its next owner's to read.
        leaving = set(gone)
        self._held = [m for m in self._held if Partition(m.topic, m.partition) not in leaving]
        self._collecting = [m for m in self._collecting if not _of_partitions(m, leaving)]
        try:
            if callback is not None:
                callback(gone)
        finally:
            if self._cooperative:
                self._consumer.incremental_unassign(partitions)
            else:
                self._consumer.unassign()

    # -- consuming -------------------------------------------------------------------------------

    def consume(self, max_messages: int, timeout_s: float, max_bytes: int | None = None) -> list[Received]:
        """Up to ``max_messages`` messages, waiting at most ``timeout_s`` for the first; with
        ``max_bytes``, no more than their values fill (but always one): the rest are kept, in
        order, for the next calls.

        Partition EOF is skipped. Any other error raises :class:`ConsumerError` (or
        :class:`KafkaUnavailable`), but only once the good messages fetched with it were returned:
        the next call raises it.
        """
        self._raise_pending()
        if not self._held:
            with _consumer_errors("consume"):
                messages = (
                    self._consumer.consume(max_messages, timeout_s)
                    if max_bytes is None
                    else self._consume_bytes(max_messages, timeout_s, max_bytes)
                )
            self._held = self._received(messages)
            if not self._held:
                self._raise_pending()
        taken = _batch_length(self._held, max_messages, max_bytes)
        batch, self._held = self._held[:taken], self._held[taken:]
        return batch

    def _consume_bytes(self, max_messages: int, timeout_s: float, max_bytes: int) -> list[Message]:
        """Up to ``max_messages`` messages from librdkafka, a chunk at a time until they pass
        ``max_bytes``: no more than about that is copied out of its queue into Python's memory (its
        queue then refills). A rebalance served by a later chunk drops what the earlier ones took of
        the partitions it revokes (:meth:`_let_go` filters ``_collecting``), as librdkafka does
        within one call."""
        self._collecting = self._consumer.consume(min(max_messages, _BYTES_CHUNK), timeout_s)
        try:
            size = sum(len(message.value() or b"") for message in self._collecting)
            while self._collecting and size <= max_bytes and len(self._collecting) < max_messages:
                more = self._consumer.consume(min(max_messages - len(self._collecting), _BYTES_CHUNK), 0)
                if not more:
                    break
                self._collecting.extend(more)
                size += sum(len(message.value() or b"") for message in more)
            return self._collecting
        finally:
            self._collecting = []

    def poll(self, timeout_s: float) -> None:
        """Serve rebalances and stay in the group without taking work (all partitions paused).

        A message that arrives anyway (at most one per call: a partition that is not paused) is
        kept for the next :meth:`consume`, never dropped.
        """
        self._raise_pending()
        with _consumer_errors("poll"):
            messages = self._consumer.consume(1, timeout_s)
        self._held.extend(self._received(messages))

    def _received(self, messages: list[Message]) -> list[Received]:
        good = []
        for message in messages:
            err = message.error()
            if err is None:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                good.append(
                    Received(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        value=message.value() or b"",
                        key=message.key(),
                        headers=_headers(message),
                        timestamp_ms=_timestamp_ms(message),
                    )
                )
            elif err.code() != KafkaError._PARTITION_EOF:
                unavailable = err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
                kind: type[TransportError] = KafkaUnavailable if unavailable else ConsumerError
                self._pending_errors.append(_error(kind, "", err))
        return good

    def _raise_pending(self) -> None:
        if self._pending_errors:
            first, *rest = self._pending_errors
            self._pending_errors = []
            if rest:
                log.warning("%d more consumer errors after %s: %s", len(rest), first, rest[-1])
            raise first

    # -- offsets and flow ------------------------------------------------------------------------

    def commit(self, offsets: Sequence[Offset], asynchronous: bool = False) -> None:
        """Commit ``offsets`` (each the next one to read). A synchronous commit raises
        :class:`ConsumerError` unless every partition was confirmed; an asynchronous one's answer
        goes to ``on_commit`` (unreported without one)."""
        if not offsets:
            return
        partitions = [TopicPartition(o.topic, o.partition, o.offset) for o in offsets]
        with _consumer_errors("commit"):
            if asynchronous:
                self._consumer.commit(offsets=partitions, asynchronous=True)
                return
            committed = self._consumer.commit(offsets=partitions, asynchronous=False)
        for tp in committed:
            if tp.error is not None:
                raise _error(ConsumerError, f"commit of {tp.topic}[{tp.partition}] failed: ", tp.error)

    def pause(self, partitions: Sequence[Partition]) -> None:
        if partitions:
            with _consumer_errors("pause"):
                self._consumer.pause(_topic_partitions(partitions))

    def resume(self, partitions: Sequence[Partition]) -> None:
        if partitions:
            with _consumer_errors("resume"):
                self._consumer.resume(_topic_partitions(partitions))

    def assignment(self) -> list[Partition]:
        with _consumer_errors("assignment"):
            return _partitions(self._consumer.assignment())

    def lag(self) -> dict[Partition, int]:
        """Per assigned partition, messages between this consumer's position and the end of the log.

        From the watermarks the last fetch responses brought (no request to the broker), so cheap
        enough for every metrics scrape; a partition that has consumed nothing since its assignment
        has no known position and is left out.
        """
        lags: dict[Partition, int] = {}
        with _consumer_errors("lag"):
            assigned = self._consumer.assignment()
            for tp in self._consumer.position(assigned) if assigned else ():
                if tp.offset < 0:
                    continue
                watermarks = self._consumer.get_watermark_offsets(tp, cached=True)
                if watermarks is None or watermarks[1] < 0:
                    continue
                lags[Partition(tp.topic, tp.partition)] = max(0, watermarks[1] - tp.offset)
        return lags

    def close(self) -> None:
        """Leave the group (revoking partitions through the callbacks); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        with _consumer_errors("close"):
            self._consumer.close()


def _timestamp_ms(message: Message) -> int | None:
    kind, value = message.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else value


def _commit_report(on_commit: CommitCallback) -> Callable[[KafkaError | None, list[TopicPartition]], None]:
    def report(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        # A request that failed as a whole may leave its partitions without an error of their own.
        whole = None if err is None or err.code() == KafkaError._NO_OFFSET else err
        results = []
        for tp in partitions:
            failure = tp.error or whole
            error = (
                None
                if failure is None
                else _error(ConsumerError, f"commit of {tp.topic}[{tp.partition}] failed: ", failure)
            )
            results.append(CommitResult(Offset(tp.topic, tp.partition, tp.offset), error))
        on_commit(results)

    return report


@contextmanager
def _consumer_errors(what: str) -> Iterator[None]:
    try:
        yield
    except KafkaException as exc:
        raise _from_exception(ConsumerError, f"{what} failed: ", exc) from None


def _headers(message: Message) -> tuple[tuple[str, bytes | None], ...]:
    raw = message.headers() or ()
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    # A consumer gets bytes; the str case exists only in the client's types (for producing).
    return tuple((name, value.encode() if isinstance(value, str) else value) for name, value in pairs)


def _partitions(partitions: Iterable[TopicPartition]) -> list[Partition]:
    return [Partition(tp.topic, tp.partition) for tp in partitions]


def _topic_partitions(partitions: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in partitions]


class ConsumerSlot:
    """A service's consumer: built on first use, closed and dropped after a failure, and so built
    afresh (from the committed offsets) by the next use. Every consuming service holds one."""

    def __init__(self, factory: Callable[[], Consumer]) -> None:
        self._factory = factory
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._factory()
        return self._consumer

    @property
    def built(self) -> Consumer | None:
        """The consumer if there is one now (for probes and gauges, which must not build one)."""
        return self._consumer

    def observe_lag(self, gauge: Gauge) -> int | None:
        """Set ``gauge{topic,partition}`` to each assigned partition's lag; returns their sum, or
        None when there is no consumer. Cleared first: a partition revoked since the last look
        must not keep reporting its old value."""
        consumer = self._consumer
        if consumer is None:
            return None
        lag = consumer.lag()
        gauge.clear()
        for partition, behind in lag.items():
            gauge.labels(partition.topic, str(partition.partition)).set(behind)
        return sum(lag.values())

    def check(self) -> Check:
        """Readiness of the group membership: a consumer exists (joining or assigned)."""

        def probe() -> str | None:
            consumer = self._consumer
            if consumer is None:
                raise ConsumerError("no consumer: it is being rebuilt")
            return None

        return Check("consumer_group", probe)

    def close(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            # Still ``built`` while it closes: its revoke callback commits through it.
            consumer.close()
        except RuntimeError as exc:  # TransportError, or confluent-kafka's "consumer closed"
            log.debug("closing a consumer: %s", exc)
        finally:
            self._consumer = None


def not_led(listed: Mapping[str, TopicMetadata], names: Iterable[str]) -> list[str]:
    """Why each of the topics ``names`` is not ready by the metadata ``listed``: not listed, listed
    with an error, or with partitions that have no leader (or an error). Empty when all are ready."""
    pending = []
    for name in names:
        topic = listed.get(name)
        if topic is None:
            pending.append(f"topic {name} is not listed")
        elif topic.error is not None:
            pending.append(f"topic {name} is listed with an error ({topic.error.str()})")
        elif not topic.partitions:
            pending.append(f"topic {name} has no partitions")
        else:
            unled = sorted(p.id for p in topic.partitions.values() if p.error is not None or p.leader < 0)
            if unled:
                pending.append(f"topic {name} has no leader for partitions {unled}")
    return pending


INTERRUPTIBLE_REQUEST_S = 1.0
"""The longest metadata request :meth:`TopicAdmin.topics_interruptibly` makes: how long a Ctrl-C may
wait for it, and how long a broker has to answer."""


class TopicAdmin:
    """Topics, and the metadata round trip that tells whether the cluster answers."""

    def __init__(
        self,
        connection: KafkaConnection | str,
        *,
        quiet: bool = False,
        client_id: str = "scheduler-admin",
        logs_why: bool = False,
    ) -> None:
        """``logs_why``: a metadata request Kafka did not answer logs librdkafka's reason (a failed
        SASL handshake, a refused connection), for a component's log; a command of the CLI says
        in its own one line that Kafka did not answer."""
        # A bare bootstrap string is a PLAINTEXT cluster (the local stack, tests).
        connection = KafkaConnection(connection) if isinstance(connection, str) else connection
        config = _base_config(connection, client_id)
        self._logs_why = logs_why and not quiet
        if quiet:
            # A cluster that is not up yet is an expected answer to some callers, not a log line.
            config |= {"log_level": 0, "socket.connection.setup.timeout.ms": 2000}
        self._admin = AdminClient(config)

    def _metadata(self, timeout_s: float, topic: str | None = None) -> Any:
        try:
            return self._admin.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            # Why it did not answer (a refused connection, a failed SASL handshake) reaches the
            # error callback only when the client is polled: list_topics does not serve it.
            if self._logs_why:
                self._admin.poll(0)
            raise _from_exception(
                KafkaUnavailable, "Kafka did not answer a metadata request: ", exc
            ) from None

    def ping(self, timeout_s: float = 5.0) -> float:
        """Seconds one metadata round trip took; raises :class:`KafkaUnavailable` without an answer."""
        started = time.monotonic()
        metadata = self._metadata(timeout_s)
        if not metadata.brokers:
            raise KafkaUnavailable("Kafka answered a metadata request with no brokers")
        return time.monotonic() - started

    def ensure_topics(
        self,
        names: Iterable[str],
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> list[str]:
        """Create the topics that do not exist yet; returns the ones created now. Returns once
        each of them is listed with a leader for every partition (raises KafkaUnavailable if that
        takes longer than ``timeout_s``)."""
        existing = self.topics(timeout_s)
        wanted = [n for n in names if n not in existing]
        if not wanted:
            return []
        futures = self._admin.create_topics(
            [
                NewTopic(n, num_partitions=partitions, replication_factor=-1, config=dict(config or {}))
                for n in wanted
            ],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        created = []
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as exc:
                # Another process created it between our look and our create: that is what we wanted.
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise _from_exception(TransportError, f"creating topic {name} failed: ", exc) from None
        self._wait_led(wanted, timeout_s)
        return created

    def _wait_led(self, names: Sequence[str], timeout_s: float) -> None:
        # A topic is listed before its partitions have leaders, and until they do every produce to
        # it or read of its offsets fails (NOT_LEADER_FOR_PARTITION). Waiting for them makes that
        # unlikely, not impossible: a broker may be named leader a moment before it serves the
        # partition, so callers still retry.
        # Each metadata request gets only the time left, so a slow broker cannot stretch the wait
        # past timeout_s (the relay passes a short one to keep its claim).
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            pending = not_led(self._metadata(max(left, 0.1)).topics, names)
            if not pending:
                return
            if left <= 0:
                raise KafkaUnavailable(f"after {timeout_s:.0f} s, {'; '.join(pending)}")
            time.sleep(min(0.05, left))

    def topics(self, timeout_s: float = 10.0) -> set[str]:
        return {name for name in self._metadata(timeout_s).topics if not name.startswith("__")}

    def topics_interruptibly(self, timeout_s: float = 10.0) -> set[str]:
        """:meth:`topics`, asked in requests of at most :data:`INTERRUPTIBLE_REQUEST_S` until
        ``timeout_s`` has passed: librdkafka's call holds Python's signal handlers until it returns,
        so one request of the whole timeout keeps a Ctrl-C waiting for all of it. The connection to
        a broker goes on between requests; only an answer must come within one."""
        deadline = time.monotonic() + timeout_s
        while True:
            asked = time.monotonic()
            try:
                return self.topics(max(min(deadline - asked, INTERRUPTIBLE_REQUEST_S), 0.001))
            except KafkaUnavailable:
                if time.monotonic() >= deadline:
                    raise
            # A request refused at once (no broker to ask yet) is not repeated in a busy loop.
            time.sleep(max(min(asked + INTERRUPTIBLE_REQUEST_S, deadline) - time.monotonic(), 0))

    def partitions(self, topic: str, timeout_s: float = 10.0) -> int:
        return len(self._metadata(timeout_s, topic).topics[topic].partitions)

    def delete_topics(self, names: Sequence[str], timeout_s: float = 30.0) -> None:
        if not names:
            return
        for name, future in self._admin.delete_topics(list(names), operation_timeout=timeout_s).items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise _from_exception(TransportError, f"deleting topic {name} failed: ", exc) from None
