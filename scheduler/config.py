"""Every setting of every component, read from ``SCHEDULER_*`` environment variables.

Defaults point at the local stack that ``scheduler dev up`` starts, so after it every command just
works; in production each is set by the deployment. Values are validated once, here, and a bad one
is reported as a single line naming the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PG_PORT = 54329
DEFAULT_KAFKA_PORT = 19092
DEFAULT_KAFKA_CONTROLLER_PORT = 19093

_PREFIX_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$")


class ConfigError(ValueError):
    """A ``SCHEDULER_*`` variable has a value the scheduler cannot use."""


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    database_url: str
    kafka_bootstrap: str
    topic_prefix: str = "sched"
    schema_registry_url: str | None = None
    # Local stack only (``scheduler dev``).
    stack_dir: Path = field(default_factory=lambda: _project_root() / ".stack")
    pg_port: int = DEFAULT_PG_PORT
    kafka_port: int = DEFAULT_KAFKA_PORT
    kafka_controller_port: int = DEFAULT_KAFKA_CONTROLLER_PORT
    # Pipeline tuning.
    scan_batch_size: int = 500
    relay_batch_size: int = 1000
    relay_claim_s: float = 60.0
    max_scan_sleep_s: float = 1.0
    catchup_window_s: float = 60.0
    http_allowlist: tuple[str, ...] = ()
    metrics_port: int | None = None

    @property
    def schedules_topic(self) -> str:
        return f"{self.topic_prefix}.schedules"

    @property
    def rejected_topic(self) -> str:
        return f"{self.topic_prefix}.schedules.rejected"

    @property
    def results_topic(self) -> str:
        return f"{self.topic_prefix}.results"

    @property
    def retry_topic(self) -> str:
        return f"{self.topic_prefix}.retry"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.dlq"

    @property
    def core_topics(self) -> tuple[str, ...]:
        return (
            self.schedules_topic,
            self.rejected_topic,
            self.results_topic,
            self.retry_topic,
            self.dlq_topic,
        )

    def jobs_topic(self, app: str) -> str:
        return f"{self.topic_prefix}.jobs.{app}"


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def _float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; raises :class:`ConfigError` with one line on bad input."""
    env = os.environ if env is None else env
    pg_port = _int(env, "SCHEDULER_PG_PORT", DEFAULT_PG_PORT, 1, 65535)
    kafka_port = _int(env, "SCHEDULER_KAFKA_PORT", DEFAULT_KAFKA_PORT, 1, 65535)
    controller_port = _int(env, "SCHEDULER_KAFKA_CONTROLLER_PORT", DEFAULT_KAFKA_CONTROLLER_PORT, 1, 65535)
    if len({pg_port, kafka_port, controller_port}) != 3:
        raise ConfigError(
            "SCHEDULER_PG_PORT, SCHEDULER_KAFKA_PORT and SCHEDULER_KAFKA_CONTROLLER_PORT must differ"
        )

    database_url = env.get("SCHEDULER_DATABASE_URL") or (
        f"postgresql://scheduler@127.0.0.1:{pg_port}/scheduler"
    )
    if not database_url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"SCHEDULER_DATABASE_URL={database_url!r} must be a postgresql:// URL")
    kafka_bootstrap = env.get("SCHEDULER_KAFKA_BOOTSTRAP") or f"127.0.0.1:{kafka_port}"
    for server in kafka_bootstrap.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"SCHEDULER_KAFKA_BOOTSTRAP={kafka_bootstrap!r} must be host:port[,host:port...]"
            )

    prefix = env.get("SCHEDULER_TOPIC_PREFIX") or "sched"
    if not _PREFIX_RE.match(prefix):
        raise ConfigError(
            f"SCHEDULER_TOPIC_PREFIX={prefix!r} may hold only letters, digits, '.', '_' and '-'"
        )
    registry = env.get("SCHEDULER_SCHEMA_REGISTRY_URL") or None
    if registry is not None and not registry.startswith(("http://", "https://")):
        raise ConfigError(f"SCHEDULER_SCHEMA_REGISTRY_URL={registry!r} must be an http(s) URL")

    stack_dir = Path(env.get("SCHEDULER_STACK_DIR") or _project_root() / ".stack").resolve()
    metrics_port = _int(env, "SCHEDULER_METRICS_PORT", 0, 0, 65535) or None
    allowlist = tuple(
        item.strip() for item in env.get("SCHEDULER_HTTP_ALLOWLIST", "").split(",") if item.strip()
    )
    return Settings(
        database_url=database_url,
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=prefix,
        schema_registry_url=registry,
        stack_dir=stack_dir,
        pg_port=pg_port,
        kafka_port=kafka_port,
        kafka_controller_port=controller_port,
        scan_batch_size=_int(env, "SCHEDULER_SCAN_BATCH_SIZE", 500, 1, 100_000),
        relay_batch_size=_int(env, "SCHEDULER_RELAY_BATCH_SIZE", 1000, 1, 100_000),
        relay_claim_s=_float(env, "SCHEDULER_RELAY_CLAIM_SECONDS", 60.0, 2.0, 3600.0),
        max_scan_sleep_s=_float(env, "SCHEDULER_MAX_SCAN_SLEEP", 1.0, 0.01, 60.0),
        catchup_window_s=_float(env, "SCHEDULER_CATCHUP_WINDOW", 60.0, 0.0, 86_400.0),
        http_allowlist=allowlist,
        metrics_port=metrics_port,
    )
