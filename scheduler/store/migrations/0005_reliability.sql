-- Quarantine instead of crash loops, leases that start with the worker, handlers an app declares.

-- A schedule whose next fire cannot be computed (a zone that no longer loads, an expression a
-- newer library rejects) leaves the scan with its reason instead of stopping it.
alter table schedules drop constraint schedules_state_check;
alter table schedules add constraint schedules_state_check
    check (state in ('active', 'paused', 'cancelled', 'completed', 'error'));
alter table schedules add column error text;
alter table schedules add column errored_at timestamptz;

-- The handlers an app's workers run, when the app declares them; null means not declared, and
-- then only the workers' own registration decides.
alter table apps add column handlers text[];

-- A fire's jitter: its message is not published before this instant (null: at once).
alter table outbox add column available_at timestamptz;

-- Only a run a worker started has a lease (renewed by its start event and heartbeats): time spent
-- waiting in the outbox, on the topic or behind a backlog never expires an attempt.
drop index runs_lease_expiry;
create index runs_lease_expiry on runs (lease_expires_at) where state = 'running';

-- A second start of the same attempt (a redelivery after a worker died or lost its partitions) is
-- a re-execution: recorded as such, so `attempts` counts every execution that really happened.
alter table attempts drop constraint attempts_outcome_check;
alter table attempts add constraint attempts_outcome_check
    check (outcome in ('applied', 'stale', 'duplicate', 'reexecution'));

-- What a component could not process and set aside, with its reason, so that it moves on: an
-- outbox row Kafka refuses, an outcome event PostgreSQL cannot store. Never retried by itself.
create table quarantine (
    id                bigint generated always as identity primary key,
    quarantined_at    timestamptz not null default now(),
    component         text not null,
    reason            text not null,
    run_id            uuid,
    app               text,
    original_bytes    bytea,
    source_topic      text,
    source_partition  integer,
    source_offset     bigint
);

create index quarantine_recent on quarantine (quarantined_at desc, id desc);
