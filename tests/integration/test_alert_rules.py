"""The alert rules in monitoring/: valid for Prometheus, proven by promtool's unit tests, and written
against the metric names the components export (a renamed metric breaks this test, not the pager).

Needs only ``promtool`` (Debian's ``prometheus`` package) and PyYAML (the test extra), no PostgreSQL
or Kafka. Both files are read with ``yaml.safe_load``; the rule count is checked against promtool's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts.test.yml"

# The metric contract of the components: what each one exports at /metrics (plus Prometheus's `up`).
# The scrape targets are the scanner, relay, reconciler, ingestor and worker (label app); the lease
# sweeper and the buffer release run in the reconciler's process and export with its metrics.
HISTOGRAMS = {
    "scheduler_scanner_fire_lag_seconds",  # scanner
    "scheduler_dispatch_lag_seconds",  # relay
    "job_execution_duration_seconds",  # worker
    "scheduler_worker_start_lag_seconds",  # worker
    "scheduler_ingestor_batch_seconds",  # ingestor
    "scheduler_api_request_duration_seconds",  # api
}
METRICS = {
    # scanner
    "job_scheduled_total",
    "scheduler_scan_lag_seconds",
    "scheduler_scanner_runs_skipped_total",
    "scheduler_scanner_schedules_errored_total",
    "scheduler_schedules_in_error",
    # relay
    "scheduler_outbox_depth",
    "scheduler_outbox_oldest_age_seconds",
    "scheduler_relay_published_total",
    "scheduler_relay_republished_total",
    "scheduler_relay_publish_failures_total",
    "scheduler_relay_quarantined_total",
    "scheduler_relay_held_topics",
    # worker
    "job_execution_errors_total",
    "job_queue_size",
    "scheduler_active_jobs",
    "scheduler_worker_concurrency",
    "scheduler_worker_undecodable_total",
    "job_retry_count_total",
    "scheduler_worker_outcome_delivery_failures_total",
    "scheduler_worker_outcomes_unacknowledged",
    "scheduler_consumer_lag",  # and the reconciler's
    # reconciler
    "scheduler_reconciler_events_total",
    "scheduler_reconciler_undecodable_total",
    "scheduler_dead_letters_total",
    "scheduler_reconciler_last_batch_timestamp_seconds",
    "scheduler_reconciler_quarantined_total",
    "scheduler_reconciler_clock_ahead_events_total",
    # reconciler: its lease sweeper and its buffer release
    "scheduler_lease_expiries_total",
    "scheduler_lease_sweep_held_seconds",
    "scheduler_lease_sweep_unread_outcomes",
    "scheduler_buffered_runs_released_total",
    # ingestor
    "scheduler_ingestor_commands_total",
    "scheduler_ingestor_rejected_total",
    # api
    "scheduler_api_requests_total",
    # every component
    "up",
    "scheduler_build_info",
    "scheduler_ready",
}
CONTRACT = METRICS | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")}

# The scrape targets' `component` labels (the lease sweeper and the buffer release are the reconciler's).
COMPONENTS = {"scanner", "relay", "reconciler", "ingestor", "worker", "api"}

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


def load_yaml(path: Path) -> dict[str, object]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path.name}: not a mapping at the top"
    return {str(key): value for key, value in document.items()}


def items(value: object, what: str) -> list[dict[str, object]]:
    """``value`` as a list of mappings with string keys (``what`` names it in a failure)."""
    assert isinstance(value, list), f"{what}: not a list"
    for item in value:
        assert isinstance(item, Mapping), f"{what}: not a list of mappings: {item!r}"
    return [{str(key): v for key, v in item.items()} for item in value]


def strings(value: object, what: str) -> dict[str, str]:
    """A rule's ``labels`` or ``annotations``: a mapping of strings (none is ``{}``)."""
    if value is None:
        return {}
    assert isinstance(value, Mapping), f"{what}: not a mapping"
    return {str(key): str(v) for key, v in value.items()}


@dataclass
class Rule:
    name: str
    expr: str
    alert: bool
    duration: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def read_rules(document: Mapping[str, object]) -> list[Rule]:
    rules: list[Rule] = []
    for group in items(document.get("groups"), "groups"):
        for raw in items(group.get("rules"), f"group {group.get('name')}"):
            name = raw.get("alert", raw.get("record"))
            assert isinstance(name, str) and name, f"a rule without alert or record: {raw}"
            expr = raw.get("expr")
            assert isinstance(expr, str) and expr.strip(), f"{name}: no expr"
            duration = raw.get("for")
            rules.append(
                Rule(
                    name=name,
                    expr=expr,
                    alert="alert" in raw,
                    duration=None if duration is None else str(duration),
                    labels=strings(raw.get("labels"), f"{name}: labels"),
                    annotations=strings(raw.get("annotations"), f"{name}: annotations"),
                )
            )
    return rules


