"""The alert rules in monitoring/: valid for Prometheus, proven by promtool's unit tests, and written
against the metric names the components export (a renamed metric breaks this test, not the pager).

Needs only ``promtool`` (Debian's ``prometheus`` package), no PostgreSQL or Kafka. The rules file is
read without a YAML library, which the project does not depend on: the reader below knows only the
layout alerts.yml keeps (``- alert:`` items with ``expr``/``for``/``severity``/``runbook`` keys,
expressions inline or as ``|`` blocks), and its rule count is checked against promtool's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts.test.yml"

# The metric contract of the components: what each one exports at /metrics (plus Prometheus's `up`).
HISTOGRAMS = {
    "scheduler_scanner_fire_lag_seconds",  # scanner
    "scheduler_dispatch_lag_seconds",  # relay
    "job_execution_duration_seconds",  # worker
}
METRICS = {
    # scanner
    "job_scheduled_total",
    "scheduler_scan_lag_seconds",
    "scheduler_scanner_runs_skipped_total",
    # relay
    "scheduler_outbox_depth",
    "scheduler_outbox_oldest_age_seconds",
    "scheduler_relay_published_total",
    "scheduler_relay_republished_total",
    "scheduler_relay_publish_failures_total",
    # worker
    "job_execution_errors_total",
    "job_queue_size",
    "scheduler_active_jobs",
    "scheduler_worker_concurrency",
    "job_retry_count_total",
    "scheduler_consumer_lag",  # and the reconciler's
    # reconciler
    "scheduler_reconciler_events_total",
    "scheduler_dead_letters_total",
    "scheduler_reconciler_last_batch_timestamp_seconds",
    # lease sweeper
    "scheduler_lease_expiries_total",
    # ingestor
    "scheduler_ingestor_commands_total",
    "scheduler_ingestor_rejected_total",
    # every component
    "up",
    "scheduler_build_info",
}
CONTRACT = METRICS | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")}

SEVERITIES = {"critical", "warning"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("promtool")
    if executable is None:
        pytest.fail(
            "promtool is not installed: it comes with Prometheus (Debian/Ubuntu: apt-get install "
            "prometheus); the alert rules cannot be checked without it",
            pytrace=False,
        )
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=120, check=False)


@dataclass
class Rule:
    name: str
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def expr(self) -> str:
        return self.keys["expr"]


_RULE_START = re.compile(r"^\s*- (?:alert|record): (\S+)\s*$")
_KEY = re.compile(r"^(\s*)(expr|for|severity|runbook): ?(.*)$")
_BLOCK = {"|", "|-", "|+", ">", ">-", ">+"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def read_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if start := _RULE_START.match(line):
            rules.append(Rule(start.group(1)))
            continue
        key = _KEY.match(line)
        if key is None or not rules or key.group(2) in rules[-1].keys:
            continue
        indent, name, value = _indent(line), key.group(2), key.group(3).strip()
        if value in _BLOCK:
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
                block.append(lines[i].strip())
                i += 1
            value = "\n".join(block).strip()
        elif value[:1] in {'"', "'"} and value[-1:] == value[:1]:
            value = value[1:-1]
        rules[-1].keys[name] = value
    return rules


_STRING = re.compile(r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|`[^`]*`")
_COMMENT = re.compile(r"#[^\n]*")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "group_left", "group_right", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label matchers,
    ranges and label lists are gone, less function names (followed by a parenthesis) and keywords."""
    bare = _STRING.sub('""', expr)
    bare = _COMMENT.sub("", bare)
    bare = _MATCHERS.sub(" ", bare)
    bare = _RANGE.sub(" ", bare)
    bare = _LABEL_LIST.sub(" ", bare)
    return {
        m.group(1)
        for m in _IDENTIFIER.finditer(bare)
        if m.group(2) is None and m.group(1).lower() not in _KEYWORDS
    }


@pytest.fixture(scope="module")
def rules() -> list[Rule]:
    return read_rules(RULES.read_text())


def test_promtool_accepts_the_rules_file(rules: list[Rule]) -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}{result.stderr}"
    found = re.search(r"(\d+) rules found", result.stdout)
    assert found is not None, result.stdout
    # The reader of this test sees every rule promtool sees.
    assert int(found.group(1)) == len(rules) > 0


def test_rules_pass_their_promtool_unit_tests() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}{result.stderr}"


def test_metric_names_reader() -> None:
    expr = """
      (sum by (app) (rate(job_scheduled_total{kind!="retry"}[10m] offset 1d)) or 0 * vector(1))
      < 0.5 * histogram_quantile(0.99, sum by (le) (rate(x_bucket{le=~"1|2"}[5m:1m])))
      and on (app) group_left (team) absent(up{component="a{b}"}) unless time() - last_seen > 1e3
    """
    assert metric_names(expr) == {"job_scheduled_total", "x_bucket", "up", "last_seen"}


def test_rules_use_only_the_metric_contract(rules: list[Rule]) -> None:
    used = {rule.name: metric_names(rule.expr) for rule in rules}
    assert all(used.values()), f"rules selecting no metric (reader broken?): {used}"
    unknown = {name: sorted(names - CONTRACT) for name, names in used.items() if names - CONTRACT}
    assert not unknown, f"rules using metrics outside the components' contract: {unknown}"


def test_every_alert_has_severity_runbook_and_a_firing_unit_test(rules: list[Rule]) -> None:
    for rule in rules:
        assert rule.keys.get("severity") in SEVERITIES, f"{rule.name}: severity {rule.keys.get('severity')}"
        assert rule.keys.get("runbook") == f"docs/operations.md#{rule.name.lower()}", rule.name
        assert "for" in rule.keys, f"{rule.name} has no for: duration"
    tests = RULE_TESTS.read_text()
    named = set(re.findall(r"alertname: (\w+)", tests))
    firing = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n\s*- ", tests))
    alerts = {rule.name for rule in rules}
    # A case naming no rule passes silently in promtool (it expects nothing and gets nothing).
    assert named <= alerts, f"unit tests naming unknown alerts: {sorted(named - alerts)}"
    assert firing == alerts, f"alerts without a case where they fire: {sorted(alerts - firing)}"
