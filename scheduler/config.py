"""Every setting of every component, read from ``SCHEDULER_*`` environment variables.

Defaults point at the local stack that ``scheduler dev up`` starts, so after it every command just
works; in production each is set by the deployment. Values are validated once, here, and a bad one
is reported as a single line naming the variable.

Secrets (the PostgreSQL password, the SASL password, the TLS key's password) come from a variable or
from a file named by ``<variable>_FILE`` (a mounted Kubernetes Secret). No secret is ever part of a
``ConfigError``, of ``repr(Settings)`` or of :attr:`Settings.database_display`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from scheduler.kafka.connection import (
    EndpointIdentification,
    InvalidKafkaConnection,
    KafkaConnection,
    SaslMechanism,
    SecurityProtocol,
)

DEFAULT_PG_PORT = 54329
DEFAULT_KAFKA_PORT = 19092
DEFAULT_KAFKA_CONTROLLER_PORT = 19093

_PREFIX_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

# The variable behind each field of KafkaConnection, so that its errors name what the operator set.
KAFKA_VARIABLES = {
    "bootstrap": "SCHEDULER_KAFKA_BOOTSTRAP",
    "security_protocol": "SCHEDULER_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "SCHEDULER_KAFKA_SASL_MECHANISM",
    "sasl_username": "SCHEDULER_KAFKA_SASL_USERNAME",
    "sasl_password": "SCHEDULER_KAFKA_SASL_PASSWORD",
    "ssl_ca_location": "SCHEDULER_KAFKA_SSL_CA_LOCATION",
    "ssl_certificate_location": "SCHEDULER_KAFKA_SSL_CERTIFICATE_LOCATION",
    "ssl_key_location": "SCHEDULER_KAFKA_SSL_KEY_LOCATION",
    "ssl_key_password": "SCHEDULER_KAFKA_SSL_KEY_PASSWORD",
    "ssl_endpoint_identification": "SCHEDULER_KAFKA_SSL_ENDPOINT_IDENTIFICATION",
}
# libpq parameters that may also be given one by one, merged over those of the URL.
DATABASE_VARIABLES = {
    "sslmode": "SCHEDULER_DATABASE_SSLMODE",
    "sslrootcert": "SCHEDULER_DATABASE_SSLROOTCERT",
    "sslcert": "SCHEDULER_DATABASE_SSLCERT",
    "sslkey": "SCHEDULER_DATABASE_SSLKEY",
    "password": "SCHEDULER_DATABASE_PASSWORD",
}


class ConfigError(ValueError):
    """A ``SCHEDULER_*`` variable has a value the scheduler cannot use."""


HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_PAIR_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
# Below this an HS256 secret can be guessed offline from any token it signed (RFC 7518 §3.2).
MIN_JWT_SECRET_BYTES = 32


@dataclass(frozen=True)
class JwtSettings:
    """How the API verifies bearer tokens: an HMAC secret, or the public keys of a JWKS (a file or an
    https URL), never both; the algorithms a token may use are pinned to the key's kind."""

    secret: str | None = None
    jwks: str | None = None
    algorithms: tuple[str, ...] = ()
    issuer: str | None = None
    audience: str | None = None
    roles_claim: str = "roles"
    apps_claim: str = "apps"
    leeway_s: float = 30.0

    @property
    def configured(self) -> bool:
        return self.secret is not None or self.jwks is not None

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)} | {
            "secret": None if self.secret is None else "(set)"
        }
        return f"JwtSettings({', '.join(f'{name}={value!r}' for name, value in shown.items())})"


