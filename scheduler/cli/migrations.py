"""``scheduler migrations``: is the database's schema the one this release needs?

``scheduler init`` migrates; these only read. ``wait`` is what a Kubernetes init container runs
(``k8s/``): a component's pod starts only once the migration Job has brought the schema up to this
image's version, so no component ever runs against a schema older than its code. A schema newer
than the code (the Job of the next release already ran, the rollout is under way) is fine: a
migration only adds to the schema, so the previous release goes on working on it.
"""

from __future__ import annotations

import time

import click
import psycopg

from scheduler.cli.common import FiniteFloatRange, echo_json, fail, wiring_or_exit
from scheduler.store.migrate import Migration, pending
from scheduler.wiring import Wiring

POLL_S = 2.0
# A server that accepts and never answers must not hold a check past its --timeout.
CONNECT_TIMEOUT_S = 10


def _status(wiring: Wiring, timeout_s: float = CONNECT_TIMEOUT_S) -> tuple[list[Migration], list[int]]:
    # libpq counts connect_timeout in whole seconds, and 1 is its least.
    seconds = max(1, min(CONNECT_TIMEOUT_S, int(timeout_s)))
    with wiring.database.connect(connect_timeout=seconds) as conn:
        return pending(conn)


def _reason(exc: psycopg.Error) -> str:
    """libpq's first line (it names host and port, never the password), or the error's class."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _names(missing: list[Migration]) -> str:
    return ", ".join(f"{m.version:04d}_{m.name}" for m in missing)


@click.group()
def migrations() -> None:
    """The database schema's version (`scheduler init` applies migrations)."""


@migrations.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def status(as_json: bool) -> None:
    """Show which migrations of this release are applied; exit 1 when some are not, 2 when the
    database cannot be read."""
    wiring = wiring_or_exit()
    try:
        missing, newer = _status(wiring)
    except psycopg.Error as exc:
        fail(
            f"cannot read the schema version from PostgreSQL at {wiring.database.display}: {_reason(exc)}",
            code=2,
        )
    if as_json:
        echo_json(
            {
                "up_to_date": not missing,
                "pending": [f"{m.version:04d}_{m.name}" for m in missing],
                "unknown_applied": newer,
            }
        )
    elif missing:
        click.echo(f"pending migrations: {_names(missing)} (run `scheduler init`)")
    else:
        click.echo("schema up to date")
    if newer and not as_json:
        click.echo(f"the database also has migrations newer than this release: {newer}")
    raise SystemExit(1 if missing else 0)


@migrations.command("wait")
@click.option(
    "--timeout",
    type=FiniteFloatRange(0, 86_400),
    default=300.0,
    show_default=True,
    help="Seconds to wait before giving up (exit 1).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (when up to date).")
def wait(timeout: float, as_json: bool) -> None:
    """Wait until every migration of this release is applied (by `scheduler init`, elsewhere).

    PostgreSQL being unreachable is waited out too: the database may be starting alongside.
    """
    wiring = wiring_or_exit()
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        try:
            missing, _ = _status(wiring, deadline - time.monotonic())
            state = f"waiting for migrations: {_names(missing)}" if missing else ""
        except psycopg.Error as exc:
            # Unreachable, refused, or not yet allowed to read: all may be put right meanwhile.
            state = f"waiting for PostgreSQL at {wiring.database.display}: {_reason(exc)}"
        if not state:
            if as_json:
                echo_json({"up_to_date": True})
            else:
                click.echo("schema up to date")
            return
        if state != said:  # one line per change, not one per poll
            click.echo(state, err=True)
            said = state
        if time.monotonic() >= deadline:
            fail(f"gave up after {timeout:g} s {state}")
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
