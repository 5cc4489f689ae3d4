"""``make check-manifests``: every overlay of ``k8s/`` rendered and checked, offline.

- core objects strictly against the Kubernetes 1.30 schemas (kubernetes-validate, which ships them);
- custom resources strictly against their operators' CRD schemas (``tests/deploy/crds/``);
- the rules the project relies on that no schema states: names that must agree with the code
  (topics, consumer groups, the health port, the probes' paths, the API's ports), what every pod
  must have (security context, probes, resources, a disruption budget, a network policy, no literal
  secret), that only the API takes requests (its Service, its ingress, its preStop wait and
  autoscaler) and never reaches Kafka, and that the KEDA, Strimzi, CloudNativePG and Prometheus
  Operator objects fit the workloads.

``python -m tests.deploy.check [OVERLAY_DIR ...]`` prints one line per problem and exits 1 if any.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError  # type: ignore[import-untyped]

from scheduler.cli.init import CORE_TOPIC_PARTITIONS
from scheduler.config import ConfigError, Settings, load_settings
from scheduler.kafka.topics import MAX_MESSAGE_BYTES_KEY, TOPIC_MAX_MESSAGE_BYTES
from scheduler.runtime.health import PROBE_UNDER_WAY_S
from tests.deploy.crd_schemas import validate_custom_resource
from tests.deploy.manifests import (
    K8S,
    OVERLAYS,
    ROOT,
    Object,
    RenderError,
    containers,
    main_container,
    named_port,
    of_kind,
    pod_spec,
    probes,
    render,
    settings_map,
)

KUBERNETES_VERSION = "1.30.0"
_VARIABLE_RE = re.compile(r"\b(SCHEDULER_[A-Z0-9_]*[A-Z0-9])\b")
HEALTH_PATHS = {"startupProbe": "/startup", "livenessProbe": "/live", "readinessProbe": "/ready"}
# A health endpoint may wait PROBE_UNDER_WAY_S for a dependency that does not answer, then answer:
# a kubelet that gives up sooner counts a failure the process did not report (three of them restart
# a component that only waits on PostgreSQL). Twice that leaves room for a CPU-throttled pod.
PROBE_TIMEOUT_S = 2 * PROBE_UNDER_WAY_S
COMPONENTS = ("scanner", "relay", "reconciler", "ingestor", "api")
# The one component that takes requests (a Service, ingress on its own ports) and the one that has
# no Kafka client: it writes triggers and replays to the outbox, which the relay publishes.
API = "api"
# The API's container ports by name, and the setting each must equal.
API_PORTS = {"http": "SCHEDULER_API_PORT", "grpc": "SCHEDULER_GRPC_PORT"}
GRPC_APP_PROTOCOL = "kubernetes.io/h2c"
# What the image's entrypoint runs for each Job (`scheduler <args>`).
JOB_COMMANDS = {"migrate": ["init"], "app-setup": ["apps", "create"]}
# Worker stop grace (`--grace`) when the args do not say; the others stop within the same.
DEFAULT_GRACE_S = 30.0
SECRET_NAME_RE = re.compile(r"PASSWORD|SECRET|TOKEN|DATABASE_URL|_KEY$")


# Settings that name a file every process checks at start (the path must exist in its container).
FILE_SETTINGS = frozenset(
    (
        "SCHEDULER_DATABASE_SSLROOTCERT",
        "SCHEDULER_DATABASE_SSLCERT",
        "SCHEDULER_DATABASE_SSLKEY",
        "SCHEDULER_KAFKA_SSL_CA_LOCATION",
        "SCHEDULER_KAFKA_SSL_CERTIFICATE_LOCATION",
        "SCHEDULER_KAFKA_SSL_KEY_LOCATION",
        "SCHEDULER_JWT_JWKS",
    )
)

# Folders of the image with files such a setting may name: Debian's CA bundle (ca-certificates).
IMAGE_FILE_FOLDERS = ["/etc/ssl/certs"]


@functools.cache
def known_variables() -> frozenset[str]:
    """Every SCHEDULER_* name the package's code mentions, and the *_FILE form of its secrets."""
    found = {m for path in (ROOT / "scheduler").rglob("*.py") for m in _VARIABLE_RE.findall(path.read_text())}
    return frozenset(found | {f"{name}_FILE" for name in found if "PASSWORD" in name})


