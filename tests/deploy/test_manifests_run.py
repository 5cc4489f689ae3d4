"""The manifests run: the dev overlay's Deployments and Jobs, started from the built image with podman
against the local stack, exactly as rendered, and probed as the kubelet would probe them.

Each workload becomes one "pod": its init containers run one after another to completion, then its
container starts with the rendered args, environment (ConfigMap values, the test's Secret values,
the downward API's pod name) and security context (uid, read-only root, /tmp as its volume, no
capabilities, no new privileges). Every pod starts at once, so the components' init containers
really wait for the migration Job; the Jobs must complete; every Deployment must pass its startup,
readiness and liveness probes on the path and port the manifest names; the API must answer
``GET /v1/health`` and an authenticated ``GET /v1/schedules`` on its ``http`` port and gRPC health
on its ``grpc`` port; then one schedule, created by a Kafka command through the running ingestor,
must run and succeed; and every container must stop on SIGTERM with exit status 0 within its
termination grace period less its preStop wait (which the kubelet spends first).

Two things differ from a cluster, both through kustomize in an overlay of the test's own over
``k8s/overlays/dev``: the Kafka address is the local stack's and the topic prefix is the test's.
With host networking every container would bind the same ports, so each is given its own through
the setting its container port follows (``SCHEDULER_METRICS_PORT``, and the API's
``SCHEDULER_API_PORT`` and ``SCHEDULER_GRPC_PORT``) after checking that the manifest's probes, its
container ports and the ConfigMap's ports are one and the same numbers.

Needs the image (``make image``) and podman: ``make test-deploy`` builds the one and runs this.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.chaos_stack import free_port
from scheduler.kafka.transport import TopicAdmin
from tests.api.client import ADMIN, token
from tests.conftest import StackInfo
from tests.deploy.manifests import (
    K8S,
    Object,
    SecretRef,
    container_env,
    main_container,
    named_port,
    of_kind,
    pod_spec,
    probes,
    render,
    settings_map,
)
from tests.support import wait_for

pytestmark = pytest.mark.deploy

PODMAN = shlex.split(os.environ.get("PODMAN", "podman --runtime runc"))
# What podman needs on this project's machines (the Makefile's PODMAN_BUILD_FLAGS, for `run`).
PODMAN_RUN_FLAGS = ["--network", "host", "--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
NAMESPACE = "scheduler-dev"
# Every container of one test run carries it, so that all are found and removed, whatever failed.
RUN_LABEL = "kafka-pg-scheduler.test-run"
CONTAINER_LOG_LINES = 40
# The setting each named container port follows: the process listens where the setting says.
PORT_SETTINGS = {
    "metrics": "SCHEDULER_METRICS_PORT",
    "http": "SCHEDULER_API_PORT",
    "grpc": "SCHEDULER_GRPC_PORT",
}


def pod_address() -> str:
    """An address of this machine other than loopback, which the probes use as a kubelet would use
    the pod's: a process listening on 127.0.0.1 only must fail them. Loopback when there is none."""
    try:
        listed = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
        )
    except OSError:  # no iproute2
        return "127.0.0.1"
    for line in listed.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return "127.0.0.1"


def podman(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout_s)


