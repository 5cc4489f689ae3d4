"""The composition root: the one place that turns settings into clients and components.

Everything that holds a connection or a codec is built here: the Avro codec (with the schema
registry when one is configured), the job dispatcher, the PostgreSQL database, Kafka producers,
consumers and the admin client, and each component with the collaborators it needs. Components
never read settings to build their own clients, so a test or a benchmark can hand them other
ones, and there is exactly one place that decides, say, the relay's producer timeouts.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from scheduler.client import ScheduleClient
from scheduler.config import Settings
from scheduler.ingest.ingestor import MAX_REJECTION_BYTES, Ingestor, RejectionPublisher
from scheduler.kafka.avro import AvroCodec
from scheduler.kafka.positions import GroupPositions
from scheduler.kafka.registry import SchemaRegistry, registry_for
from scheduler.kafka.transport import (
    Consumer,
    KafkaUnavailable,
    Producer,
    TopicAdmin,
    consumer_config,
    producer_config,
)
from scheduler.reconcile.buffer_release import BufferRelease
from scheduler.reconcile.lease_sweeper import LeaseSweeper
from scheduler.reconcile.reconciler import Reconciler
from scheduler.relay.relay import Relay
from scheduler.runtime.service import Check, Service
from scheduler.scan.dispatch import JobDispatcher
from scheduler.scan.scanner import Scanner
from scheduler.scan.zone_rules import ZoneRulesRecompute
from scheduler.store.database import Database
from scheduler.worker.handlers import HandlerRegistry
from scheduler.worker.worker import Worker, WorkerTopics

# Under a kubelet's default probe timeout of a second.
KAFKA_PROBE_TIMEOUT_S = 0.8
# Each request costs the broker the same CPU however few messages it carries: at 1,000 fires/s
# the broker answered a fetch of the reconciler for every few outcome events (538 fetches a
# second) and a produce request of each worker every 5 ms (230 a second each), and that was
# about half a core (bench/README.md, "Kafka's requests"). The reconciler only needs its
# events within a few tenths of a second, so its fetch waits for a batch's worth of bytes or
# 100 ms; a worker's producer waits 10 ms, a fifth of the 50 ms that a held job's start is
# announced ahead of its instant (ANNOUNCE_AHEAD), leaving 40 of them for Kafka's answer.
RECONCILER_FETCH = {"fetch.min.bytes": 256 * 1024, "fetch.wait.max.ms": 100}
WORKER_LINGER_MS = 10
R = TypeVar("R", bound=Reconciler)


def instance_name(component: str, *, unique: bool = False) -> str:
    """The name of this process's instance of a component: Kafka client ids, relay claims and the
    worker names in ``runs`` use it. ``unique`` adds a suffix for components of which one process
    may hold several (relays in tests and benchmarks), whose claims must not be confused."""
    name = f"{component}-{socket.gethostname()}-{os.getpid()}"
    return f"{name}-{uuid.uuid4().hex[:6]}" if unique else name


class Wiring:
    """Builds what a command needs, once each; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    # --- shared collaborators ------------------------------------------------------------------

    @cached_property
    def schema_registry(self) -> SchemaRegistry | None:
        return registry_for(self.settings.schema_registry_url)

    @cached_property
    def codec(self) -> AvroCodec:
        registry = self.schema_registry
        return AvroCodec(schema_for_id=None if registry is None else registry.schema_for_id)

    @cached_property
    def dispatcher(self) -> JobDispatcher:
        return JobDispatcher(self.settings, self.codec)

    @cached_property
    def database(self) -> Database:
        return Database(self.settings.database_url, self.settings.database_display)

    @cached_property
    def admin(self) -> TopicAdmin:
        return TopicAdmin(self.settings.kafka)

    def producer(self, client_id: str, overrides: Mapping[str, Any] | None = None) -> Producer:
        return Producer(producer_config(self.settings.kafka, client_id, overrides))

    def consumer_factory(
        self,
        group: str,
        topics: Sequence[str],
        client_id: str,
        overrides: Mapping[str, Any] | None = None,
    ) -> Callable[[], Consumer]:
        """A consumer is rebuilt after a transport failure, so components get a factory."""
        config = consumer_config(self.settings.kafka, group, client_id, overrides)
        return lambda: Consumer(config, topics)

    def schedule_client(self, client_id: str) -> ScheduleClient:
        """A producer of schedule commands for the configured cluster, prefix and schema registry.

        The client is a public library class that builds its own codec and producer; this is the
        one place the CLI gets one from."""
        return ScheduleClient.from_settings(self.settings, client_id=client_id)

    def kafka_check(self, topic: str | None = None) -> Check:
        """Kafka answers a metadata request (and, given ``topic``, has that topic)."""
        admin = self.admin

        def probe() -> str | None:
            if topic is None:
                return f"{admin.ping(KAFKA_PROBE_TIMEOUT_S) * 1000:.1f} ms metadata round trip"
            if topic not in admin.topics(KAFKA_PROBE_TIMEOUT_S):
                raise KafkaUnavailable(f"topic {topic} does not exist: is its app created?")
            return None

        return Check("kafka", probe)

    # --- components ----------------------------------------------------------------------------

    def scanner(self) -> Scanner:
        return Scanner(self.settings, self.database, self.dispatcher)

    def scanner_process(self) -> list[Service]:
        """The scanner, and beside it the pass that moves stored next fires to newer zone rules
        (the scanner's rules advance every fire, so its process is where they are judged): one
        process."""
        return [self.scanner(), self.zone_rules_recompute()]

    def zone_rules_recompute(self) -> ZoneRulesRecompute:
        return ZoneRulesRecompute(self.database, self.settings.lookahead_s)

    def relay(self) -> Relay:
        name = instance_name("relay", unique=True)
        # The producer gives up on a message well before the batch's transaction reaches its bound
        # (the server would end the session), so a slow Kafka makes a batch fail and be handed back
        # rather than be published twice by two relays.
        timeout_ms = int(min(30.0, self.settings.relay_claim_s / 2) * 1000)
        # A factory: a producer broken for good (a fatal idempotence error) is replaced. The
        # relay's own admin client checks topics; the health probe keeps its own.
        return Relay(
            self.settings,
            self.database,
            lambda: self.producer(name, {"message.timeout.ms": timeout_ms}),
            TopicAdmin(self.settings.kafka, logs_why=True),
            self.kafka_check(),
            name=name,
        )

    def reconciler(self) -> list[Service]:
        """The reconciler proper, the lease sweeper (with the history's retention) and the buffer
        release: one process."""
        return [self.reconciler_service(), self.lease_sweeper(), self.buffer_release()]

    def reconciler_service(self, kind: type[R] = Reconciler) -> R:  # type: ignore[assignment]
        s = self.settings
        consumers = self.consumer_factory(
            f"{s.topic_prefix}.reconciler",
            [s.results_topic, s.retry_topic, s.dlq_topic],
            instance_name("reconciler"),
            RECONCILER_FETCH,
        )
        return kind(s, self.database, consumers, self.codec, self.kafka_check())

    def lease_sweeper(self) -> LeaseSweeper:
        s = self.settings
        # Where the reconciler's group stands on the outcome topics: the sweeper waits for it.
        positions = GroupPositions(
            s.kafka,
            f"{s.topic_prefix}.reconciler",
            [s.results_topic, s.retry_topic, s.dlq_topic],
            instance_name("lease-sweeper"),
        )
        # Its dead letters go through the outbox: it needs no producer.
        return LeaseSweeper(
            self.database,
            positions,
            self.dispatcher,
            self.codec,
            self.kafka_check(),
            s.dlq_topic,
            lease_window_s=s.lease_window_s,
            retention_days=s.history_retention_days,
        )

    def buffer_release(self) -> BufferRelease:
        return BufferRelease(self.database, self.dispatcher)

    def ingestor(self) -> Ingestor:
        name = instance_name("ingestor")
        s = self.settings
        # A rejection carries its command's bytes, which may exceed what a job message needs.
        producer = self.producer(name, {"message.max.bytes": MAX_REJECTION_BYTES})
        publisher = RejectionPublisher(s.rejected_topic, self.codec, self.schema_registry, producer)
        consumers = self.consumer_factory(f"{s.topic_prefix}.ingestor", [s.schedules_topic], name)
        return Ingestor(
            s, self.database, consumers, publisher, self.codec, self.dispatcher, self.kafka_check(), name=name
        )

    def worker(self, app: str, concurrency: int, grace_s: float, handlers: Sequence[str] = ()) -> Worker:
        """A worker of ``app`` running the builtins, ``SCHEDULER_HANDLERS``, ``handlers`` (``--handler``)
        and the installed ``scheduler.handlers`` entry points; raises
        :class:`~scheduler.worker.handlers.InvalidRegistration` when one cannot be loaded."""
        name = instance_name("worker")
        s = self.settings
        topics = WorkerTopics(
            jobs=s.jobs_topic(app),
            group=s.worker_group(app),
            results=s.results_topic,
            retry=s.retry_topic,
            dlq=s.dlq_topic,
        )
        overrides: dict[str, Any] = {
            # A member that stops polling this long leaves the group; jobs run in other threads.
            "max.poll.interval.ms": 300_000,
        }
        if s.group_instance_id is not None:
            # Static membership: a restarted worker takes its partitions back without moving
            # everyone else's (within the session timeout).
            overrides["group.instance.id"] = s.group_instance_id
        consumer = consumer_config(s.kafka, topics.group, name, overrides)
        registry = HandlerRegistry(s.http_allowlist, [*s.handlers, *handlers])
        return Worker(
            app,
            topics,
            codec=self.codec,
            handlers=registry,
            # librdkafka retries a delivery for as long as this allows; the worker then produces
            # the outcome again, for as long as it runs.
            producer=self.producer(name, {"message.timeout.ms": 300_000, "linger.ms": WORKER_LINGER_MS}),
            consumers=lambda **callbacks: Consumer(consumer, [topics.jobs], **callbacks),
            kafka_check=self.kafka_check(topics.jobs),
            concurrency=concurrency,
            grace_s=grace_s,
            name=name,
        )

    def api(self, http_socket: socket.socket) -> list[Service]:
        """The API on ``http_socket`` (bound by the caller) and ``SCHEDULER_GRPC_PORT``, and its
        retention sweep; raises ``ValueError`` when no JWT key is configured."""
        from scheduler.api.auth import Authenticator
        from scheduler.api.server import ApiServer, RetentionSweep
        from scheduler.api.service import SchedulerApi

        s = self.settings
        authenticator = Authenticator(s.jwt)
        pool = self.database.pool(
            s.api_pool_size,
            statement_timeout_s=s.api_statement_timeout_s,
            lock_timeout_s=s.api_lock_timeout_s,
        )
        api = SchedulerApi(s, pool, authenticator, self.dispatcher)
        grpc_host = f"[{s.api_host}]" if ":" in s.api_host else s.api_host
        # Twice as many call threads as connections: a call beyond the pool waits for a connection
        # at most the pool's timeout and answers UNAVAILABLE, where it would otherwise queue for a
        # thread without bound behind calls that PostgreSQL holds up.
        server = ApiServer(
            api, pool, http_socket, f"{grpc_host}:{s.grpc_port}", self.database, workers=2 * s.api_pool_size
        )
        return [server, RetentionSweep(self.database)]

    def registry_of(self, component: str) -> CollectorRegistry:
        """The metrics registry a component's ``/metrics`` serves: its own metrics only."""
        if component == "api":
            from scheduler.api.metrics import REGISTRY
        elif component == "scanner":
            from scheduler.scan.metrics import REGISTRY
        elif component == "relay":
            from scheduler.relay.metrics import REGISTRY
        elif component == "reconciler":
            from scheduler.reconcile.metrics import REGISTRY
        elif component == "ingestor":
            from scheduler.ingest.metrics import REGISTRY
        elif component == "worker":
            from scheduler.worker.metrics import REGISTRY
        else:
            raise ValueError(f"no component named {component!r}")
        return REGISTRY