def core_problems(objects: list[Object]) -> list[str]:
    """Strict validation against the Kubernetes schemas of every object they know; custom resources
    against the vendored CRD schemas."""
    problems: list[str] = []
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except ValidationError as exc:
            problems.append(f"{where}: {'.'.join(str(p) for p in exc.path) or '(root)'}: {exc.message}")
        except SchemaNotFoundError:
            problems += [f"{where}: {error}" for error in validate_custom_resource(obj)]
    return problems


def _labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector (``matchLabels`` and ``matchExpressions``) as the API server reads it."""
    if not _labels_match(selector.get("matchLabels", {}), labels):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not matched:
            return False
    return True


def process_settings(objects: list[Object]) -> Settings:
    """The settings as the pods would load them from the ConfigMap: SASL credentials come from the
    Secret (stand-ins here); certificate and key-file paths exist in the image or a mount, not
    necessarily on this machine."""
    env = settings_map(objects)
    secrets = {"SCHEDULER_KAFKA_SASL_USERNAME": "user", "SCHEDULER_KAFKA_SASL_PASSWORD": "secret"}
    local_files = ("SCHEDULER_KAFKA_SSL", "SCHEDULER_DATABASE_SSL")
    return load_settings(
        {
            k: v
            for k, v in env.items()
            if not k.startswith(local_files)
            and not (k == "SCHEDULER_JWT_JWKS" and not v.startswith(("https://", "http://")))
        }
        | (secrets if "SCHEDULER_KAFKA_SASL_MECHANISM" in env else {})
    )


def _component(workload: Object) -> str:
    return _pod_labels(workload).get("app.kubernetes.io/component", "")


def _api_ports(objects: list[Object]) -> dict[str, int]:
    """The API's ports by container port name, as the process reads them from the settings."""
    settings = process_settings(objects)
    return {"http": settings.api_port, "grpc": settings.grpc_port}


def _pre_stop_sleep(container: Object) -> float:
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    return float(pre_stop.get("sleep", {}).get("seconds", 0))


def _routed(objects: list[Object], workload: Object) -> list[Object]:
    """The Services whose selector picks the workload's pods."""
    labels = _pod_labels(workload)
    return [
        s
        for s in of_kind(objects, "Service")
        if s["spec"].get("selector") and _labels_match(s["spec"]["selector"], labels)
    ]


