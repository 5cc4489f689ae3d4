"""The trace exporter's own log lines are redacted as every other line is: a collector endpoint's
query values (a shared access signature, a function key) never reach the component's log.

docs/operations.md (Logs) promises that every URL query and fragment value is masked. The
component's own line about the endpoint is (``…/v1/traces?sig=***``), but when the collector does
not answer, the OTLP exporter warns of each retry with the request as urllib3 words it, ``Max
retries exceeded with url: /v1/traces?sig=…``: a URL without its scheme, which the redaction does
not take for one."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos_stack import free_port
from tests.e2e.health import cli, cli_json, wait_for_statuses
from tests.support import Component, json_log_lines, wait_for

pytestmark = pytest.mark.e2e

APP = "redacted"
SIGNATURE = "sv2026sigQ7zXk4"
FUNCTION_KEY = "fnkeyR2d9w8LmN"


def test_the_exporters_retry_warnings_do_not_show_the_collector_urls_query_values(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    env = settings_env | {"SCHEDULER_MAX_SCAN_SLEEP": "0.2"}
    cli(env, "init")
    cli(env, "apps", "create", APP)
    # A collector behind a URL that carries its credentials, down (nothing listens on the port).
    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces?sig={SIGNATURE}&code={FUNCTION_KEY}"
    traced = env | {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    ports = {"scanner": free_port(), "relay": free_port()}
    started = [
        Component(name, traced | {"SCHEDULER_METRICS_PORT": str(port)}, tmp_path)
        for name, port in ports.items()
    ]
    try:
        wait_for_statuses(ports, "/ready", 200, 60)
        cli_json(env, "schedules", "create", "--app", APP, "--now", "--handler", "builtin:noop")
        relay = started[1]
        wait_for(
            lambda: "exporting spans batch" in relay.output(), 60, "the exporter to warn of a failed export"
        )
    finally:
        codes = {c.name: c.stop() for c in started}
    assert codes == {"scanner": 0, "relay": 0}
    for component in started:
        lines = json_log_lines(component.output())
        leaked = [line["message"] for line in lines if SIGNATURE in str(line) or FUNCTION_KEY in str(line)]
        assert not leaked, f"the {component.name}'s log shows the collector URL's query values: {leaked}"
