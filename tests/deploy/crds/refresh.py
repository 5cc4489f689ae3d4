"""Rebuild the vendored CRD schemas in this directory from the operators' pinned releases.

Run from the repository root::

    .venv/bin/python tests/deploy/crds/refresh.py
    .venv/bin/python tests/deploy/crds/refresh.py --git-dir kedacore/keda=/src/keda/.git

The first form downloads each CRD from raw.githubusercontent.com at the pinned commit; ``--git-dir``
(repeatable) reads a repository from a local clone instead, for machines without that access. To
move to a new operator release, change its ``tag`` and ``commit`` in ``SOURCES`` (and the table in
README.md) and run the script again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Source:
    repo: str
    tag: str
    commit: str
    path: str
    version: str


CNPG = ("cloudnative-pg/cloudnative-pg", "v1.25.4", "f7b4ab966a3fdc265d6b1e0fade1f547968631c1")
STRIMZI = ("strimzi/strimzi-kafka-operator", "0.45.2", "d56c888f76e49078de596028a7335c5cb180982a")
KEDA = ("kedacore/keda", "v2.16.1", "ce14b239e0300f388b0425aef68154d8070cd66f")
PROMETHEUS_OPERATOR = (
    "prometheus-operator/prometheus-operator",
    "v0.79.2",
    "1d2dca5a93d50fe09d7662860f80448d2e37ff1a",
)

SOURCES = (
    Source(*CNPG, "config/crd/bases/postgresql.cnpg.io_clusters.yaml", "v1"),
    Source(*STRIMZI, "packaging/install/cluster-operator/040-Crd-kafka.yaml", "v1beta2"),
    Source(*STRIMZI, "packaging/install/cluster-operator/04A-Crd-kafkanodepool.yaml", "v1beta2"),
    Source(*STRIMZI, "packaging/install/cluster-operator/043-Crd-kafkatopic.yaml", "v1beta2"),
    Source(*KEDA, "config/crd/bases/keda.sh_scaledobjects.yaml", "v1alpha1"),
    Source(*KEDA, "config/crd/bases/keda.sh_triggerauthentications.yaml", "v1alpha1"),
    Source(
        *PROMETHEUS_OPERATOR, "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml", "v1"
    ),
    Source(
        *PROMETHEUS_OPERATOR,
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        "v1",
    ),
)

# Keys whose value maps field names to schemas: a field may itself be called "description".
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONES = ("items", "additionalProperties", "not")


def strip_descriptions(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key in _SCHEMA_MAPS:
            out[key] = {name: strip_descriptions(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [strip_descriptions(sub) for sub in value]
        elif key in _SCHEMA_ONES:
            out[key] = strip_descriptions(value)
        else:
            # default, enum, example and x-kubernetes-validations hold data, not schemas.
            out[key] = value
    return out


def read_source(source: Source, git_dirs: dict[str, Path]) -> str:
    git_dir = git_dirs.get(source.repo)
    if git_dir is not None:
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{source.commit}:{source.path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    url = f"https://raw.githubusercontent.com/{source.repo}/{source.commit}/{source.path}"
    with urllib.request.urlopen(url, timeout=60) as response:
        text: str = response.read().decode("utf-8")
        return text


def extract(source: Source, text: str) -> tuple[str, dict[str, Any]]:
    crds = [doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1:
        raise SystemExit(f"{source.repo}@{source.tag}:{source.path}: expected one CRD, found {len(crds)}")
    spec = crds[0]["spec"]
    for version in spec["versions"]:
        if version["name"] == source.version:
            if not version.get("served"):
                raise SystemExit(f"{source.path}: version {source.version} is not served")
            name = f"{spec['group']}_{source.version}_{spec['names']['kind']}.json"
            return name, strip_descriptions(version["schema"]["openAPIV3Schema"])
    raise SystemExit(f"{source.path}: no version {source.version}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--git-dir", action="append", default=[], metavar="OWNER/NAME=PATH")
    args = parser.parse_args(argv)
    git_dirs = {}
    for item in args.git_dir:
        repo, _, path = item.partition("=")
        git_dirs[repo] = Path(path)
    written = set()
    for source in SOURCES:
        name, schema = extract(source, read_source(source, git_dirs))
        (HERE / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        written.add(name)
        print(f"{name}  <- {source.repo}@{source.tag}:{source.path}")
    for stale in HERE.glob("*.json*"):
        if stale.name not in written:
            stale.unlink()
            print(f"removed {stale.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
