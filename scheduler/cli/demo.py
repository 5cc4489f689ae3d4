"""``scheduler demo`` (what ``make run`` runs): the whole pipeline on the local stack, live.

It initialises the database and topics, creates the ``demo`` app and one schedule of each kind a
user meets first (a cron every five seconds in a non-UTC zone, a delayed job, a job that fails
twice and then succeeds, one that always fails and is dead-lettered, and an HTTP job against an
endpoint it serves itself on 127.0.0.1), starts every component as a process, the API included
(with a secret made for the demo when none is configured, and a token for the demo app printed
with the API's URL), and shows runs as they complete. Ctrl-C (or ``--duration``) stops everything
it started, and cancels its schedules still active.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Collection
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click
import psycopg
from rich.console import Group
from rich.live import Live
from rich.text import Text

from scheduler.cli.common import DataTable, FiniteFloatRange, actor, database, wiring_or_exit
from scheduler.cli.init import initialise
from scheduler.runtime.supervisor import Supervisor, pipeline_children
from scheduler.schedule import service
from scheduler.schedule.spec import ScheduleSpec
from scheduler.store import runs as run_store
from scheduler.store import schedules as schedule_store

APP = "demo"
STATE_STYLE = {
    "succeeded": "green",
    "dead": "red",
    "retry_wait": "yellow",
    "running": "cyan",
    "dispatched": "blue",
    "pending": "white",
    "skipped": "dim",
}


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"hello": "from the demo endpoint"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _table(rows: list[dict[str, Any]]) -> DataTable:
    table = DataTable(title="runs (newest first) — Ctrl-C stops every component", expand=True)
    table.add_column("schedule", min_width=14, no_wrap=True)
    table.add_column("scheduled for (UTC)", min_width=12, no_wrap=True)
    table.add_column("state", min_width=10, no_wrap=True)
    table.add_column("attempt", justify="right", min_width=3)
    table.add_column("worker", min_width=8, max_width=22, overflow="ellipsis", no_wrap=True)
    table.add_column("error", ratio=1, overflow="ellipsis", no_wrap=True)
    for r in rows:
        table.add_row(
            r["schedule_name"],
            r["scheduled_for"].strftime("%H:%M:%S.%f")[:-3],
            Text(r["state"], style=STATE_STYLE.get(r["state"], "")),
            str(r["attempt"]),
            r["worker"] or "-",
            r["error"] or "",
        )
    return table


def _free(port: int) -> int:
    """``port`` if it can be bound now, else one the system picks (the demo must not fail on a
    machine where 8080 is taken)."""
    for candidate in (port, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", candidate))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    return port


def _demo_api(api_port: int, grpc_port: int, secret: str | None) -> tuple[int, int, str]:
    """The demo's API: its ports (set for the API child) and a token for the demo app, signed with
    the configured secret or, without one, with a secret made for this demo only."""
    api_port, grpc_port = _free(api_port), _free(grpc_port)
    if secret is None and not os.environ.get("SCHEDULER_JWT_JWKS"):
        secret = secrets.token_urlsafe(32)
        os.environ["SCHEDULER_JWT_SECRET"] = secret
    os.environ["SCHEDULER_API_PORT"], os.environ["SCHEDULER_GRPC_PORT"] = str(api_port), str(grpc_port)
    if secret is None:
        return api_port, grpc_port, "(signed by your JWKS's issuer: the demo cannot make one)"
    from scheduler.api.auth import Role, issue_token  # JWT and gRPC only for a demo, not every command

    return api_port, grpc_port, issue_token(secret, "demo-user", [Role.ADMIN], [APP])


@click.command()
@click.option(
    "--duration",
    type=FiniteFloatRange(0, 86_400, min_open=True),
    default=None,
    help="Stop by itself after this many seconds.",
)
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True)
def demo(duration: float | None, workers: int) -> None:
    """Run the whole pipeline with demo schedules and a live table of runs."""
    wiring = wiring_or_exit()
    settings = wiring.settings
    applied, created = initialise(wiring)
    click.echo(f"init: migrations {applied or 'up to date'}, topics {created or 'present'}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/hello"
    # The demo's own endpoint is on loopback, which builtin:http refuses unless allow-listed.
    os.environ["SCHEDULER_HTTP_ALLOWLIST"] = ",".join([*settings.http_allowlist, "127.0.0.1"])

    with database(wiring) as conn:
        service.create_app(conn, wiring.admin, settings, APP, 3, actor())
        now = schedule_store.db_now(conn)
        specs = {
            "every-5s-tokyo": ScheduleSpec(
                app=APP, kind="cron", cron="*/5 * * * * *", tz="Asia/Tokyo", handler="builtin:noop"
            ),
            "delayed-10s": ScheduleSpec(
                app=APP, kind="delayed", run_at=now + timedelta(seconds=10), handler="builtin:sleep",
                payload={"seconds": 1.5},
            ),
            "fails-twice": ScheduleSpec(
                app=APP, kind="immediate", handler="builtin:fail", payload={"times": 2},
                backoff_base_ms=1000, backoff_max_ms=4000,
            ),
            "always-fails": ScheduleSpec(
                app=APP, kind="immediate", handler="builtin:fail", payload={"times": 99},
                max_attempts=3, backoff_base_ms=500,
            ),
            "http-local": ScheduleSpec(
                app=APP, kind="cron", cron="*/15 * * * * *", handler="builtin:http", payload={"url": endpoint}
            ),
        }  # fmt: skip
        _cancel_demo_schedules(conn, specs)  # a fresh screen on every `make run`, after a crash too
        for name, spec in specs.items():
            service.create_schedule(conn, replace(spec, name=name), actor())

    api_port, grpc_port, token = _demo_api(settings.api_port, settings.grpc_port, settings.jwt.secret)
    click.echo(f"API: http://127.0.0.1:{api_port} (OpenAPI: /docs), gRPC: 127.0.0.1:{grpc_port}")
    click.echo(f"token for app {APP} (1 h): {token}")
    click.echo(
        f'  curl -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:{api_port}/v1/schedules?app={APP}"'
    )
    children = pipeline_children([APP], workers, concurrency=16, api=True)
    started = time.monotonic()
    with Live(Group(Text("starting components…")), refresh_per_second=4, transient=False) as live:
        last = 0.0

        def tick() -> None:
            nonlocal last
            if duration is not None and time.monotonic() - started > duration:
                os.kill(os.getpid(), signal.SIGINT)  # the same path as Ctrl-C
            if time.monotonic() - last < 0.5:
                return
            last = time.monotonic()
            with database(wiring) as conn:
                rows = run_store.list_runs(conn, app=APP, limit=20)
            live.update(_table(rows))

        code = Supervisor(children, metrics_port=settings.metrics_port, tick=tick).run()
    server.shutdown()
    # Left active, its crons would go on firing under any later `scheduler run all`, and the HTTP
    # one would be dead-lettered every 15 s: its endpoint and allow-list were this process's. What
    # a user created in the app meanwhile is theirs, and stays.
    with database(wiring) as conn:
        ended = _cancel_demo_schedules(conn, specs)
    click.echo(f"demo: its {ended} active schedules cancelled (their runs stay listed)")
    raise SystemExit(code)


def _cancel_demo_schedules(conn: psycopg.Connection[dict[str, Any]], names: Collection[str]) -> int:
    """Cancel the demo app's active schedules named ``names`` (the demo's own, not a user's)."""
    active = schedule_store.list_schedules(conn, app=APP, state="active", limit=100_000)
    ended = [s for s in active if s["name"] in names]
    for schedule in ended:
        service.cancel(conn, schedule["id"], actor())
    return len(ended)