# Requests per principal and method class, as (count, period in seconds); a bucket holds `count`
# tokens (its burst) and refills at count/period a second. SCHEDULER_API_RATE_LIMITS overrides any.
DEFAULT_RATE_LIMITS: dict[str, tuple[int, float]] = {
    "create": (100, 60.0),
    "create_batch": (20, 60.0),
    "update": (100, 60.0),
    "delete": (100, 60.0),
    "get": (500, 60.0),
    "list": (500, 60.0),
    "trigger": (10, 60.0),
    "replay": (10, 60.0),
}
_PERIODS = {"s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def _project_root() -> Path:
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    # A libpq connection string (URL or key=value) for psycopg.connect, password included.
    database_url: str
    kafka: KafkaConnection
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
    # How far ahead of its instant a fire is leased and dispatched (0: only once due), so that its
    # job already waits in a worker at that instant. Schedules with overlap allow only.
    lookahead_s: float = 1.0
    # How long a started job's run stays leased after its start event or a heartbeat (the worker
    # sends one every 5 s): silence past this is what lets the lease sweeper give up on it.
    lease_window_s: float = 30.0
    # How long finished runs, their attempts and the finished schedules they leave are kept (days);
    # 0 keeps everything.
    history_retention_days: float = 30.0
    http_allowlist: tuple[str, ...] = ()
    # Workers: the Python handlers they run besides the builtins (``package.module`` or
    # ``package.module:function``), and a stable identity for static group membership.
    handlers: tuple[str, ...] = ()
    group_instance_id: str | None = None
    metrics_port: int | None = None
    # All interfaces by default: a pod's probes and Prometheus reach it on the pod's address.
    metrics_host: str = "0.0.0.0"
    # The API (`scheduler run api`): HTTP/JSON and gRPC, on all interfaces by default.
    api_host: str = "0.0.0.0"
    api_port: int = 8080
    grpc_port: int = 50051
    jwt: JwtSettings = field(default_factory=JwtSettings)
    rate_limits: tuple[tuple[str, int, float], ...] = tuple(
        (name, count, period) for name, (count, period) in DEFAULT_RATE_LIMITS.items()
    )
    api_pool_size: int = 10
    # Bounds on an API call's database work, so that a held row lock or a stuck statement answers
    # UNAVAILABLE instead of holding the call (and its thread) as long as it lasts; 0: none.
    api_statement_timeout_s: float = 30.0
    api_lock_timeout_s: float = 5.0

    def __repr__(self) -> str:
        # database_url may hold a password; KafkaConnection's own repr leaves its secrets out.
        shown = {f.name: getattr(self, f.name) for f in fields(self)} | {
            "database_url": self.database_display
        }
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def database_display(self) -> str:
        """The database as logs and errors may show it: no password, no query parameters."""
        return redact_url(self.database_url)

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

    def worker_group(self, app: str) -> str:
        """The consumer group of an app's workers."""
        return f"{self.topic_prefix}.workers.{app}"


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


def _retention_days(env: Mapping[str, str]) -> float:
    name = "SCHEDULER_HISTORY_RETENTION_DAYS"
    days = _float(env, name, 30.0, 0.0, 36_500.0)
    # Shorter than a day, runs could go while their events and republished messages still come.
    if 0 < days < 1:
        raise ConfigError(f"{name}={days} must be 0 (keep everything) or at least 1 day")
    return days


def redact_url(conninfo: str) -> str:
    """``postgresql://user@host:port/dbname`` for a libpq URL or key=value string, without its
    password or any other parameter; something unparseable is shown as a placeholder."""
    try:
        params = conninfo_to_dict(conninfo)
    except ProgrammingError:
        return "postgresql://(unparseable connection string)"
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    netloc = ",".join(h + (f":{p}" if p else "") for h, p in zip(hosts, ports, strict=False))
    user = params.get("user")
    return f"postgresql://{f'{user}@' if user else ''}{netloc}/{params.get('dbname') or ''}"


def _text(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """A secret from ``name`` or from the file ``name_FILE`` names (its trailing newline dropped)."""
    value, path = env.get(name) or None, env.get(f"{name}_FILE") or None
    if value is not None and path is not None:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if path is None:
        return value
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"{name}_FILE={path!r} cannot be read: {reason}") from None
    return text.rstrip("\r\n") or None


def _file(
    env: Mapping[str, str], name: str, *, special: tuple[str, ...] = (), folder: bool = False
) -> str | None:
    """A path that must exist now: a missing certificate is clearer here than in a TLS handshake."""
    value = env.get(name) or None
    if value is None or value in special:
        return value
    path = Path(value)
    if not (path.is_file() or (folder and path.is_dir())):
        raise ConfigError(f"{name}={value!r} is not a readable file")
    return value


def _unescaped_userinfo(url: str) -> bool:
    """Whether a postgresql:// URL's user name or password holds an unescaped '@' or '/', read as
    libpq reads it (the user and password end at the first '@' before the first '/'): two '@'
    before the first '/', or none before it and one in the database name after it."""
    rest = url.partition("://")[2]
    authority, slash, path = rest.partition("/")
    ats = authority.count("@")
    return ats > 1 or (ats == 0 and bool(slash) and "@" in path.partition("?")[0])


_WHOLE_NUMBER_PARAMETERS = (
    "port", "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "tcp_user_timeout",
)  # fmt: skip


def _database_url(env: Mapping[str, str], pg_port: int) -> str:
    raw = env.get("SCHEDULER_DATABASE_URL") or f"postgresql://scheduler@127.0.0.1:{pg_port}/scheduler"
    is_url = raw.startswith(("postgresql://", "postgres://"))
    if not is_url and "=" not in raw:
        # Only the scheme is shown: the rest may hold a password.
        scheme, sep, _ = raw.partition("://")
        given = f", not a {scheme}:// URL" if sep and scheme.isalnum() else ""
        raise ConfigError(
            f"SCHEDULER_DATABASE_URL must be a postgresql:// URL (or a libpq key=value string){given}"
        )
    if is_url and _unescaped_userinfo(raw):
        # libpq would end the password at its first '/' or '@' and take the rest for the host or the
        # database, which then shows the rest of the password in every error and display of the URL.
        raise ConfigError(
            "SCHEDULER_DATABASE_URL has an '@' or '/' in its user name or password: percent-encode it"
            " (%40 for @, %2F for /) or give the password in SCHEDULER_DATABASE_PASSWORD"
        )
    try:
        params = conninfo_to_dict(raw)
    except ProgrammingError:
        # libpq's message quotes the string, password and all: name the variable instead.
        raise ConfigError(
            "SCHEDULER_DATABASE_URL is not a valid PostgreSQL connection string (URL or key=value)"
        ) from None
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise ConfigError(
            f"SCHEDULER_DATABASE_URL has sslmode={sslmode!r}; it must be one of {', '.join(SSL_MODES)}"
        )
    for name in _WHOLE_NUMBER_PARAMETERS:
        # libpq checks these only when it connects, and psycopg then raises an error of its own
        # (with the URL's parameters) instead of a connection failure: checked here, by name.
        value = params.get(name)
        if value is not None and not all(part.strip().isdigit() for part in str(value).split(",")):
            raise ConfigError(f"SCHEDULER_DATABASE_URL has {name}={value!r}; it must be a whole number")
    extra: dict[str, str] = {}
    mode = env.get(DATABASE_VARIABLES["sslmode"]) or None
    if mode is not None:
        if mode not in SSL_MODES:
            raise ConfigError(f"SCHEDULER_DATABASE_SSLMODE={mode!r} must be one of {', '.join(SSL_MODES)}")
        extra["sslmode"] = mode
    # "system": libpq 16's name for the operating system's trusted CAs.
    files = {
        "sslrootcert": _file(env, DATABASE_VARIABLES["sslrootcert"], special=("system",)),
        "sslcert": _file(env, DATABASE_VARIABLES["sslcert"]),
        "sslkey": _file(env, DATABASE_VARIABLES["sslkey"]),
        "password": _secret(env, DATABASE_VARIABLES["password"]),
    }
    extra |= {key: value for key, value in files.items() if value is not None}
    # Without extra parameters the URL stays exactly as given (callers hand it on to subprocesses).
    return make_conninfo(raw, **extra) if extra else raw


def _kafka_connection(env: Mapping[str, str], kafka_port: int) -> KafkaConnection:
    def upper(name: str) -> str | None:
        value = env.get(name) or None
        return None if value is None else value.strip().upper()

    try:
        return KafkaConnection(
            bootstrap=env.get("SCHEDULER_KAFKA_BOOTSTRAP") or f"127.0.0.1:{kafka_port}",
            security_protocol=cast(
                SecurityProtocol, upper(KAFKA_VARIABLES["security_protocol"]) or "PLAINTEXT"
            ),
            sasl_mechanism=cast(SaslMechanism | None, upper(KAFKA_VARIABLES["sasl_mechanism"])),
            sasl_username=_text(env, KAFKA_VARIABLES["sasl_username"]),
            sasl_password=_secret(env, KAFKA_VARIABLES["sasl_password"]),
            ssl_ca_location=_file(env, KAFKA_VARIABLES["ssl_ca_location"], special=("probe",), folder=True),
            ssl_certificate_location=_file(env, KAFKA_VARIABLES["ssl_certificate_location"]),
            ssl_key_location=_file(env, KAFKA_VARIABLES["ssl_key_location"]),
            ssl_key_password=_secret(env, KAFKA_VARIABLES["ssl_key_password"]),
            ssl_endpoint_identification=cast(
                EndpointIdentification,
                (env.get(KAFKA_VARIABLES["ssl_endpoint_identification"]) or "https").strip().lower(),
            ),
        )
    except InvalidKafkaConnection as exc:
        raise ConfigError(exc.naming(KAFKA_VARIABLES.__getitem__)) from None


_GROUP_INSTANCE_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def _group_instance_id(env: Mapping[str, str]) -> str | None:
    value = env.get("SCHEDULER_GROUP_INSTANCE_ID") or None
    if value is not None and not _GROUP_INSTANCE_RE.match(value):
        raise ConfigError(
            f"SCHEDULER_GROUP_INSTANCE_ID={value!r} may hold only letters, digits, '.', '_' and '-' "
            "(at most 249)"
        )
    return value


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _jwt_settings(env: Mapping[str, str]) -> JwtSettings:
    secret = _secret(env, "SCHEDULER_JWT_SECRET")
    jwks = env.get("SCHEDULER_JWT_JWKS") or None
    if secret is not None and jwks is not None:
        raise ConfigError("set SCHEDULER_JWT_SECRET (HS256) or SCHEDULER_JWT_JWKS (RS256/ES256), not both")
    if secret is not None and len(secret.encode()) < MIN_JWT_SECRET_BYTES:
        raise ConfigError(f"SCHEDULER_JWT_SECRET must be at least {MIN_JWT_SECRET_BYTES} bytes")
    if jwks is not None and not jwks.startswith(("https://", "http://")) and not Path(jwks).is_file():
        raise ConfigError(f"SCHEDULER_JWT_JWKS={jwks!r} is neither an http(s) URL nor a readable file")
    if jwks is not None and jwks.startswith("http://") and not _is_loopback(urlsplit(jwks).hostname):
        # Whoever answers a plain-HTTP fetch on the way supplies the keys, and so signs any token.
        raise ConfigError(
            f"SCHEDULER_JWT_JWKS: http://{urlsplit(jwks).hostname} is plain HTTP to another host, whose keys "
            "anyone on the way could replace; use https://, a file, or a loopback address (a local proxy)"
        )
    raw = env.get("SCHEDULER_JWT_ALGORITHMS") or ""
    algorithms = tuple(a.strip() for a in raw.split(",") if a.strip())
    if not algorithms:
        algorithms = ("HS256",) if secret is not None else ("RS256", "ES256") if jwks is not None else ()
    allowed: tuple[str, ...]
    if secret is not None:
        allowed, kind = HMAC_ALGORITHMS, "SCHEDULER_JWT_SECRET (HMAC)"
    elif jwks is not None:
        allowed, kind = KEY_PAIR_ALGORITHMS, "SCHEDULER_JWT_JWKS (key pairs)"
    else:
        # Without a key only the API cares (it refuses to start): the other components, which read
        # the same settings, take any algorithm a key could be given for.
        allowed, kind = HMAC_ALGORITHMS + KEY_PAIR_ALGORITHMS, "any key"
    for algorithm in algorithms:
        if algorithm not in allowed:
            raise ConfigError(
                f"SCHEDULER_JWT_ALGORITHMS: {algorithm!r} cannot be used with {kind}; "
                f"choose from {', '.join(allowed)}"
            )
    return JwtSettings(
        secret=secret,
        jwks=jwks,
        algorithms=algorithms,
        issuer=env.get("SCHEDULER_JWT_ISSUER") or None,
        audience=env.get("SCHEDULER_JWT_AUDIENCE") or None,
        roles_claim=env.get("SCHEDULER_JWT_ROLES_CLAIM") or "roles",
        apps_claim=env.get("SCHEDULER_JWT_APPS_CLAIM") or "apps",
        leeway_s=_float(env, "SCHEDULER_JWT_LEEWAY_S", 30.0, 0.0, 300.0),
    )


def _rate_limits(env: Mapping[str, str]) -> tuple[tuple[str, int, float], ...]:
    """``create=100/min,trigger=10/min``: the classes named replace their defaults."""
    limits = dict(DEFAULT_RATE_LIMITS)
    raw = env.get("SCHEDULER_API_RATE_LIMITS") or ""
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        name, _, rule = item.partition("=")
        count, _, unit = rule.partition("/")
        name, unit = name.strip(), unit.strip() or "min"
        if name not in limits or not count.strip().isdigit() or unit not in _PERIODS or int(count) < 1:
            raise ConfigError(
                f"SCHEDULER_API_RATE_LIMITS: {item!r} must be CLASS=N/s|min|h with N >= 1, CLASS one of "
                f"{', '.join(DEFAULT_RATE_LIMITS)}"
            )
        limits[name] = (int(count), _PERIODS[unit])
    return tuple((name, count, period) for name, (count, period) in limits.items())


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

    database_url = _database_url(env, pg_port)
    kafka = _kafka_connection(env, kafka_port)

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
        kafka=kafka,
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
        lookahead_s=_float(env, "SCHEDULER_LOOKAHEAD_S", 1.0, 0.0, 60.0),
        # At least two heartbeat intervals, so that one late heartbeat never expires a live job.
        lease_window_s=_float(env, "SCHEDULER_LEASE_WINDOW_S", 30.0, 10.0, 86_400.0),
        history_retention_days=_retention_days(env),
        http_allowlist=allowlist,
        handlers=tuple(item.strip() for item in env.get("SCHEDULER_HANDLERS", "").split(",") if item.strip()),
        group_instance_id=_group_instance_id(env),
        metrics_port=metrics_port,
        metrics_host=env.get("SCHEDULER_METRICS_HOST") or "0.0.0.0",
        api_host=env.get("SCHEDULER_API_HOST") or "0.0.0.0",
        api_port=_int(env, "SCHEDULER_API_PORT", 8080, 0, 65535),
        grpc_port=_int(env, "SCHEDULER_GRPC_PORT", 50051, 0, 65535),
        jwt=_jwt_settings(env),
        rate_limits=_rate_limits(env),
        api_pool_size=_int(env, "SCHEDULER_API_POOL_SIZE", 10, 1, 200),
        api_statement_timeout_s=_float(env, "SCHEDULER_API_STATEMENT_TIMEOUT_S", 30.0, 0.0, 3600.0),
        api_lock_timeout_s=_float(env, "SCHEDULER_API_LOCK_TIMEOUT_S", 5.0, 0.0, 3600.0),
    )
