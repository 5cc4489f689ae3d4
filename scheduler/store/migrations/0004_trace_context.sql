-- The W3C trace context of a schedule's creation (the CLI's, the API's, or a Kafka command's), so
-- that the run of a one-shot schedule continues the trace that created it: one trace from the
-- create call through the relay and the worker to the reconciler. Null: no trace to continue.
alter table schedules add column traceparent text;