@dataclass
class Pod:
    """One workload of the render, run the way the kubelet would run one of its pods."""

    workload: Object
    objects: list[Object]
    secrets: dict[SecretRef, str]
    run_id: str
    stop: threading.Event
    host_ports: dict[str, int] = field(default_factory=dict)
    """The port this machine gives each of the container's named ports (host networking)."""
    started: list[str] = field(default_factory=list)
    failure: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def kind(self) -> str:
        return str(self.workload["kind"])

    @property
    def name(self) -> str:
        return str(self.workload["metadata"]["name"])

    @property
    def pod_name(self) -> str:
        return f"{self.name}-{self.run_id}"

    def podman_args(self, container: Object, name: str) -> list[str]:
        spec = pod_spec(self.workload)
        env = container_env(
            self.objects, container, secrets=self.secrets, pod_name=self.pod_name, namespace=NAMESPACE
        )
        for port_name, port in self.host_ports.items():
            if PORT_SETTINGS[port_name] in env:
                env[PORT_SETTINGS[port_name]] = str(port)
        if "SCHEDULER_DATABASE_URL" not in env:
            # A container the manifests give no database (a worker) falls back to PostgreSQL on its
            # pod's loopback, where nothing listens in a cluster; here pods share the host's network,
            # where the local stack's PostgreSQL has that default port, and a worker that found it
            # took its database (initialised by `scheduler init`, without the test's app) for the
            # app's and exited "unknown app". Port 1 answers as a cluster pod's loopback does.
            env["SCHEDULER_PG_PORT"] = "1"
        pod_security, security = spec.get("securityContext", {}), container.get("securityContext", {})
        user = security.get("runAsUser", pod_security.get("runAsUser"))
        group = security.get("runAsGroup", pod_security.get("runAsGroup"))
        args = [*PODMAN_RUN_FLAGS, "--name", name, "--label", f"{RUN_LABEL}={self.run_id}"]
        args += ["--user", f"{user}:{group}"]
        if security.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if security.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        for cap in security.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", cap.lower()]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            assert "emptyDir" in volume, f"{self.name}: only emptyDir volumes are emulated"
            args += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777,size=64m"]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        return [*args, container["image"], *container.get("args", [])]

    def run_to_completion(self, container: Object, deadline: float) -> None:
        """An init container, or a Job's: run again after a failure (restartPolicy OnFailure, the
        kubelet's restarts of init containers) until it exits 0."""
        attempt = 0
        while True:
            attempt += 1
            name = f"{self.pod_name}-{container['name']}-{attempt}"
            if self.stop.is_set():
                raise AssertionError(f"{name}: the test stopped")
            self.started.append(name)
            done = podman(
                "run",
                "--rm",
                *self.podman_args(container, name),
                timeout_s=max(1.0, deadline - time.monotonic()),
            )
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} never exited 0; last: {done.returncode} {done.stderr[-2000:]}")
            time.sleep(min(2.0 * attempt, 10.0))

    def run(self, deadline: float) -> None:
        try:
            for container in pod_spec(self.workload).get("initContainers", []):
                self.run_to_completion(container, deadline)
            container = main_container(self.workload)
            if self.kind == "Job":
                self.run_to_completion(container, deadline)
            else:
                name = f"{self.pod_name}-{container['name']}"
                if self.stop.is_set():
                    raise AssertionError(f"{name}: the test stopped")
                self.started.append(name)
                done = podman("run", "--detach", *self.podman_args(container, name))
                assert done.returncode == 0, f"{name}: podman run failed: {done.stderr}"
        except BaseException as exc:  # reported by the test's thread, with the container logs
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def logs(self) -> str:
        text = []
        for name in self.started:
            out = podman("logs", "--tail", str(CONTAINER_LOG_LINES), name)
            text.append(f"--- {name}\n{out.stdout}{out.stderr}")
        return "\n".join(text)


