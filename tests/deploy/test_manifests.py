"""The k8s/ manifests, rendered by kustomize and checked offline: strict Kubernetes 1.30 and CRD
schemas, and the rules that tie them to the code (tests/deploy/check.py). Each check is also shown
to fail on a deliberately broken copy, so that none passes by accident."""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.deploy.check import problems_of
from tests.deploy.manifests import K8S, OVERLAYS, ROOT, Object, kubectl, main_container, named, render
from tests.deploy.prometheusrule import ALERTS, PROMETHEUS_RULE
from tests.deploy.prometheusrule import render as render_rules


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Object]]:
    return {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_passes_every_check(
    rendered: dict[str, list[Object]], overlay: str
) -> None:
    assert problems_of(rendered[overlay]) == []


@pytest.mark.parametrize("path", ["base", "workers/default"])
def test_the_base_and_the_worker_app_render_on_their_own(path: str) -> None:
    kinds = {o["kind"] for o in render(K8S / path)}
    assert "Deployment" in kinds


def test_no_overlay_carries_a_secret(rendered: dict[str, list[Object]]) -> None:
    for objects in rendered.values():
        assert not [o for o in objects if o["kind"] == "Secret"]
        for config in (o for o in objects if o["kind"] == "ConfigMap"):
            assert not [k for k in config.get("data", {}) if "PASSWORD" in k or k.endswith("DATABASE_URL")]


def test_the_acceptance_command_passes_and_fails_on_a_broken_manifest(tmp_path: Path) -> None:
    """`kubectl kustomize k8s/overlays/production | kubernetes-validate --strict -k 1.30.0 -`."""
    validate = shutil.which("kubernetes-validate", path=str(Path(ROOT / ".venv" / "bin")))
    assert validate is not None
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / "production")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    good = subprocess.run(
        [validate, "--strict", "-k", "1.30.0", "-"], input=rendered, capture_output=True, text=True
    )
    assert good.returncode == 0, good.stdout + good.stderr
    broken = rendered.replace("  replicas: 3\n", "  replicas: 3\n  replcas: 3\n", 1)
    assert broken != rendered
    bad = subprocess.run(
        [validate, "--strict", "-k", "1.30.0", "-"], input=broken, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "replcas" in bad.stdout + bad.stderr


def _deployment(objects: list[Object], name: str = "scheduler-scanner") -> Object:
    return named(objects, "Deployment", name)


def _scaled(objects: list[Object]) -> Object:
    return next(o for o in objects if o["kind"] == "ScaledObject")


def _topic(objects: list[Object], name: str) -> Object:
    return next(o for o in objects if o["kind"] == "KafkaTopic" and o["spec"]["topicName"] == name)


def _set(
    path: str, value: object, target: Callable[[list[Object]], Object] = _deployment
) -> Callable[[list[Object]], None]:
    def mutate(objects: list[Object]) -> None:
        node: object = target(objects)
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
        if value is None:
            del node[last]  # type: ignore[attr-defined]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value  # type: ignore[index]

    return mutate


def _add_worker_database(objects: list[Object]) -> None:
    worker = _deployment(objects, "scheduler-worker-default")
    main_container(worker)["env"].append(
        {
            "name": "SCHEDULER_DATABASE_URL",
            "valueFrom": {"secretKeyRef": {"name": "scheduler-db-app", "key": "uri"}},
        }
    )


def _open_ingress(objects: list[Object]) -> None:
    named(objects, "NetworkPolicy", "scheduler-metrics")["spec"]["ingress"][0]["from"] = [
        {"ipBlock": {"cidr": "0.0.0.0/0"}}
    ]


def _literal_password(objects: list[Object]) -> None:
    main_container(_deployment(objects))["env"].append(
        {"name": "SCHEDULER_KAFKA_SASL_PASSWORD", "value": "hunter2"}
    )


def _drop_pdb(objects: list[Object]) -> None:
    objects.remove(named(objects, "PodDisruptionBudget", "scheduler-relay"))


def _settings(key: str, value: str) -> Callable[[list[Object]], None]:
    def mutate(objects: list[Object]) -> None:
        next(o for o in objects if o["metadata"]["name"].startswith("scheduler-settings"))["data"][key] = (
            value
        )

    return mutate


def _drop(kind: str, name: str) -> Callable[[list[Object]], None]:
    def mutate(objects: list[Object]) -> None:
        objects.remove(named(objects, kind, name))

    return mutate


def _allow_all_egress(objects: list[Object]) -> None:
    named(objects, "NetworkPolicy", "scheduler-worker-targets-default")["spec"]["egress"] = [{}]


def _other_secret_in_init(objects: list[Object]) -> None:
    init = _deployment(objects)["spec"]["template"]["spec"]["initContainers"][0]
    (url,) = [e for e in init["env"] if e["name"] == "SCHEDULER_DATABASE_URL"]
    url["valueFrom"]["secretKeyRef"]["key"] = "password"


def _other_selector(objects: list[Object]) -> None:
    _deployment(objects)["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "relay"


def _podmonitor(objects: list[Object]) -> Object:
    return named(objects, "PodMonitor", "scheduler")


def _api(objects: list[Object]) -> Object:
    return named(objects, "Deployment", "scheduler-api")


def _api_service(objects: list[Object]) -> Object:
    return named(objects, "Service", "scheduler-api")


def _api_autoscaler(objects: list[Object]) -> Object:
    return named(objects, "HorizontalPodAutoscaler", "scheduler-api")


def _api_ingress(objects: list[Object]) -> Object:
    return named(objects, "NetworkPolicy", "scheduler-api")


def _api_port(name: str) -> Callable[[list[Object]], Object]:
    return lambda objects: next(p for p in main_container(_api(objects))["ports"] if p["name"] == name)


def _api_service_port(name: str) -> Callable[[list[Object]], Object]:
    return lambda objects: next(p for p in _api_service(objects)["spec"]["ports"] if p["name"] == name)


def _kafka_for_the_api(objects: list[Object]) -> None:
    del named(objects, "NetworkPolicy", "scheduler-kafka")["spec"]["podSelector"]["matchExpressions"]


def _api_ingress_to_metrics_from_anywhere(objects: list[Object]) -> None:
    _api_ingress(objects)["spec"]["ingress"][0]["ports"].append({"port": "metrics", "protocol": "TCP"})


def _api_ingress_on_every_port(objects: list[Object]) -> None:
    del _api_ingress(objects)["spec"]["ingress"][0]["ports"]


def _service_to_the_scanner(objects: list[Object]) -> None:
    _api_service(objects)["spec"]["selector"]["app.kubernetes.io/component"] = "scanner"


def _literal_jwt_secret(objects: list[Object]) -> None:
    (secret,) = [e for e in main_container(_api(objects))["env"] if e["name"] == "SCHEDULER_JWT_SECRET"]
    secret.pop("valueFrom")
    secret["value"] = "a-literal-secret-of-more-than-thirty-two-bytes"


def _unlabel_api_database(objects: list[Object]) -> None:
    del _api(objects)["spec"]["template"]["metadata"]["labels"]["kafka-pg-scheduler/database"]


def _no_jwt_key(objects: list[Object]) -> None:
    container = main_container(_api(objects))
    container["env"] = [e for e in container["env"] if e["name"] != "SCHEDULER_JWT_SECRET"]


def _misspelt_variable(objects: list[Object]) -> None:
    main_container(_api(objects)).setdefault("env", []).append(
        {"name": "SCHEDULER_HTTP_ALLOWLST", "value": "*"}
    )


def _private_ca_mounted_in_the_main_containers_only(objects: list[Object]) -> None:
    """docs/deploy.md's private CA with its init-container patch missing one workload's."""
    next(o for o in objects if o["metadata"]["name"].startswith("scheduler-settings"))["data"][
        "SCHEDULER_DATABASE_SSLROOTCERT"
    ] = "/etc/scheduler/ca/ca.crt"
    for workload in [o for o in objects if o["kind"] in ("Deployment", "Job")]:
        pod = workload["spec"]["template"]["spec"]
        pod.setdefault("volumes", []).append({"name": "ca", "configMap": {"name": "scheduler-ca"}})
        mount = {"name": "ca", "mountPath": "/etc/scheduler/ca", "readOnly": True}
        pod["containers"][0].setdefault("volumeMounts", []).append(mount)
        if workload["metadata"]["name"] != "scheduler-api":
            for init in pod.get("initContainers", []):
                init.setdefault("volumeMounts", []).append(mount)


SPEC = "spec.template.spec"
CONTAINER = f"{SPEC}.containers.0"
BROKEN: dict[str, tuple[Callable[[list[Object]], None], str]] = {
    "misspelled core field": (_set("spec.replcas", 1), "replcas"),
    "probe on a path the code does not serve": (
        _set(f"{CONTAINER}.readinessProbe.httpGet.path", "/healthz"),
        "/ready",
    ),
    "liveness probe that gives up before the process answers": (
        _set(f"{CONTAINER}.livenessProbe.timeoutSeconds", 3),
        "livenessProbe gives up after 3 s",
    ),
    "probe on a port the container does not declare": (
        _set(f"{CONTAINER}.livenessProbe.httpGet.port", "http"),
        "http",
    ),
    "container port not the process's": (
        _set(f"{CONTAINER}.ports.0.containerPort", 8080),
        "SCHEDULER_METRICS_PORT",
    ),
    "args of another component": (_set(f"{CONTAINER}.args", ["run", "relay"]), "scheduler run scanner"),
    "writable root filesystem": (
        _set(f"{CONTAINER}.securityContext.readOnlyRootFilesystem", False),
        "read-only",
    ),
    "root user": (_set(f"{SPEC}.securityContext.runAsUser", 0), "65532"),
    "grace shorter than the drain": (
        _set(f"{SPEC}.terminationGracePeriodSeconds", 20),
        "terminationGracePeriodSeconds",
    ),
    "no memory limit": (_set(f"{CONTAINER}.resources.limits", None), "memory"),
    "no wait for the schema": (_set(f"{SPEC}.initContainers", None), "migrations wait"),
    "literal secret": (_literal_password, "literal"),
    "worker given the database": (_add_worker_database, "workers reach Kafka only"),
    "ingress from anywhere": (_open_ingress, "ingress other than metrics"),
    "no disruption budget": (_drop_pdb, "PodDisruptionBudget"),
    "a disruption budget that blocks every drain": (
        _set("spec.maxUnavailable", 0, lambda o: named(o, "PodDisruptionBudget", "scheduler-relay")),
        "maxUnavailable 0 blocks every drain",
    ),
    "a variable misspelt on a container": (_misspelt_variable, "SCHEDULER_HTTP_ALLOWLST is no variable"),
    "a CA file one init container does not mount": (
        _private_ca_mounted_in_the_main_containers_only,
        "Deployment scheduler-api container wait-for-schema: "
        "SCHEDULER_DATABASE_SSLROOTCERT=/etc/scheduler/ca/ca.crt is in no volume it mounts",
    ),
    "more worker pods than partitions": (
        _set("spec.maxReplicaCount", 7, _scaled),
        "above the topic's 6 partitions",
    ),
    "lag of another consumer group": (
        _set("spec.triggers.0.metadata.consumerGroup", "sched.default", _scaled),
        "consumerGroup",
    ),
    "misspelled ScaledObject field": (_set("spec.maxReplicaCounts", 2, _scaled), "maxReplicaCounts"),
    "topic with other partitions": (
        _set("spec.partitions", 3, lambda o: _topic(o, "sched.results")),
        "partitions",
    ),
    "misspelled KafkaTopic field": (_set("spec.replcas", 1, lambda o: _topic(o, "sched.dlq")), "replcas"),
    "metrics only on loopback": (_settings("SCHEDULER_METRICS_HOST", "127.0.0.1"), "SCHEDULER_METRICS_HOST"),
    "a variable the code does not read": (_settings("SCHEDULER_DATABASE_SSLMOD", "require"), "SSLMOD"),
    "selector not matching the template": (_other_selector, "selector"),
    "no DNS": (_drop("NetworkPolicy", "scheduler-dns"), "DNS"),
    "no way to Kafka": (_drop("NetworkPolicy", "scheduler-kafka"), "Kafka (port 9092)"),
    "no way to PostgreSQL": (_drop("NetworkPolicy", "scheduler-postgres"), "PostgreSQL (port 5432)"),
    "a worker allowed all egress": (_allow_all_egress, "allows all egress"),
    "init container reading another key": (_other_secret_in_init, "different Secrets or keys"),
    "alert labels not relabelled": (
        _set("spec.podMetricsEndpoints.0.relabelings", [], _podmonitor),
        "component",
    ),
    "scaling a StatefulSet": (_set("spec.scaleTargetRef.kind", "StatefulSet", _scaled), "worker Deployment"),
    "a lag threshold that is no number": (
        _set("spec.triggers.0.metadata.lagThreshold", "lots", _scaled),
        "lots",
    ),
    "Pod Security not enforced": (
        _set("metadata.labels", {}, lambda o: named(o, "Namespace", "scheduler-dev")),
        "Pod Security",
    ),
    "budget blocking drains in an outage": (
        _set(
            "spec.unhealthyPodEvictionPolicy",
            None,
            lambda o: named(o, "PodDisruptionBudget", "scheduler-relay"),
        ),
        "AlwaysAllow",
    ),
    "Kafka without KRaft": (
        _set("metadata.annotations", {}, lambda o: named(o, "Kafka", "scheduler-kafka")),
        "KRaft",
    ),
    # The API: its ports, its stop, its autoscaler, its Service and its network.
    "no API": (_drop("Deployment", "scheduler-api"), "no workload runs the api"),
    "API http port not SCHEDULER_API_PORT": (
        _set("containerPort", 8081, _api_port("http")),
        "SCHEDULER_API_PORT is 8080",
    ),
    "API grpc port not SCHEDULER_GRPC_PORT": (
        _settings("SCHEDULER_GRPC_PORT", "50052"),
        "SCHEDULER_GRPC_PORT is 50052",
    ),
    "API without its http and grpc ports": (
        _set(f"{CONTAINER}.ports", [{"name": "metrics", "containerPort": 9464}], _api),
        "no port named 'grpc'",
    ),
    "API probed on its http port": (
        _set(f"{CONTAINER}.readinessProbe.httpGet.port", "http", _api),
        "readinessProbe probes port 8080",
    ),
    "API only on loopback": (_settings("SCHEDULER_API_HOST", "127.0.0.1"), "SCHEDULER_API_HOST"),
    "API without a preStop wait": (
        _set(f"{CONTAINER}.lifecycle", None, _api),
        "needs a preStop sleep",
    ),
    "API preStop that runs a command": (
        _set(f"{CONTAINER}.lifecycle.preStop", {"exec": {"command": ["sleep", "5"]}}, _api),
        "preStop must be a sleep action",
    ),
    "API preStop and drain past the grace period": (
        _set(f"{CONTAINER}.lifecycle.preStop.sleep.seconds", 15, _api),
        "plus the 15 s preStop wait",
    ),
    "API with no key to verify tokens": (_no_jwt_key, "no key to verify tokens"),
    "API JWT secret as a literal": (_literal_jwt_secret, "SCHEDULER_JWT_SECRET is a literal"),
    "JWT secret in the settings": (
        _settings("SCHEDULER_JWT_SECRET", "a-literal-secret-of-more-than-thirty-two-bytes"),
        "settings ConfigMap: SCHEDULER_JWT_SECRET is a literal",
    ),
    "no algorithm at all in the settings every pod reads": (
        _settings("SCHEDULER_JWT_ALGORITHMS", "none"),
        "settings ConfigMap: SCHEDULER_JWT_ALGORITHMS",
    ),
    "API with a count of its own": (_set("spec.replicas", 2, _api), "must have no replicas"),
    "autoscaler of another Deployment": (
        _set("spec.scaleTargetRef.name", "scheduler-apis", _api_autoscaler),
        "no Deployment of the manifests",
    ),
    "no autoscaler for the API": (
        _drop("HorizontalPodAutoscaler", "scheduler-api"),
        "no HorizontalPodAutoscaler scales it",
    ),
    "autoscaler down to what a drain stops": (
        _set("spec.minReplicas", 1, _api_autoscaler),
        "a drain could stop every pod",
    ),
    "autoscaler maximum below its minimum": (
        _set("spec.maxReplicas", 1, _api_autoscaler),
        "maxReplicas 1 is below minReplicas 2",
    ),
    "no Service for the API": (_drop("Service", "scheduler-api"), "no Service routes to its http port"),
    "Service routing to the scanner": (_service_to_the_scanner, "only the API takes requests"),
    "Service to the metrics port": (
        _set("targetPort", "metrics", _api_service_port("http")),
        "not the API's http or grpc port",
    ),
    "gRPC Service port without h2c": (
        _set("appProtocol", None, _api_service_port("grpc")),
        "appProtocol must be kubernetes.io/h2c",
    ),
    "no ingress to the API": (
        _drop("NetworkPolicy", "scheduler-api"),
        "no policy admits requests to its http port",
    ),
    "API metrics open to anyone": (
        _api_ingress_to_metrics_from_anywhere,
        "ingress other than metrics scrapes and requests to the API's http and grpc ports",
    ),
    "API ingress on every port": (_api_ingress_on_every_port, "ingress other than metrics scrapes and"),
    "API given Kafka egress": (_kafka_for_the_api, "lets the API reach Kafka"),
    "API pods outside the database clients' policy": (
        _unlabel_api_database,
        "Deployment scheduler-api: no policy lets it reach PostgreSQL",
    ),
    "no disruption budget for the API": (
        _drop("PodDisruptionBudget", "scheduler-api"),
        "Deployment scheduler-api: no PodDisruptionBudget",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_a_broken_manifest_fails_the_checks(rendered: dict[str, list[Object]], breakage: str) -> None:
    objects = copy.deepcopy(rendered["dev"])
    mutate, expected = BROKEN[breakage]
    mutate(objects)
    problems = problems_of(objects)
    assert any(expected in p for p in problems), problems


# Production verifies API tokens with a JWKS URL: what only that overlay has.
BROKEN_PRODUCTION: dict[str, tuple[Callable[[list[Object]], None], str]] = {
    "no way to the JWKS": (
        _drop("NetworkPolicy", "scheduler-api-jwks"),
        "no policy lets it reach the JWKS of SCHEDULER_JWT_JWKS (idp.example.com) (port 443)",
    ),
    "autoscaler below the production minimum of two": (
        _set("spec.minReplicas", 1, _api_autoscaler),
        "a drain could stop every pod",
    ),
    "Kafka port opened for the JWKS": (
        _set(
            "spec.egress.0.ports.0.port",
            9093,
            lambda o: named(o, "NetworkPolicy", "scheduler-api-jwks"),
        ),
        "lets the API reach Kafka (port 9093)",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_PRODUCTION))
def test_a_broken_production_manifest_fails_the_checks(
    rendered: dict[str, list[Object]], breakage: str
) -> None:
    objects = copy.deepcopy(rendered["production"])
    mutate, expected = BROKEN_PRODUCTION[breakage]
    mutate(objects)
    problems = problems_of(objects)
    assert any(expected in p for p in problems), problems


def test_the_prometheus_rule_is_the_alert_rules_file(tmp_path: Path) -> None:
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == render_rules(), (
        "k8s/base/prometheusrule.yaml is stale: run `make k8s-rules`"
    )
    rendered = render(K8S / "overlays" / "production")
    (rule,) = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    extracted = tmp_path / "rules.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing (Debian's prometheus package: make system-deps)"
    checked = subprocess.run([promtool, "check", "rules", str(extracted)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule['spec']['groups'])} rules found" in checked.stdout
