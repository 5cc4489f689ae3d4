"""Rendering ``k8s/`` and reading what the rendered objects ask of a container, as the kubelet would.

Shared by the static checks (``test_manifests.py``) and the test that runs the manifests with
podman (``test_manifests_run.py``), so that both read the manifests the same way.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("dev", "production")
WORKLOAD_KINDS = ("Deployment", "Job")

Object = dict[str, Any]


class RenderError(RuntimeError):
    pass


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise RenderError("kubectl (with kustomize) is not on PATH")
    return found


def render(path: Path) -> list[Object]:
    """``kubectl kustomize path``, parsed."""
    done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RenderError(f"kubectl kustomize {path} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(objects: list[Object], *kinds: str) -> list[Object]:
    return [o for o in objects if o["kind"] in kinds]


def named(objects: list[Object], kind: str, name: str) -> Object:
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise KeyError(f"no {kind} {name}")


def pod_spec(workload: Object) -> Object:
    spec: Object = workload["spec"]["template"]["spec"]
    return spec


def containers(workload: Object, *, init: bool = True) -> Iterator[Object]:
    spec = pod_spec(workload)
    if init:
        yield from spec.get("initContainers", [])
    yield from spec["containers"]


def main_container(workload: Object) -> Object:
    found: list[Object] = [c for c in pod_spec(workload)["containers"] if c["name"] == "scheduler"]
    (container,) = found
    return container


def config_map(objects: list[Object], name: str) -> Mapping[str, str]:
    """A ConfigMap by the name a container refers to (kustomize's hashed name)."""
    data: Mapping[str, str] = named(objects, "ConfigMap", name).get("data", {})
    return data


def settings_map(objects: list[Object]) -> Mapping[str, str]:
    (settings,) = [
        o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].startswith("scheduler-settings")
    ]
    data: Mapping[str, str] = settings.get("data", {})
    return data


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


_VAR_RE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(
    objects: list[Object],
    container: Object,
    *,
    secrets: Mapping[SecretRef, str],
    pod_name: str,
    namespace: str,
) -> dict[str, str]:
    """The environment the kubelet gives ``container``: ``envFrom`` first, then ``env`` in order
    with ``$(VAR)`` expanded from what precedes it. A missing Secret or key fails unless marked
    optional, as it would keep the pod from starting."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_map(objects, source["configMapRef"]["name"]))
        elif "secretRef" in source:
            ref = source["secretRef"]
            found = {s.key: v for s, v in secrets.items() if s.name == ref["name"]}
            if not found and not ref.get("optional", False):
                raise KeyError(f"secret {ref['name']} is needed by envFrom")
            env.update(found)
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = _VAR_RE.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            continue
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            ref = SecretRef(source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
            if ref not in secrets:
                if source["secretKeyRef"].get("optional", False):
                    continue
                raise KeyError(f"{name} needs secret {ref.name} key {ref.key}")
            env[name] = secrets[ref]
        elif "configMapKeyRef" in source:
            env[name] = config_map(objects, source["configMapKeyRef"]["name"])[
                source["configMapKeyRef"]["key"]
            ]
        elif "fieldRef" in source:
            field = source["fieldRef"]["fieldPath"]
            env[name] = {"metadata.name": pod_name, "metadata.namespace": namespace}[field]
        else:
            raise KeyError(f"{name}: unsupported valueFrom {sorted(source)}")
    return env


def named_port(container: Object, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    for entry in container.get("ports", []):
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise KeyError(f"container {container['name']} has no port named {port!r}")


def probes(container: Object) -> dict[str, Object]:
    return {
        kind: container[kind]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if kind in container
    }