def _pod_labels(workload: Object) -> Mapping[str, str]:
    labels: Mapping[str, str] = workload["spec"]["template"]["metadata"].get("labels", {})
    return labels


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def workload_problems(objects: list[Object]) -> list[str]:
    """What every Deployment and Job must have, and what must agree with the code."""
    problems: list[str] = []
    settings = settings_map(objects)
    port_setting = settings.get("SCHEDULER_METRICS_PORT")
    deployments = of_kind(objects, "Deployment")
    images = {c["image"] for w in of_kind(objects, "Deployment", "Job") for c in containers(w)}
    if len(images) != 1:
        problems.append(f"every container should run the one image, found {sorted(images)}")
    seen_components = set()
    host = settings.get("SCHEDULER_METRICS_HOST", "0.0.0.0")
    if host not in ("0.0.0.0", "::"):
        problems.append(f"SCHEDULER_METRICS_HOST={host}: the kubelet and Prometheus probe the pod's address")
    api_host = settings.get("SCHEDULER_API_HOST", "0.0.0.0")
    if api_host not in ("0.0.0.0", "::"):
        problems.append(f"SCHEDULER_API_HOST={api_host}: the Service sends requests to the pod's address")
    for key in settings:
        if key.startswith("SCHEDULER_") and key not in known_variables():
            problems.append(f"settings ConfigMap: {key} is no variable the scheduler reads")
        if SECRET_NAME_RE.search(key):
            problems.append(f"settings ConfigMap: {key} is a literal; it must come from a Secret")
    for namespace in of_kind(objects, "Namespace"):
        level = namespace["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
        if level not in ("baseline", "restricted"):
            problems.append(f"Namespace {namespace['metadata']['name']}: Pod Security must be enforced")
    for budget in of_kind(objects, "PodDisruptionBudget"):
        if budget["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
            problems.append(
                f"PodDisruptionBudget {budget['metadata']['name']}: unready pods (PostgreSQL or Kafka "
                "down) must stay evictable: unhealthyPodEvictionPolicy AlwaysAllow"
            )
        if "minAvailable" in budget["spec"]:
            problems.append(f"PodDisruptionBudget {budget['metadata']['name']}: use maxUnavailable")
        elif str(budget["spec"].get("maxUnavailable", 1)).rstrip("%") in ("0", ""):
            problems.append(
                f"PodDisruptionBudget {budget['metadata']['name']}: maxUnavailable 0 blocks every drain"
            )
    files = {k: v for k, v in settings.items() if k in FILE_SETTINGS and v.startswith("/")}
    for workload in of_kind(objects, "Deployment", "Job"):
        name = f"{workload['kind']} {workload['metadata']['name']}"
        spec = pod_spec(workload)
        for container in containers(workload):
            where = f"{name} container {container['name']}"
            for variable in container.get("env", []):
                key = variable["name"]
                if key.startswith("SCHEDULER_") and key not in known_variables():
                    problems.append(f"{where}: {key} is no variable the scheduler reads")
            # Every process validates every setting at start: a file one names must be mounted in
            # each container that loads the settings, init containers included.
            loads = any(
                source.get("configMapRef", {}).get("name", "").startswith("scheduler-settings")
                for source in container.get("envFrom", [])
            )
            # A mount is a folder, or the file itself (a subPath mount).
            mounts = [m["mountPath"].rstrip("/") for m in container.get("volumeMounts", [])]
            mounts += IMAGE_FILE_FOLDERS
            for key, path in files.items():
                if loads and not any(path == mount or path.startswith(mount + "/") for mount in mounts):
                    problems.append(f"{where}: {key}={path} is in no volume it mounts (it exits 2 at start)")
        component = _pod_labels(workload).get("app.kubernetes.io/component", "")
        selector = workload["spec"].get("selector", {}).get("matchLabels", {})
        if workload["kind"] == "Deployment" and not _labels_match(selector, _pod_labels(workload)):
            problems.append(f"{name}: its selector does not match its pod template's labels")
        database_refs = {
            json.dumps(e["valueFrom"], sort_keys=True)
            for c in containers(workload)
            for e in c.get("env", [])
            if e["name"] == "SCHEDULER_DATABASE_URL"
        }
        if len(database_refs) > 1:
            problems.append(
                f"{name}: its containers read SCHEDULER_DATABASE_URL from different Secrets or keys"
            )
        seen_components.add(component)
        pod_security = spec.get("securityContext", {})
        if not (pod_security.get("runAsNonRoot") and pod_security.get("runAsUser") == 65532):
            problems.append(f"{name}: the pod must run as non-root uid 65532")
        if pod_security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: seccompProfile must be RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: no service-account token should be mounted")
        for container in containers(workload):
            where = f"{name} container {container['name']}"
            security = container.get("securityContext", {})
            if not (
                security.get("readOnlyRootFilesystem") is True
                and security.get("allowPrivilegeEscalation") is False
                and security.get("capabilities", {}).get("drop") == ["ALL"]
            ):
                problems.append(
                    f"{where}: needs a read-only root, no privilege escalation, all capabilities dropped"
                )
            if not any(m.get("mountPath") == "/tmp" for m in container.get("volumeMounts", [])):
                problems.append(f"{where}: the image's only writable path, /tmp, must be a volume")
            resources = container.get("resources", {})
            if not (resources.get("requests", {}).get("cpu") and resources.get("limits", {}).get("memory")):
                problems.append(f"{where}: needs cpu and memory requests and a memory limit")
            for item in container.get("env", []):
                if SECRET_NAME_RE.search(item["name"]) and "value" in item:
                    problems.append(f"{where}: {item['name']} is a literal; it must come from a Secret")
            if container.get("command"):
                problems.append(f"{where}: must use the image's entrypoint (`scheduler`), not a command")
        args: list[str] = main_container(workload).get("args", [])
        if workload["kind"] == "Job":
            expected = JOB_COMMANDS.get(component)
            if expected is None or args[: len(expected)] != expected:
                problems.append(f"{name}: a Job runs {sorted(JOB_COMMANDS.values())}, not {args}")
            continue
        if args[:2] != ["run", component]:
            problems.append(
                f"{name}: component {component!r} must run `scheduler run {component}`, not {args}"
            )
        container = main_container(workload)
        found = probes(container)
        for kind, path in HEALTH_PATHS.items():
            probe = found.get(kind, {}).get("httpGet")
            if probe is None or probe.get("path") != path:
                problems.append(f"{name}: {kind} must GET {path}")
                continue
            try:
                port = named_port(container, probe["port"])
            except KeyError as exc:
                problems.append(f"{name}: {kind}: {exc.args[0]}")
                continue
            if str(port) != port_setting:
                problems.append(
                    f"{name}: {kind} probes port {port}, but SCHEDULER_METRICS_PORT is {port_setting}"
                )
            # Kubernetes' default is 1 s.
            timeout = found[kind].get("timeoutSeconds", 1)
            if timeout < PROBE_TIMEOUT_S:
                problems.append(
                    f"{name}: {kind} gives up after {timeout} s, but the process may wait "
                    f"{PROBE_UNDER_WAY_S} s for a dependency before it answers (allow {PROBE_TIMEOUT_S:g} s)"
                )
        grace = float(_arg(args, "--grace") or DEFAULT_GRACE_S)
        pre_stop = container.get("lifecycle", {}).get("preStop")
        if pre_stop is not None and set(pre_stop) != {"sleep"}:
            problems.append(
                f"{name}: preStop must be a sleep action: the kubelet waits, no process starts in it"
            )
        waited = _pre_stop_sleep(container)
        if spec.get("terminationGracePeriodSeconds", 30) <= grace + waited:
            problems.append(
                f"{name}: terminationGracePeriodSeconds must exceed the {grace:g} s drain grace"
                + (f" plus the {waited:g} s preStop wait" if waited else "")
            )
        if _routed(objects, workload) and waited <= 0:
            problems.append(
                f"{name}: a Service routes to it, so it needs a preStop sleep: SIGTERM must wait until "
                "its endpoints are removed"
            )
        if component == API:
            problems += _api_workload_problems(objects, workload)
        env_names = {e["name"] for c in containers(workload) for e in c.get("env", [])}
        if component == "worker" and "SCHEDULER_DATABASE_URL" in env_names:
            problems.append(f"{name}: workers reach Kafka only; they must not get the database")
        if component != "worker" and "SCHEDULER_DATABASE_URL" not in env_names:
            problems.append(f"{name}: needs SCHEDULER_DATABASE_URL from a Secret")
        if component != "worker" and not any(
            c.get("args", [])[:2] == ["migrations", "wait"] for c in spec.get("initContainers", [])
        ):
            problems.append(f"{name}: needs an init container running `scheduler migrations wait`")
        if not any(
            _selects(p["spec"]["selector"], _pod_labels(workload))
            for p in of_kind(objects, "PodDisruptionBudget")
        ):
            problems.append(f"{name}: no PodDisruptionBudget selects its pods")
    for component in (*COMPONENTS, "migrate"):
        if component not in seen_components:
            problems.append(f"no workload runs the {component}")
    if not any(_pod_labels(d).get("app.kubernetes.io/component") == "worker" for d in deployments):
        problems.append("no worker Deployment")
    return problems


def _api_workload_problems(objects: list[Object], workload: Object) -> list[str]:
    """The API's ports are the settings', and it has a key to verify tokens with."""
    problems: list[str] = []
    name = f"{workload['kind']} {workload['metadata']['name']}"
    container = main_container(workload)
    for port_name, port in _api_ports(objects).items():
        try:
            declared = named_port(container, port_name)
        except KeyError as exc:
            problems.append(f"{name}: {exc.args[0]}")
            continue
        if declared != port:
            problems.append(
                f"{name}: container port {port_name} is {declared}, but {API_PORTS[port_name]} is {port}"
            )
    from_secret = any(
        e["name"] == "SCHEDULER_JWT_SECRET" and "secretKeyRef" in e.get("valueFrom", {})
        for e in container.get("env", [])
    )
    if not from_secret and not settings_map(objects).get("SCHEDULER_JWT_JWKS"):
        problems.append(
            f"{name}: no key to verify tokens: SCHEDULER_JWT_SECRET from a Secret, or SCHEDULER_JWT_JWKS"
        )
    return problems


def autoscaler_problems(objects: list[Object]) -> list[str]:
    """Each HorizontalPodAutoscaler scales a Deployment of the render that has no count of its own,
    and never below what a drain leaves serving; the API has one."""
    problems: list[str] = []
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    scaled: set[str] = set()
    for autoscaler in of_kind(objects, "HorizontalPodAutoscaler"):
        where = f"HorizontalPodAutoscaler {autoscaler['metadata']['name']}"
        spec = autoscaler["spec"]
        target = spec["scaleTargetRef"]
        deployment = deployments.get(target.get("name", ""))
        if target.get("kind") != "Deployment" or target.get("apiVersion") != "apps/v1" or deployment is None:
            problems.append(
                f"{where}: scales {target.get('apiVersion')} {target.get('kind')} {target.get('name')}, "
                "no Deployment of the manifests"
            )
            continue
        scaled.add(deployment["metadata"]["name"])
        if "replicas" in deployment["spec"]:
            problems.append(
                f"{where}: Deployment {deployment['metadata']['name']} must have no replicas: every "
                "`kubectl apply` would put its count back, stopping pods the autoscaler added"
            )
        least = spec.get("minReplicas", 1)
        if spec["maxReplicas"] < least:
            problems.append(f"{where}: maxReplicas {spec['maxReplicas']} is below minReplicas {least}")
        for budget in of_kind(objects, "PodDisruptionBudget"):
            if not _selects(budget["spec"]["selector"], _pod_labels(deployment)):
                continue
            allowed = budget["spec"].get("maxUnavailable", 1)
            if isinstance(allowed, int) and least <= allowed:
                problems.append(
                    f"{where}: minReplicas {least} is not above the maxUnavailable {allowed} of "
                    f"PodDisruptionBudget {budget['metadata']['name']}: a drain could stop every pod"
                )
    for name, deployment in deployments.items():
        if _component(deployment) == API and name not in scaled:
            problems.append(f"Deployment {name}: no HorizontalPodAutoscaler scales it")
    return problems


def service_problems(objects: list[Object]) -> list[str]:
    """Services route only to the API, only to its http and grpc ports, gRPC as h2c; the API has
    one that serves both."""
    problems: list[str] = []
    api_ports = _api_ports(objects)
    deployments = of_kind(objects, "Deployment")
    for service in of_kind(objects, "Service"):
        where = f"Service {service['metadata']['name']}"
        selector = service["spec"].get("selector", {})
        if not selector:
            problems.append(f"{where}: needs a selector (the API's pods)")
            continue
        for deployment in deployments:
            if _labels_match(selector, _pod_labels(deployment)) and _component(deployment) != API:
                problems.append(
                    f"{where}: routes to Deployment {deployment['metadata']['name']}: only the API "
                    "takes requests"
                )
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            if str(target) not in {*api_ports, *(str(p) for p in api_ports.values())}:
                problems.append(
                    f"{where}: port {port.get('name', port['port'])} targets {target}, not the API's "
                    "http or grpc port"
                )
            grpc = target == "grpc" or str(target) == str(api_ports["grpc"])
            if grpc and port.get("appProtocol") != GRPC_APP_PROTOCOL:
                problems.append(
                    f"{where}: port {port.get('name', port['port'])} is gRPC without TLS: appProtocol "
                    f"must be {GRPC_APP_PROTOCOL}"
                )
    for deployment in deployments:
        if _component(deployment) != API:
            continue
        targets = {
            str(p.get("targetPort", p["port"]))
            for s in _routed(objects, deployment)
            for p in s["spec"].get("ports", [])
        }
        for port_name, number in api_ports.items():
            if not targets & {port_name, str(number)}:
                problems.append(
                    f"Deployment {deployment['metadata']['name']}: no Service routes to its {port_name} port"
                )
    return problems


def network_problems(objects: list[Object]) -> list[str]:
    """Default deny for every scheduler pod; ingress only to the metrics port from monitoring, and
    to the API's http and grpc ports; the workers never reach PostgreSQL, the API never Kafka."""
    problems: list[str] = []
    policies = of_kind(objects, "NetworkPolicy")
    bootstrap = settings_map(objects).get("SCHEDULER_KAFKA_BOOTSTRAP", "")
    kafka_port = bootstrap.split(",")[0].rpartition(":")[2]
    kafka_ports = {address.rpartition(":")[2] for address in bootstrap.split(",")}
    api_port_numbers = _api_ports(objects)
    api_ports = {*api_port_numbers, *(str(n) for n in api_port_numbers.values())}
    jwks = settings_map(objects).get("SCHEDULER_JWT_JWKS", "")
    for workload in of_kind(objects, "Deployment", "Job"):
        labels = _pod_labels(workload)
        name = f"{workload['kind']} {workload['metadata']['name']}"
        is_api = _component(workload) == API
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        if not any(
            set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
            and not p["spec"].get("ingress")
            and not p["spec"].get("egress")
            for p in mine
        ):
            problems.append(f"{name}: no default-deny policy selects it")
        for policy in mine:
            for rule in policy["spec"].get("ingress", []):
                sources = rule.get("from", [])
                ports = {str(p.get("port")) for p in rule.get("ports", [])}
                from_monitoring = sources and all(
                    s.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                    == "monitoring"
                    for s in sources
                )
                if from_monitoring and ports == {"metrics"}:
                    continue
                if is_api and ports and ports <= api_ports:
                    continue  # requests: from anywhere the policy names, to the API's ports only
                allowed = "metrics scrapes" + (
                    " and requests to the API's http and grpc ports" if is_api else ""
                )
                problems.append(
                    f"{name}: policy {policy['metadata']['name']} admits ingress other than {allowed}"
                )
            reaches_postgres = any(
                str(p.get("port")) == "5432"
                for r in policy["spec"].get("egress", [])
                for p in r.get("ports", [])
            )
            if labels.get("app.kubernetes.io/component") == "worker" and reaches_postgres:
                problems.append(f"{name}: policy {policy['metadata']['name']} lets a worker reach PostgreSQL")
            if any(not r.get("to") and not r.get("ports") for r in policy["spec"].get("egress", [])):
                problems.append(f"{name}: policy {policy['metadata']['name']} allows all egress")
        egress_ports = {
            str(port.get("port"))
            for p in mine
            for r in p["spec"].get("egress", [])
            for port in r.get("ports", [])
        }
        needed = {"53": "DNS"}
        if is_api:
            admitted = {
                str(port.get("port"))
                for p in mine
                for r in p["spec"].get("ingress", [])
                for port in r.get("ports", [])
            }
            for port_name, number in api_port_numbers.items():
                if not admitted & {port_name, str(number)}:
                    problems.append(f"{name}: no policy admits requests to its {port_name} port")
            for policy in mine:
                rules = policy["spec"].get("egress", [])
                reached = {str(port.get("port")) for r in rules for port in r.get("ports", [])}
                if reached & kafka_ports or any(not r.get("ports") for r in rules):
                    problems.append(
                        f"{name}: policy {policy['metadata']['name']} lets the API reach Kafka "
                        f"(port {kafka_port}); it has no Kafka client"
                    )
            if jwks.startswith(("https://", "http://")):
                url = urlsplit(jwks)
                jwks_port = url.port or (443 if url.scheme == "https" else 80)
                needed[str(jwks_port)] = f"the JWKS of SCHEDULER_JWT_JWKS ({url.hostname})"
        else:
            needed[kafka_port] = "Kafka"
        reads_database = any(
            e["name"] == "SCHEDULER_DATABASE_URL" for c in containers(workload) for e in c.get("env", [])
        )
        if labels.get("kafka-pg-scheduler/database") == "client" or reads_database:
            needed["5432"] = "PostgreSQL"
        for port, what in needed.items():
            if port not in egress_ports:
                problems.append(f"{name}: no policy lets it reach {what} (port {port})")
    return problems


def custom_resource_problems(objects: list[Object]) -> list[str]:
    """The fields of KEDA, Prometheus Operator, Strimzi and CloudNativePG objects the scheduler
    relies on, checked against the workloads and the code's own names."""
    problems: list[str] = []
    settings = process_settings(objects)
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    workers = {
        _arg(main_container(d).get("args", []), "--app"): d
        for d in deployments.values()
        if _pod_labels(d).get("app.kubernetes.io/component") == "worker"
    }
    partitions: dict[str, int] = {}
    for job in of_kind(objects, "Job"):
        args = main_container(job).get("args", [])
        if args[:2] == ["apps", "create"]:
            partitions[args[2]] = int(_arg(args, "--partitions") or 6)
    for app in workers:
        if app not in partitions:
            problems.append(f"worker app {app}: no Job registers it (`scheduler apps create {app}`)")

    scaled = of_kind(objects, "ScaledObject")
    for app, worker in workers.items():
        mine = [s for s in scaled if s["spec"]["scaleTargetRef"].get("name") == worker["metadata"]["name"]]
        if len(mine) != 1:
            problems.append(f"worker app {app}: needs exactly one ScaledObject, found {len(mine)}")
            continue
        spec = mine[0]["spec"]
        (trigger,) = spec["triggers"]
        meta = trigger["metadata"]
        assert app is not None
        expected = {
            "bootstrapServers": settings.kafka_bootstrap,
            "consumerGroup": settings.worker_group(app),
            "topic": settings.jobs_topic(app),
        }
        for key, value in expected.items():
            if meta.get(key) != value:
                problems.append(
                    f"ScaledObject of {app}: {key} is {meta.get(key)!r}, the workers use {value!r}"
                )
        if spec["scaleTargetRef"].get("kind", "Deployment") != "Deployment":
            problems.append(f"ScaledObject of {app}: it must scale the worker Deployment")
        for key in ("lagThreshold", "activationLagThreshold"):
            if not str(meta.get(key, "1")).isdigit():
                problems.append(f"ScaledObject of {app}: {key} {meta.get(key)!r} is not a whole number")
        if trigger["type"] != "kafka":
            problems.append(f"ScaledObject of {app}: the trigger must be kafka (consumer lag)")
        if app in partitions and spec.get("maxReplicaCount", 100) > partitions[app]:
            problems.append(
                f"ScaledObject of {app}: maxReplicaCount {spec.get('maxReplicaCount')} is above the "
                f"topic's {partitions[app]} partitions"
            )
        if settings.kafka.sasl_mechanism and "authenticationRef" not in trigger:
            problems.append(f"ScaledObject of {app}: Kafka needs SASL, the trigger has no authenticationRef")
        auth = trigger.get("authenticationRef", {}).get("name")
        if auth and not any(t["metadata"]["name"] == auth for t in of_kind(objects, "TriggerAuthentication")):
            problems.append(f"ScaledObject of {app}: TriggerAuthentication {auth} is not in the manifests")

    monitors = of_kind(objects, "PodMonitor")
    if not monitors:
        problems.append("no PodMonitor scrapes the components")
    for name, deployment in deployments.items():
        port_names = {p.get("name") for p in main_container(deployment).get("ports", [])}
        if not any(
            _selects(m["spec"]["selector"], _pod_labels(deployment))
            and any(
                e.get("port") in port_names and e.get("path") == "/metrics"
                for e in m["spec"]["podMetricsEndpoints"]
            )
            for m in monitors
        ):
            problems.append(f"Deployment {name}: no PodMonitor scrapes /metrics on one of its ports")
    for monitor in monitors:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            targets = {r.get("targetLabel"): r.get("sourceLabels") for r in endpoint.get("relabelings", [])}
            for label, source in (
                ("component", "app_kubernetes_io_component"),
                ("app", "kafka_pg_scheduler_app"),
            ):
                if targets.get(label) != [f"__meta_kubernetes_pod_label_{source}"]:
                    problems.append(
                        f"PodMonitor {monitor['metadata']['name']}: the alert rules need the target label "
                        f"{label} from the pods' labels"
                    )
    if not of_kind(objects, "PrometheusRule"):
        problems.append("no PrometheusRule carries the alert rules")

    topics = {t["spec"].get("topicName", t["metadata"]["name"]): t for t in of_kind(objects, "KafkaTopic")}
    clusters = {k["metadata"]["name"]: k for k in of_kind(objects, "Kafka")}
    if clusters:
        for name, kafka in clusters.items():
            annotations = kafka["metadata"].get("annotations", {})
            if (
                annotations.get("strimzi.io/kraft") != "enabled"
                or annotations.get("strimzi.io/node-pools") != "enabled"
            ):
                problems.append(f"Kafka {name}: must run in KRaft mode with node pools")
            roles = {
                role
                for pool in of_kind(objects, "KafkaNodePool")
                if pool["metadata"].get("labels", {}).get("strimzi.io/cluster") == name
                for role in pool["spec"]["roles"]
            }
            if roles != {"broker", "controller"}:
                problems.append(
                    f"Kafka {name}: its node pools must give it brokers and controllers, have {roles}"
                )
            # With the namespace: KEDA resolves the same address from a namespace of its own.
            service = f"{name}-kafka-bootstrap.{kafka['metadata'].get('namespace', 'default')}.svc"
            if not settings.kafka_bootstrap.startswith(f"{service}:"):
                problems.append(f"SCHEDULER_KAFKA_BOOTSTRAP should be {service}:<port>")
        wanted = {t: CORE_TOPIC_PARTITIONS for t in settings.core_topics} | {
            settings.jobs_topic(app): n for app, n in partitions.items()
        }
        for topic, count in wanted.items():
            resource = topics.get(topic)
            if resource is None:
                problems.append(f"KafkaTopic {topic}: missing (Strimzi manages this overlay's topics)")
                continue
            if resource["spec"].get("partitions") != count:
                problems.append(
                    f"KafkaTopic {topic}: {resource['spec'].get('partitions')} partitions, "
                    f"the scheduler makes {count}"
                )
            if str(resource["spec"].get("config", {}).get(MAX_MESSAGE_BYTES_KEY)) != str(
                TOPIC_MAX_MESSAGE_BYTES
            ):
                problems.append(
                    f"KafkaTopic {topic}: {MAX_MESSAGE_BYTES_KEY} must be {TOPIC_MAX_MESSAGE_BYTES}"
                )
            if resource["metadata"].get("labels", {}).get("strimzi.io/cluster") not in clusters:
                problems.append(f"KafkaTopic {topic}: strimzi.io/cluster names no Kafka of the overlay")

    databases = {c["metadata"]["name"] for c in of_kind(objects, "Cluster")}
    if databases:
        refs = {
            e["valueFrom"]["secretKeyRef"]["name"]
            for w in of_kind(objects, "Deployment", "Job")
            for c in containers(w)
            for e in c.get("env", [])
            if e["name"] == "SCHEDULER_DATABASE_URL"
        }
        expected_refs = {f"{name}-app" for name in databases}
        if not refs or not refs <= expected_refs:
            problems.append(
                f"SCHEDULER_DATABASE_URL comes from {sorted(refs)}, "
                f"CloudNativePG makes {sorted(expected_refs)}"
            )
    return problems


CHECKS: tuple[Callable[[list[Object]], list[str]], ...] = (
    core_problems,
    workload_problems,
    autoscaler_problems,
    service_problems,
    network_problems,
    custom_resource_problems,
)


def problems_of(objects: list[Object]) -> list[str]:
    problems: list[str] = []
    for check in CHECKS:
        try:
            problems += check(objects)
        except ConfigError as exc:  # the pods would not start either; said once, not per check
            if f"settings ConfigMap: {exc}" not in problems:
                problems.append(f"settings ConfigMap: {exc}")
    return problems


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [K8S / "overlays" / o for o in OVERLAYS]
    failed = 0
    for path in paths:
        try:
            objects = render(path)
        except RenderError as error:  # kustomize's own message names the file and the fault
            print(f"{path}: {error}")
            failed += 1
            continue
        found = problems_of(objects)
        for problem in found:
            print(f"{path}: {problem}")
        failed += len(found)
        if not found:
            print(f"{path}: {len(objects)} objects, all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
