"""The API tests' harness: a real ``scheduler run api`` process on this module's own database and
topic prefix, with the apps ``alpha`` and ``beta``, and callers for both transports.

The rate limits are raised far beyond what a test sends, except where a test starts processes of
its own with the limits it checks (:meth:`ApiStack.start`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from bench.chaos_stack import free_port
from scheduler.config import DEFAULT_RATE_LIMITS, Settings, load_settings
from scheduler.kafka.transport import TopicAdmin
from scheduler.schedule import service
from scheduler.store import connect
from tests.api.client import SECRET, GrpcCaller, HttpCaller
from tests.conftest import StackInfo, fresh_database, stack_env
from tests.support import Component, stop_all, wait_for

APPS = ("alpha", "beta")
UNLIMITED = ",".join(f"{name}=1000000/min" for name in DEFAULT_RATE_LIMITS)


@dataclass
class ApiProcess:
    component: Component
    http_url: str
    grpc_target: str
    metrics_port: int

    def stop(self) -> int:
        return self.component.stop()


@dataclass
class ApiStack:
    settings: Settings
    env: dict[str, str]
    log_dir: Path
    database_url: str
    processes: list[ApiProcess] = field(default_factory=list)

    def start(self, extra_env: dict[str, str] | None = None, *, wait: bool = True) -> ApiProcess:
        """Another API process on this stack, with ``extra_env`` over the module's environment."""
        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        env = self.env | (extra_env or {})
        component = Component(
            "api", env, self.log_dir,
            "--port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        )  # fmt: skip
        process = ApiProcess(
            component, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", metrics_port
        )
        self.processes.append(process)
        if wait:
            wait_for(lambda: _serving(process), 60, f"the API on port {http_port} to serve")
        return process

    @contextmanager
    def callers(self, process: ApiProcess) -> Iterator[tuple[HttpCaller, GrpcCaller]]:
        http, grpc_ = HttpCaller(process.http_url), GrpcCaller(process.grpc_target)
        try:
            yield http, grpc_
        finally:
            http.close()
            grpc_.close()

    def connect(self) -> psycopg.Connection[dict[str, object]]:
        return connect(self.database_url, autocommit=True)


def _serving(process: ApiProcess) -> bool:
    if process.component.proc.poll() is not None:
        raise AssertionError(
            f"the API exited {process.component.proc.returncode}:\n{process.component.output()[-3000:]}"
        )
    try:
        return httpx.get(f"{process.http_url}/v1/health", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def api_stack(stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiStack]:
    """A database and topic prefix for this module, its two apps, and the environment of its API."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    admin_client = TopicAdmin(stack.kafka_bootstrap)
    with fresh_database(stack) as database_url:
        env = stack_env(stack, database_url, prefix) | {
            "SCHEDULER_JWT_SECRET": SECRET,
            "SCHEDULER_API_RATE_LIMITS": UNLIMITED,
        }
        settings = load_settings(env)
        with connect(database_url) as conn:
            for app in APPS:
                service.create_app(conn, admin_client, settings, app, 1, "tests")
        api = ApiStack(settings, env, tmp_path_factory.mktemp("api"), database_url)
        try:
            yield api
        finally:
            try:
                stop_all([process.component for process in api.processes])
            finally:
                admin_client.delete_topics([t for t in admin_client.topics() if t.startswith(f"{prefix}.")])


@pytest.fixture(scope="module")
def api(api_stack: ApiStack) -> ApiProcess:
    """The module's API process (HTTP/JSON and gRPC), with the limits raised."""
    return api_stack.start()


@pytest.fixture(scope="module")
def http(api_stack: ApiStack, api: ApiProcess) -> Iterator[HttpCaller]:
    caller = HttpCaller(api.http_url)
    yield caller
    caller.close()


@pytest.fixture(scope="module")
def grpc_caller(api_stack: ApiStack, api: ApiProcess) -> Iterator[GrpcCaller]:
    caller = GrpcCaller(api.grpc_target)
    yield caller
    caller.close()


@pytest.fixture(params=["http", "grpc"])
def caller(
    request: pytest.FixtureRequest, http: HttpCaller, grpc_caller: GrpcCaller
) -> HttpCaller | GrpcCaller:
    """Each test that takes it runs once per transport."""
    return http if request.param == "http" else grpc_caller