@dataclass
class Case:
    """One ``alert_rule_test`` item of the unit tests: an alert at a time, and whether it must fire."""

    alertname: str
    fires: bool


def read_cases(document: Mapping[str, object]) -> list[Case]:
    cases: list[Case] = []
    for test in items(document.get("tests"), "tests"):
        for case in items(test.get("alert_rule_test", []), f"test {test.get('name')}"):
            alertname = case.get("alertname")
            assert isinstance(alertname, str), f"test {test.get('name')}: a case without alertname"
            expected = case.get("exp_alerts") or []
            assert isinstance(expected, list), f"{alertname}: exp_alerts is not a list"
            cases.append(Case(alertname, bool(expected)))
    return cases


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
    return read_rules(load_yaml(RULES))


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


def outside_contract(rules: list[Rule]) -> dict[str, list[str]]:
    """The metric names each rule selects that no component exports, by rule (only the offenders)."""
    used = {rule.name: metric_names(rule.expr) for rule in rules}
    assert all(used.values()), f"rules selecting no metric (reader broken?): {used}"
    return {name: sorted(names - CONTRACT) for name, names in used.items() if names - CONTRACT}


def test_rules_use_only_the_metric_contract(rules: list[Rule]) -> None:
    unknown = outside_contract(rules)
    assert not unknown, f"rules using metrics outside the components' contract: {unknown}"


def test_a_renamed_metric_breaks_the_contract_check(rules: list[Rule]) -> None:
    rule = next(rule for rule in rules if "scheduler_outbox_oldest_age_seconds" in rule.expr)
    renamed = Rule(
        rule.name, rule.expr.replace("scheduler_outbox_oldest_age_seconds", "outbox_age_seconds"), True
    )
    assert outside_contract([renamed]) == {rule.name: ["outbox_age_seconds"]}


_COMPONENT_MATCHER = re.compile(r"\bcomponent\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")


def test_component_matcher_reader() -> None:
    expr = 'up{component=~"scanner|relay"} == 0 or absent(up{component = "ingestor"}) or x{component!="a"}'
    assert _COMPONENT_MATCHER.findall(expr) == [("=~", "scanner|relay"), ("=", "ingestor"), ("!=", "a")]


def test_rules_name_only_scraped_components(rules: list[Rule]) -> None:
    named: dict[str, set[str]] = {}
    for rule in rules:
        values = {value for _, value in _COMPONENT_MATCHER.findall(rule.expr)}
        values |= {rule.labels["component"]} if "component" in rule.labels else set()
        named[rule.name] = {part for value in values for part in value.split("|")}
    unknown = {name: sorted(parts - COMPONENTS) for name, parts in named.items() if parts - COMPONENTS}
    assert not unknown, f"rules naming components that are no scrape target: {unknown}"


def test_every_alert_has_severity_runbook_and_a_firing_unit_test(rules: list[Rule]) -> None:
    alerts = [rule for rule in rules if rule.alert]
    assert alerts
    for rule in alerts:
        severity = rule.labels.get("severity")
        assert severity in SEVERITIES, f"{rule.name}: severity {severity}"
        assert rule.annotations.get("runbook") == f"docs/operations.md#{rule.name.lower()}", rule.name
        assert rule.annotations.get("summary"), f"{rule.name} has no summary"
        assert rule.annotations.get("description"), f"{rule.name} has no description"
        assert rule.duration, f"{rule.name} has no for: duration"
    cases = read_cases(load_yaml(RULE_TESTS))
    named = {case.alertname for case in cases}
    firing = {case.alertname for case in cases if case.fires}
    names = {rule.name for rule in alerts}
    # A case naming no rule passes silently in promtool (it expects nothing and gets nothing).
    assert named <= names, f"unit tests naming unknown alerts: {sorted(named - names)}"
    assert firing == names, f"alerts without a case where they fire: {sorted(names - firing)}"


def test_every_alert_has_its_runbook_section_and_a_row_in_the_deploy_guide(rules: list[Rule]) -> None:
    """The runbook anchors resolve, and docs/deploy.md's table of alerts leaves none out."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    sections = set(re.findall(r"^### (\S+)$", (docs / "operations.md").read_text(), re.MULTILINE))
    rows = set(re.findall(r"^\| `(Scheduler\w+)` \|", (docs / "deploy.md").read_text(), re.MULTILINE))
    names = {rule.name for rule in rules if rule.alert}
    assert not {name.lower() for name in names} - sections, "alerts without a runbook in operations.md"
    assert names == rows, (
        f"deploy.md's alert table: missing {sorted(names - rows)}, extra {sorted(rows - names)}"
    )
