"""What the API exports on its ``/metrics``: requests by method and outcome, and their latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "scheduler_api_requests_total",
    "API calls by method and outcome (OK, or the error code the client got)",
    ["method", "code"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "scheduler_api_request_duration_seconds",
    "Time from a call's arrival at the application service to its answer",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
JWKS_FETCH_ERRORS = Counter(
    "scheduler_api_jwks_fetch_errors_total",
    "Calls whose token could not be checked because the JWKS URL did not answer (answered UNAVAILABLE)",
    registry=REGISTRY,
)
