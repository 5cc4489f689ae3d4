"""What a component tells its operators beyond metrics: structured logs and OpenTelemetry traces.

``logs`` configures JSON (or human) log lines with the trace and job ids, and redacts secrets and
sensitive keys from anything logged or stored as an error; ``tracing`` configures the OTLP exporter
from the standard ``OTEL_*`` variables and carries the trace context in Kafka message headers.
"""
