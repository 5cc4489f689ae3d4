"""A real Prometheus scrapes the components and evaluates the shipped alert rules against them.

The rules are a copy of ``monitoring/alerts.yml`` with every ``for:`` shortened to ``0s`` and nothing
else changed, so an alert that fires here fires in production on the same expression, only later."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.chaos_stack import free_port
from tests.e2e.health import cli, cli_json, get, wait_for_statuses
from tests.support import Component, stop_all, wait_for

pytestmark = pytest.mark.e2e

ALERTS = Path(__file__).resolve().parents[2] / "monitoring" / "alerts.yml"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
APP = "scraped"
COMPONENTS = ("scanner", "relay", "reconciler", "worker")


def immediate_rules(source: Path, target: Path) -> None:
    """``source`` with every ``for:`` set to ``0s``, checked to differ from it in nothing else."""
    text, count = re.subn(r"^(\s*)for:\s*\S+\s*$", r"\1for: 0s", source.read_text(), flags=re.MULTILINE)
    assert count > 0
    target.write_text(text)
    shipped, copied = yaml.safe_load(source.read_text()), yaml.safe_load(text)
    for group_shipped, group_copied in zip(shipped["groups"], copied["groups"], strict=True):
        for rule_shipped, rule_copied in zip(group_shipped["rules"], group_copied["rules"], strict=True):
            assert rule_copied.get("for", "0s") == "0s"
            assert {k: v for k, v in rule_copied.items() if k != "for"} == {
                k: v for k, v in rule_shipped.items() if k != "for"
            }
    checked = subprocess.run([PROMTOOL, "check", "rules", str(target)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@dataclass(frozen=True)
class Target:
    component: str
    port: int
    labels: Mapping[str, str]


class Prometheus:
    def __init__(self, work: Path, targets: list[Target], rules: Path) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": target.component,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{target.port}"], "labels": dict(target.labels)}
                    ],
                }
                for target in targets
            ],
        }
        config_file = work / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.log = work / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        answer = get(self.port, f"/api/v1/{path}{query}")
        assert answer.status == 200, (path, answer)
        document = answer.json()
        assert document["status"] == "success", document
        return document["data"]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def evaluated_at(rule: Mapping[str, Any]) -> datetime:
    # RFC 3339 with up to nanoseconds; datetime takes microseconds.
    text = re.sub(r"(\.\d{6})\d+", r"\1", str(rule["lastEvaluation"])).replace("Z", "+00:00")
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class Scraped:
    process: Component
    target: Target


@pytest.fixture
def pipeline(settings_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, Scraped]]:
    """Scanner, relay, reconciler and a worker as processes of their own, each on a metrics port."""
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    cli(env, "init")
    cli(env, "apps", "create", APP, "--partitions", "2")
    started: dict[str, Scraped] = {}
    try:
        for name in COMPONENTS:
            port = free_port()
            args = ["--app", APP] if name == "worker" else []
            labels = {"component": name} | ({"app": APP} if name == "worker" else {})
            started[name] = Scraped(
                Component(name, env, tmp_path, *args, "--metrics-port", str(port)), Target(name, port, labels)
            )
        yield started
    finally:
        stop_all([scraped.process for scraped in started.values()])


def test_prometheus_scrapes_every_component_and_fires_the_reconciler_alert_when_it_stops(
    pipeline: dict[str, Scraped], settings_env: dict[str, str], tmp_path: Path
) -> None:
    targets = [scraped.target for scraped in pipeline.values()]

    def logs() -> str:
        return "\n".join(f"--- {n}\n{s.process.output()[-2000:]}" for n, s in pipeline.items())

    wait_for_statuses({t.component: t.port for t in targets}, "/ready", 200, 120, logs)

    rules = tmp_path / "alerts.yml"
    immediate_rules(ALERTS, rules)
    work = tmp_path / "prometheus"
    work.mkdir()
    prometheus = Prometheus(work, targets, rules)
    try:
        wait_for(lambda: get(prometheus.port, "/-/ready").status == 200, 60, "Prometheus to be ready")

        for _ in range(3):
            cli_json(settings_env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop")

        def all_up() -> bool:
            active = prometheus.api("targets")["activeTargets"]
            return len(active) == len(targets) and all(t["health"] == "up" for t in active)

        wait_for(all_up, 60, "every target up in Prometheus", interval_s=0.5)
        by_component = {
            t["labels"]["component"]: t["labels"] for t in prometheus.api("targets")["activeTargets"]
        }
        assert by_component["worker"]["app"] == APP

        def scheduled() -> list[Any]:
            found = prometheus.api("query", query="job_scheduled_total")["result"]
            return [
                s
                for s in found
                if s["metric"].get("component") == "scanner"
                and s["metric"].get("app") == APP
                and s["metric"].get("kind") == "immediate"
                and float(s["value"][1]) >= 3
            ]

        wait_for(scheduled, 60, "job_scheduled_total of the three schedules in Prometheus", interval_s=0.5)

        def reconciler_rule() -> dict[str, Any]:
            for group in prometheus.api("rules", type="alert")["groups"]:
                for rule in group["rules"]:
                    if rule["name"] == "SchedulerReconcilerStopped":
                        return dict(rule)
            raise AssertionError("the rules Prometheus loaded have no SchedulerReconcilerStopped")

        # While the reconciler runs and polls, its alert is evaluated and quiet. (One scrape past
        # its 1 s timeout on a loaded machine reads as `up == 0`, and with `for: 0s` the evaluation
        # after it fires: an evaluation that finds it quiet is waited for.)
        mark = datetime.now(UTC)

        def quiet() -> dict[str, Any] | None:
            rule = reconciler_rule()
            return rule if evaluated_at(rule) > mark and rule["state"] == "inactive" else None

        wait_for(quiet, 30, "an evaluation of the rules that finds the running reconciler quiet")

        reconciler = pipeline["reconciler"].process
        assert reconciler.stop() == 0, reconciler.output()[-3000:]

        def firing() -> list[Any]:
            return [
                a
                for a in prometheus.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "SchedulerReconcilerStopped" and a["state"] == "firing"
            ]

        alerts = wait_for(firing, 60, "SchedulerReconcilerStopped to fire", interval_s=0.5)
        assert alerts[0]["labels"]["severity"] == "critical"
        assert alerts[0]["labels"]["component"] == "reconciler"
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- prometheus\n{prometheus.output()[-3000:]}\n{logs()}") from None
    finally:
        prometheus.stop()
