"""``k8s/base/prometheusrule.yaml`` from ``monitoring/alerts.yml``, the rules' one source.

The PrometheusRule's ``spec`` is that file's ``groups``, unchanged. ``make k8s-rules`` writes it
(``python -m tests.deploy.prometheusrule``); ``tests/deploy/test_manifests.py`` fails when the
committed copy differs from what this produces, so the two cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yml"
PROMETHEUS_RULE = ROOT / "k8s" / "base" / "prometheusrule.yaml"

HEADER = """\
# Generated from monitoring/alerts.yml by `make k8s-rules`: edit that file, not this one.
# tests/deploy/test_manifests.py fails when the two differ.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, as they read in alerts.yml."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def prometheus_rule(alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "scheduler-alerts"},
        "spec": {"groups": alerts["groups"]},
    }


def render() -> str:
    alerts = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    body = yaml.dump(prometheus_rule(alerts), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main() -> int:
    PROMETHEUS_RULE.write_text(render(), encoding="utf-8")
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)} from {ALERTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
