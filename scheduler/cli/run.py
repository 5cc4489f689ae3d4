"""``scheduler run <component>``: one pipeline component in the foreground until SIGTERM or Ctrl-C.

Every component is built by the composition root (:mod:`scheduler.wiring`) and run by the one
process lifecycle (:mod:`scheduler.runtime.process`): JSON logs (human on a terminal), traces when
``OTEL_*`` asks for them, and the health and metrics endpoints on ``--metrics-port`` (or
``SCHEDULER_METRICS_PORT``). ``run all`` supervises every component as a child process.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import click
import psycopg

from scheduler.cli.common import FiniteFloatRange, app_exists, fail, settings_or_exit, unknown_app
from scheduler.config import Settings
from scheduler.kafka.transport import KafkaUnavailable
from scheduler.runtime.process import run_component
from scheduler.runtime.service import Service
from scheduler.schedule.spec import InvalidSchedule, validate_app_name
from scheduler.store.refusals import first_line
from scheduler.store.schedules import app_names
from scheduler.telemetry.logs import configure_logging
from scheduler.telemetry.tracing import configure_tracing, shutdown_tracing
from scheduler.wiring import Wiring
from scheduler.worker.handlers import HandlerRegistry

# What a component's start-up says before its services run (a warning, a note): logged, so that it
# is a JSON line like the rest of the process's stderr. An error that stops the command is the
# CLI's one line instead (`fail`).
log = logging.getLogger("scheduler.run")

# How long `run worker` waits for Kafka, then PostgreSQL, to say whether its app exists (libpq
# counts whole seconds); without an answer the worker starts, and waits for its topic.
TOPIC_CHECK_TIMEOUT_S = 5.0
DATABASE_CHECK_TIMEOUT_S = 2

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port of /live, /ready, /startup, /health and /metrics [default: SCHEDULER_METRICS_PORT, or none].",
)


def _serve(
    component: str,
    build: Callable[[Wiring], list[Service]],
    metrics_port: int | None,
    grace_s: float = 30.0,
    settings: Settings | None = None,
) -> None:
    settings = settings or settings_or_exit()
    try:
        configure_logging(component)
    except ValueError as exc:
        fail(str(exc), code=2)
    configure_tracing(component)
    wiring = Wiring(settings)
    port = metrics_port if metrics_port is not None else settings.metrics_port
    try:
        services = build(wiring)
        try:
            code = run_component(
                component,
                services,
                wiring.registry_of(component),
                metrics_port=port,
                metrics_host=settings.metrics_host,
                grace_s=grace_s,
                refusal=wiring.database.refusal,
            )
        except OSError as exc:
            if port is None:
                raise  # nothing was to listen: not the endpoints' trouble
            # A setting's fault, as under `run all`: exit 2, the code of every bad setting.
            fail(
                f"{component}: cannot listen on {settings.metrics_host}:{port} "
                f"(--metrics-port or SCHEDULER_METRICS_PORT, SCHEDULER_METRICS_HOST): "
                f"{exc.strerror or exc}",
                code=2,
            )
    finally:
        shutdown_tracing()
    raise SystemExit(code)


@click.group()
def run() -> None:
    """Run a pipeline component."""


@run.command()
@metrics_port_option
def scanner(metrics_port: int | None) -> None:
    """Turn due schedules and retries into runs and outbox rows; move stored fires to newer zone rules."""
    _serve("scanner", lambda w: w.scanner_process(), metrics_port)


@run.command()
@metrics_port_option
def relay(metrics_port: int | None) -> None:
    """Publish the outbox to Kafka (runs stay pending until a worker starts them)."""
    _serve("relay", lambda w: [w.relay()], metrics_port)


@run.command()
@metrics_port_option
def reconciler(metrics_port: int | None) -> None:
    """Apply outcome events to PostgreSQL; sweep expired leases; release buffered fires."""
    _serve("reconciler", lambda w: w.reconciler(), metrics_port)


@run.command()
@metrics_port_option
def ingestor(metrics_port: int | None) -> None:
    """Apply schedule commands from Kafka to PostgreSQL; publish the rejected ones."""
    _serve("ingestor", lambda w: [w.ingestor()], metrics_port)


@run.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="HTTP/JSON port [default: SCHEDULER_API_PORT, 8080].",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="gRPC port [default: SCHEDULER_GRPC_PORT, 50051].",
)
@metrics_port_option
def api(port: int | None, grpc_port: int | None, metrics_port: int | None) -> None:
    """Serve the API (gRPC and HTTP/JSON, with an OpenAPI document at /openapi.json)."""
    import dataclasses

    from scheduler.api.server import listen

    settings = settings_or_exit()
    if not settings.jwt.configured:
        fail(
            "the API needs a key to verify tokens: set SCHEDULER_JWT_SECRET (HS256) or SCHEDULER_JWT_JWKS "
            "(a JWKS file or URL, RS256/ES256)",
            code=2,
        )
    settings = dataclasses.replace(
        settings,
        api_port=settings.api_port if port is None else port,
        grpc_port=settings.grpc_port if grpc_port is None else grpc_port,
    )
    try:
        http_socket = listen(settings.api_host, settings.api_port)
    except OSError as exc:
        fail(
            f"api: cannot listen on {settings.api_host}:{settings.api_port} "
            f"(--port or SCHEDULER_API_PORT, SCHEDULER_API_HOST): {exc.strerror or exc}",
            code=2,
        )
    try:
        probe = listen(settings.api_host, settings.grpc_port) if settings.grpc_port else None
    except OSError as exc:
        http_socket.close()
        fail(
            f"api: cannot listen on {settings.api_host}:{settings.grpc_port} "
            f"(--grpc-port or SCHEDULER_GRPC_PORT): {exc.strerror or exc}",
            code=2,
        )
    if probe is not None:
        probe.close()  # gRPC binds its own socket; this only turned a taken port into one line
    _serve("api", lambda wiring: wiring.api(http_socket), metrics_port, grace_s=30.0, settings=settings)


handler_option = click.option(
    "--handler",
    "handlers",
    multiple=True,
    metavar="ENTRY",
    help="Python handlers to run besides the builtins: package.module (its public callables) or "
    "package.module:function; repeatable, added to SCHEDULER_HANDLERS and the installed "
    "scheduler.handlers entry points.",
)


@run.command()
@click.option("--app", required=True, help="The app whose jobs to execute.")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=16, show_default=True)
@click.option(
    "--grace",
    type=FiniteFloatRange(0, 3600),
    default=30.0,
    show_default=True,
    help="Seconds to finish jobs on SIGTERM.",
)
@handler_option
@metrics_port_option
def worker(
    app: str, concurrency: int, grace: float, handlers: tuple[str, ...], metrics_port: int | None
) -> None:
    """Execute the jobs of one app (a consumer group member of its topic)."""
    try:
        validate_app_name(app)
    except InvalidSchedule as exc:
        fail(str(exc), code=2)
    settings = settings_or_exit()

    def build(wiring: Wiring) -> list[Service]:
        _refuse_unknown_app(settings, app)  # once logging is set up: it may log why it starts anyway
        try:
            return [wiring.worker(app, concurrency, grace, handlers)]
        except ValueError as exc:  # InvalidRegistration, or a malformed SCHEDULER_HTTP_ALLOWLIST
            fail(str(exc), code=2)

    _serve("worker", build, metrics_port, grace_s=grace, settings=settings)


def _refuse_unknown_app(settings: Settings, app: str) -> None:
    """Exit 2 for an app that does not exist, rather than wait for its topic for ever.

    A worker needs only Kafka (in Kubernetes it has no database to ask), and may start before its
    app's topic is made (its pod beside the Job that makes it): the topic is enough, and only
    without it is PostgreSQL asked whether the app exists. When neither answers, the worker starts
    and waits for the topic; its /ready names it."""
    wiring = Wiring(settings)
    topic = settings.jobs_topic(app)
    try:
        if topic in wiring.admin.topics(TOPIC_CHECK_TIMEOUT_S):
            return
    except KafkaUnavailable:
        return  # the worker waits for Kafka itself
    try:
        with wiring.database.connect(connect_timeout=DATABASE_CHECK_TIMEOUT_S) as conn:
            exists = app_exists(conn, app)
    except psycopg.Error:
        log.warning("Kafka has no topic %s: the worker waits for it (is %r an app?)", topic, app)
        return
    if not exists:
        unknown_app(app)
    log.info(
        "app %r has no topic %s yet: the worker waits for it (`scheduler init` makes it, as the relay "
        "does before it publishes a job of the app)",
        app,
        topic,
    )


@run.command("all")
@click.option("--app", "apps", multiple=True, help="Apps to run workers for (default: every app).")
@click.option(
    "--workers", type=click.IntRange(1, 64), default=1, show_default=True, help="Worker processes per app."
)
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=16, show_default=True)
@handler_option
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="First of the consecutive ports given to the components [default: SCHEDULER_METRICS_PORT].",
)
def all_(
    apps: tuple[str, ...],
    workers: int,
    concurrency: int,
    handlers: tuple[str, ...],
    metrics_port: int | None,
) -> None:
    """Every component as its own process, restarted if it dies; Ctrl-C or SIGTERM stops them all."""
    from scheduler.cli.common import database, known_app
    from scheduler.runtime.supervisor import Supervisor, pipeline_children, worker_children

    for app in apps:
        # Said here, as `run worker` says it, whether PostgreSQL answers or not: a name no app can
        # have would only crash-loop its worker children while the supervisor waits for PostgreSQL.
        try:
            validate_app_name(app)
        except InvalidSchedule as exc:
            fail(str(exc), code=2)
    every_app = not apps
    settings = settings_or_exit()
    try:
        configure_logging("supervisor")
    except ValueError as exc:
        fail(str(exc), code=2)
    try:
        # A bad entry would only crash-loop every worker child: said once, here, instead.
        HandlerRegistry(settings.http_allowlist, [*settings.handlers, *handlers])
    except ValueError as exc:  # InvalidRegistration, or a malformed SCHEDULER_HTTP_ALLOWLIST
        fail(str(exc), code=2)
    wiring = Wiring(settings)
    # PostgreSQL down is an outage to wait out, as every component waits it out: not a reason to
    # stop. A URL it refuses for good is (one line, exit 1): there is nothing to wait for.
    silent = _database_silence(wiring)
    if silent is None:
        with database(wiring) as conn:
            if apps:
                for app in apps:
                    known_app(conn, app)
            else:
                apps = tuple(app_names(conn))
    elif apps:
        # Each worker asks Kafka for its app's topic, as `run worker` does without a database.
        log.warning(
            "%s; apps %s not checked: every component starts and waits for it", silent, ", ".join(apps)
        )
    else:
        log.warning(
            "%s; the components start and wait for it, the workers once it lists the apps (asking again "
            "in %.0f s)",
            silent,
            DATABASE_RETRY_INITIAL_S,
        )
    base = metrics_port if metrics_port is not None else settings.metrics_port
    children = pipeline_children(apps, workers, concurrency, handlers, api=settings.jwt.configured)
    if base is not None and base + len(children) - 1 > 65535:
        last = base + len(children) - 1
        fail(f"--metrics-port {base}: {len(children)} components need ports {base} to {last}", code=2)
    _refuse_taken_ports(settings, base, len(children))
    if silent is None and not apps:
        log.warning(NO_APPS)
    if not settings.jwt.configured:
        log.warning("no API (set SCHEDULER_JWT_SECRET or SCHEDULER_JWT_JWKS to serve it)")
    if silent is None and not every_app:
        raise SystemExit(Supervisor(children, metrics_port=base).run())

    # Without --app, PostgreSQL is asked for the apps (again, when it did not answer at start) for
    # as long as it runs; with them, only whether it refuses the URL for good.
    watch = _AppWatch(wiring, listed=None if silent is not None else apps, every_app=every_app)
    apps_listed = silent is None  # by PostgreSQL, at start or since: the apps it gives next are new

    def tick() -> None:
        nonlocal apps_listed
        wrong = watch.wrong_url()
        if wrong is not None:
            # As at start, though the components run by now: the wait would never end.
            log.error("%s: stopping every component", wrong)
            supervisor.stop(1)
            return
        found = watch.apps()
        if found is None:
            return
        added = worker_children(found, workers, concurrency, handlers)
        refusal = _ports_refused(supervisor.next_port, len(added))
        if supervisor.stopping:
            return  # a signal came meanwhile: its stop, and its exit status
        if refusal is not None and apps_listed:
            # A new app's: the pipeline and the other apps' workers run on (stopping them all for
            # one app's port would stop every app's jobs); its workers are not started, since one
            # that cannot listen would only die and be restarted, again and again.
            several = len(found) > 1
            log.error(
                "new app%s %s: %s: %s workers are not started (restart run all to run them)",
                "s" if several else "",
                ", ".join(found),
                refusal,
                "their" if several else "its",
            )
            return
        if refusal is not None:
            # As a taken port refuses `run all` at start: its first workers are its point.
            log.error("%s: stopping every component", refusal)
            supervisor.stop(2)
            return
        if apps_listed:
            for app in found:
                log.info("new app %s: starting its workers", app)
        elif found:
            log.info("PostgreSQL answers: workers for %s", ", ".join(found))
        else:
            log.warning(NO_APPS)
        apps_listed = True
        supervisor.add(added)

    # Without --app the workers' lines may come later, in the table's columns: its names as wide as
    # the worker of an app named with RESERVED_APP_CHARS characters.
    reserved = "a" * RESERVED_APP_CHARS
    widest = worker_children([reserved], workers, concurrency, handlers)[-1].name if every_app else ""
    supervisor = Supervisor(children, metrics_port=base, tick=tick, name_width=len(widest))
    watch.start()
    try:
        code = supervisor.run()
    finally:
        watch.stop()
    raise SystemExit(code)


def _ports_refused(first: int | None, count: int) -> str | None:
    """Why ``count`` components on the metrics ports from ``first`` on could not listen, or None when
    they can: those ``run all`` starts (whose range is checked before) and the workers it adds."""
    from scheduler.devstack.process import port_in_use

    if first is None or not count:
        return None
    last = first + count - 1
    if last > 65535:
        return f"--metrics-port: the workers need ports {first} to {last}, past 65535"
    taken = next((port for port in range(first, last + 1) if port_in_use(port)), None)
    return None if taken is None else f"port {taken} is in use by another process (set --metrics-port)"


# The app name whose workers' lines the table of `run all` without --app keeps room for, for
# workers it adds later: most names are shorter. A longer one (up to 48 characters) widens its line
# rather than every table, which the longest would make about 100 characters wide.
RESERVED_APP_CHARS = 24

NO_APPS = "no apps yet, so no workers (create one with `scheduler apps create NAME`)"

DATABASE_RETRY_INITIAL_S = 1.0
DATABASE_RETRY_MAX_S = 30.0
"""How often ``run all``, started while PostgreSQL does not answer, asks it again for the apps:
after 1 s, then twice as long each time, at most every 30 s; a warning line each time. An outage
that comes once the workers run is waited out the same way, from :data:`APPS_WATCH_S` on."""

APPS_WATCH_S = 5.0
"""How often ``run all`` without ``--app`` asks PostgreSQL for the apps, once it has listed them:
an app created meanwhile (``scheduler apps create``, the API) gets its workers within this long."""


def _database_silence(wiring: Wiring) -> str | None:
    """Why PostgreSQL does not answer (within :data:`DATABASE_CHECK_TIMEOUT_S`), or None when it
    does; one line and exit 1 when it refuses the URL for good."""
    try:
        wiring.database.connect(connect_timeout=DATABASE_CHECK_TIMEOUT_S).close()
    except psycopg.OperationalError as exc:
        wrong = wiring.database.refusal(exc)
        if wrong is not None:
            fail(wrong)
        return _why(wiring, exc)
    return None


def _why(wiring: Wiring, error: psycopg.Error) -> str:
    """The warning's words for PostgreSQL's failure to list the apps: its first line, no password."""
    where = wiring.database.display
    if isinstance(error, psycopg.errors.UndefinedTable):
        return f"PostgreSQL at {where} has no scheduler schema yet (`scheduler init` makes it)"
    return f"PostgreSQL at {where} is unavailable ({first_line(error)})"


class _AppWatch:
    """``run all``'s watch of the apps, in a thread of its own, so that the supervisor goes on
    watching the components it started (and stops at once on a signal) whatever PostgreSQL does.

    Without ``--app`` (``every_app``), PostgreSQL is asked for the apps' names until ``run all``
    stops, on one connection kept open: every :data:`APPS_WATCH_S` once it has listed them, each
    app not ``listed`` before handed to the supervisor once. ``listed`` None: it did not answer at
    start, and every answer until the first is a warning line. An outage after that is said once,
    and so is its end: the workers run meanwhile, and would drown in a line every few seconds.
    With ``--app``, only whether PostgreSQL, silent at start, refuses the URL for good is asked,
    silently, until it answers. A refusal for good ends the watch before PostgreSQL has answered
    ``run all`` (its check at start included); after that it is an outage like any other, as it is
    to every component (see :meth:`Database.refusal`)."""

    def __init__(self, wiring: Wiring, *, listed: Sequence[str] | None, every_app: bool = True) -> None:
        self._wiring = wiring
        self._every_app = every_app
        self._known = None if listed is None else set(listed)
        self._stop = threading.Event()
        self._found: queue.SimpleQueue[tuple[str, ...]] = queue.SimpleQueue()
        self._wrong_url: str | None = None
        self._conn: psycopg.Connection[dict[str, Any]] | None = None  # the watch thread's alone
        self._thread = threading.Thread(target=self._watch, name="apps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # Not joined: a connection attempt under way ends within its timeout, or with the process.
        self._stop.set()

    def apps(self) -> tuple[str, ...] | None:
        """The apps to start workers for, each given once: every app when PostgreSQL first lists
        them (none, maybe) if it did not answer at start, then those created since; None when
        there is nothing new."""
        try:
            return self._found.get_nowait()
        except queue.Empty:
            return None

    def wrong_url(self) -> str | None:
        """The error line, once PostgreSQL has refused the URL for good (it is not asked again)."""
        return self._wrong_url

    def _watch(self) -> None:
        delay = DATABASE_RETRY_INITIAL_S if self._known is None else APPS_WATCH_S
        outage = False  # said, once the workers run
        try:
            while not self._stop.wait(delay):
                try:
                    if not self._every_app:
                        self._wiring.database.connect(connect_timeout=DATABASE_CHECK_TIMEOUT_S).close()
                        return
                    names = self._names()
                except psycopg.Error as exc:
                    self._close()
                    self._wrong_url = self._wiring.database.refusal(exc)
                    if self._wrong_url is not None:
                        return
                    delay = min(delay * 2, DATABASE_RETRY_MAX_S)
                    if not self._every_app or self._stop.is_set():
                        continue
                    if self._known is None:
                        log.warning(
                            "%s; no workers yet (asking again in %.0f s)", _why(self._wiring, exc), delay
                        )
                    elif not outage:
                        outage = True
                        log.warning(
                            "%s; the workers run on, those of an app created meanwhile once it answers "
                            "(asking again, quietly)",
                            _why(self._wiring, exc),
                        )
                    continue
                except Exception:
                    # Not PostgreSQL failing but a bug: said with its traceback, and asked again; a
                    # watch ended here would leave every app created since without workers, silently.
                    self._close()
                    delay = min(delay * 2, DATABASE_RETRY_MAX_S)
                    log.exception("the watch of the apps failed; asking again in %.0f s", delay)
                    continue
                delay = APPS_WATCH_S
                if outage:
                    outage = False
                    log.info("PostgreSQL at %s answers again", self._wiring.database.display)
                new = tuple(name for name in names if self._known is None or name not in self._known)
                if new or self._known is None:
                    self._known = {*(self._known or ()), *new}
                    self._found.put(new)
        finally:
            self._close()

    def _names(self) -> list[str]:
        """The apps' names, on the connection kept from the last answer while it still works."""
        if self._conn is not None:
            try:
                return app_names(self._conn)
            except psycopg.OperationalError:
                # Ended meanwhile (PostgreSQL restarted, an idle session timed out): a new one says
                # whether PostgreSQL is down.
                self._close()
        self._conn = self._wiring.database.connect(autocommit=True, connect_timeout=DATABASE_CHECK_TIMEOUT_S)
        return app_names(self._conn)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _refuse_taken_ports(settings: Settings, metrics_base: int | None, components: int) -> None:
    """One line and exit 2 for a port another process holds, or an address no socket can listen on:
    its component would only fail to start, again and again, under the supervisor's restarts."""
    from scheduler.devstack.process import port_in_use
    from scheduler.runtime.health import try_listen

    def api_listen(host: str) -> None:
        from scheduler.api.server import listen  # uvicorn and grpc only for a run with the API

        listen(host, 0).close()

    hosts: list[tuple[str, str, Callable[[str], None]]] = []
    if settings.jwt.configured:
        hosts.append((settings.api_host, "SCHEDULER_API_HOST", api_listen))
    if metrics_base is not None:
        hosts.append((settings.metrics_host, "SCHEDULER_METRICS_HOST", try_listen))
    for host, setting, bind in hosts:
        try:  # as the component will bind it
            bind(host)
        except OSError as exc:
            # create_server adds "(while attempting to bind on address …)": the port 0 of this check.
            reason = (exc.strerror or str(exc)).split(" (while attempting", 1)[0]
            fail(f"{setting}={host!r}: cannot listen there: {reason}", code=2)
    if settings.jwt.configured:
        for port, setting in (
            (settings.api_port, "SCHEDULER_API_PORT"),
            (settings.grpc_port, "SCHEDULER_GRPC_PORT"),
        ):
            if port and port_in_use(port):
                fail(f"port {port} is in use by another process (set {setting})", code=2)
    refusal = _ports_refused(metrics_base, components)
    if refusal is not None:
        fail(refusal, code=2)