def probe_ok(address: str, port: int, path: str, timeout_s: float) -> bool:
    """The kubelet's httpGet: any status from 200 to 399 is a success."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}{path}", timeout=timeout_s) as response:
            status: int = response.status
            return 200 <= status < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400
    except OSError:
        return False


def host_port(pod: Pod, container: Object, port: int | str) -> int:
    """Where this machine serves the container's port ``port`` (a name or a number)."""
    declared = named_port(container, port)
    (name,) = [p["name"] for p in container["ports"] if p["containerPort"] == declared]
    return pod.host_ports[name]


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, object]:
    """The status and JSON body of a GET, whatever the status."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def grpc_serving(address: str, port: int) -> bool:
    """gRPC health of the whole server (the empty service name) answers SERVING."""
    with grpc.insecure_channel(f"{address}:{port}") as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def image_problem(image: str) -> str | None:
    """Why the image cannot stand for this checkout: missing, or built from another commit."""
    if podman("image", "exists", image).returncode != 0:
        return f"image {image} is missing: build it with `make image` (make test-deploy does)"
    label = '{{ index .Labels "org.opencontainers.image.revision" }}'
    built = podman("image", "inspect", "--format", label, image).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=K8S
    ).stdout.strip()
    if head and built.removesuffix("-dirty") != head:
        return (
            f"image {image} was built from {built or 'another revision'}, this checkout is {head}: make image"
        )
    return None


def test_the_dev_overlay_runs_from_the_image(
    stack: StackInfo, empty_database_url: str, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S / "overlays" / "dev", overlay)],
                "configMapGenerator": [
                    {
                        "name": "scheduler-settings",
                        "behavior": "merge",
                        "literals": [
                            f"SCHEDULER_KAFKA_BOOTSTRAP={stack.kafka_bootstrap}",
                            f"SCHEDULER_TOPIC_PREFIX={prefix}",
                        ],
                    }
                ],
            }
        )
    )
    objects = render(overlay)
    workloads = of_kind(objects, "Job", "Deployment")
    images = {main_container(w)["image"] for w in workloads}
    assert len(images) == 1
    (image,) = images
    problem = image_problem(image)
    assert problem is None, problem
    # The test's Secrets: CloudNativePG's scheduler-db-app, key uri, as the dev overlay reads it,
    # and the API's HS256 key, which the operator creates (docs/deploy.md, "The API").
    jwt_secret = uuid.uuid4().hex + uuid.uuid4().hex
    secrets = {
        SecretRef("scheduler-db-app", "uri"): empty_database_url,
        SecretRef("scheduler-api-jwt", "secret"): jwt_secret,
    }
    settings = settings_map(objects)
    run_id = uuid.uuid4().hex[:6]
    stop = threading.Event()
    address = pod_address()
    pods: list[Pod] = []
    for workload in workloads:
        pod = Pod(workload, objects, secrets, run_id, stop)
        if workload["kind"] == "Deployment":
            container = main_container(workload)
            for kind, probe in probes(container).items():
                declared = named_port(container, probe["httpGet"]["port"])
                assert str(declared) == settings["SCHEDULER_METRICS_PORT"], (
                    f"{pod.name}: {kind} port {declared} is not the SCHEDULER_METRICS_PORT "
                    "the process listens on"
                )
            for port in container.get("ports", []):
                setting = PORT_SETTINGS[port["name"]]
                assert str(port["containerPort"]) == settings[setting], (
                    f"{pod.name}: container port {port['name']} {port['containerPort']} is not the "
                    f"{setting} the process listens on"
                )
                pod.host_ports[port["name"]] = free_port()
        pods.append(pod)

    began = time.monotonic()
    deadline = began + 300
    threads = [threading.Thread(target=p.run, args=(deadline,), daemon=True) for p in pods]
    try:
        for thread in threads:
            thread.start()

        def report() -> str:
            return "\n".join(f"{p.name}: {p.failure or 'ok'}\n{p.logs()}" for p in pods)

        def within(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
            """wait_for, with every container's last log lines when it times out."""
            try:
                wait_for(condition, timeout_s, what, interval_s=0.5)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{report()}") from None

        jobs = [p for p in pods if p.kind == "Job"]
        for pod in jobs:
            assert pod.done.wait(max(1.0, deadline - time.monotonic())), (
                f"Job {pod.name} did not complete\n{report()}"
            )
            assert pod.failure is None, f"Job {pod.name} failed: {pod.failure}\n{report()}"
        jobs_done = time.monotonic() - began

        for pod in (p for p in pods if p.kind == "Deployment"):
            assert pod.done.wait(max(1.0, deadline - time.monotonic())), (
                f"{pod.name} never started\n{report()}"
            )
            assert pod.failure is None, f"{pod.name}: {pod.failure}\n{report()}"
            container = main_container(pod.workload)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = probes(container)[kind]
                path: str = probe["httpGet"]["path"]
                port = host_port(pod, container, probe["httpGet"]["port"])
                budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
                timeout: float = probe.get("timeoutSeconds", 1)
                within(
                    functools.partial(probe_ok, address, port, path, timeout),
                    min(budget, max(1.0, deadline - time.monotonic())),
                    f"{pod.name}: {kind} GET {path} on its metrics port",
                )
        ready = time.monotonic() - began

        # The API, on its own ports, as the Service would reach them: health without a token, a
        # listing with one signed by the Secret's key, and gRPC health.
        (api,) = [p for p in pods if p.name == "scheduler-api"]
        http = f"http://{address}:{api.host_ports['http']}"
        status, body = http_get(f"{http}/v1/health")
        assert status == 200, f"GET /v1/health: {status} {body}\n{api.logs()}"
        bearer = token(subject="k8s-test", roles=(ADMIN,), secret=jwt_secret)
        status, body = http_get(f"{http}/v1/schedules", {"Authorization": f"Bearer {bearer}"})
        assert status == 200, f"GET /v1/schedules: {status} {body}\n{api.logs()}"
        assert isinstance(body, dict) and body.get("schedules", []) == [], body
        status, body = http_get(f"{http}/v1/schedules", {"Authorization": "Bearer not-a-token"})
        assert status == 401, f"GET /v1/schedules with a bad token: {status} {body}"
        within(
            functools.partial(grpc_serving, address, api.host_ports["grpc"]),
            30,
            "the API's gRPC health answers SERVING on its grpc port",
        )

        # One schedule, by a Kafka command through the running ingestor, to a finished run.
        env = {
            **os.environ,
            "SCHEDULER_DATABASE_URL": empty_database_url,
            "SCHEDULER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "SCHEDULER_TOPIC_PREFIX": prefix,
        }
        run_at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
        command = {
            "schedule_key": "first-job",
            "app": "default",
            "operation": "create",
            "spec": {
                "kind": "delayed",
                "run_at": run_at,
                "handler": "builtin:noop",
                "payload": {"from": "k8s"},
            },
        }
        produced = subprocess.run(
            [str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "scheduler"), "produce", "--json"],
            input=json.dumps(command) + "\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert produced.returncode == 0, produced.stderr

        def succeeded() -> bool:
            with psycopg.connect(empty_database_url) as conn:
                row = conn.execute(
                    "select r.state from runs r join schedules s on s.id = r.schedule_id "
                    "join schedule_keys k on k.schedule_id = s.id where k.schedule_key = 'first-job'"
                ).fetchone()
            return row is not None and row[0] == "succeeded"

        within(succeeded, 120, "the schedule's run succeeded")
        first_job = time.monotonic() - began

        # SIGTERM, as on a rollout: every component stops within its grace period, cleanly. The
        # kubelet spends a preStop sleep first, out of the same grace period: podman runs no hooks,
        # so what the process has is the rest.
        for pod in (p for p in pods if p.kind == "Deployment"):
            grace = int(pod_spec(pod.workload).get("terminationGracePeriodSeconds", 30))
            pre_stop = main_container(pod.workload).get("lifecycle", {}).get("preStop", {})
            remaining = grace - int(pre_stop.get("sleep", {}).get("seconds", 0))
            name = pod.started[-1]
            stopping = time.monotonic()
            stopped = podman("stop", "--time", str(remaining), name, timeout_s=remaining + 30)
            took = time.monotonic() - stopping
            exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
            assert stopped.returncode == 0 and exit_code == "0", (
                f"{name}: exit {exit_code} after SIGTERM\n{pod.logs()}"
            )
            assert took < remaining, (
                f"{name} took {took:.1f} s to stop ({remaining} s of its {grace} s grace left)"
            )
        print(
            f"\nmanifest run: {len(jobs)} Jobs complete in {jobs_done:.1f} s, "
            f"{len(pods) - len(jobs)} Deployments ready in {ready:.1f} s, "
            f"first job succeeded at {first_job:.1f} s"
        )
    finally:
        # No pod starts another container from now on; then every one of this run goes.
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        left = podman("ps", "--all", "--quiet", "--filter", f"label={RUN_LABEL}={run_id}").stdout.split()
        if left:
            podman("rm", "--force", "--time", "5", *left, timeout_s=120)
        admin = TopicAdmin(stack.kafka_bootstrap)
        admin.delete_topics([t for t in admin.topics() if t.startswith(f"{prefix}.")])
