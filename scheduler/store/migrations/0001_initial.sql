-- The data model. PostgreSQL is the source of truth for schedules, runs and delays; Kafka only ever
-- carries copies.

create table apps (
    name        text primary key check (name ~ '^[a-z0-9][a-z0-9-]{0,47}$'),
    partitions  integer not null check (partitions between 1 and 10000),
    created_at  timestamptz not null default now()
);

create table schedules (
    id                uuid primary key,
    app               text not null references apps (name),
    name              text not null check (char_length(name) between 1 and 200),
    kind              text not null check (kind in ('immediate', 'delayed', 'cron')),
    cron              text check (char_length(cron) <= 200),
    tz                text not null default 'UTC',
    run_at            timestamptz,
    start_at          timestamptz,
    end_at            timestamptz,
    handler           text not null check (char_length(handler) between 1 and 300),
    payload           jsonb not null default '{}'::jsonb,
    max_attempts      integer not null default 3 check (max_attempts between 1 and 100),
    backoff_base_ms   integer not null default 1000 check (backoff_base_ms >= 0),
    backoff_max_ms    integer not null default 300000 check (backoff_max_ms >= 0),
    timeout_ms        integer not null default 300000 check (timeout_ms > 0),
    misfire_policy    text not null default 'fire_once'
                      check (misfire_policy in ('fire_once', 'fire_all', 'skip')),
    overlap_policy    text not null default 'allow'
                      check (overlap_policy in ('allow', 'skip', 'buffer_one')),
    jitter_ms         integer not null default 0 check (jitter_ms >= 0),
    state             text not null default 'active'
                      check (state in ('active', 'paused', 'cancelled', 'completed')),
    next_fire_at      timestamptz,
    version           integer not null default 1,
    created_at        timestamptz not null default now(),
    updated_at        timestamptz not null default now(),
    check ((kind = 'cron') = (cron is not null)),
    check (kind <> 'delayed' or run_at is not null)
);

-- The scanner's only way in: the active schedules ordered by due time. Idle (paused, finished)
-- schedules are not in it, so their number does not slow the scan.
create index schedules_due on schedules (next_fire_at) where state = 'active';
create index schedules_app on schedules (app, created_at);

create table runs (
    id                uuid primary key,
    schedule_id       uuid not null references schedules (id),
    app               text not null,
    scheduled_for     timestamptz not null,
    state             text not null
                      check (state in ('pending', 'dispatched', 'running', 'retry_wait',
                                       'succeeded', 'dead', 'skipped', 'cancelled')),
    attempt           integer not null default 1,
    max_attempts      integer not null,
    lease_expires_at  timestamptz,
    next_attempt_at   timestamptz,
    dispatched_at     timestamptz,
    started_at        timestamptz,
    finished_at       timestamptz,
    worker            text,
    result            jsonb,
    error             text,
    skip_reason       text,
    -- buffer_one overlap: created while the previous run is open, dispatched when that one ends.
    buffered          boolean not null default false,
    created_at        timestamptz not null default now(),
    version           integer not null default 1,
    -- A fire can never be created twice, whatever number of scanners race for it.
    unique (schedule_id, scheduled_for)
);

create index runs_retry_due on runs (next_attempt_at) where state = 'retry_wait';
create index runs_lease_expiry on runs (lease_expires_at) where state in ('dispatched', 'running');
create index runs_open_by_schedule on runs (schedule_id)
    where state in ('pending', 'dispatched', 'running', 'retry_wait');
create index runs_app_created on runs (app, created_at desc);

create table attempts (
    id           bigint generated always as identity primary key,
    run_id       uuid not null,
    attempt      integer not null,
    event_id     text,
    kind         text not null check (kind in ('started', 'heartbeat', 'succeeded', 'retry', 'dead')),
    outcome      text not null check (outcome in ('applied', 'stale', 'duplicate')),
    worker       text,
    started_at   timestamptz,
    finished_at  timestamptz,
    error        text,
    received_at  timestamptz not null default now()
);

create index attempts_run on attempts (run_id, attempt);

-- The transactional outbox. Rows are claimed by status (claimed_until) with SKIP LOCKED, never by
-- "id greater than the last seen": identity values are taken before commit, so a reader that
-- remembers the highest id skips rows of transactions that commit late.
create table outbox (
    id               bigint generated always as identity primary key,
    topic            text not null,
    key              bytea,
    value            bytea not null,
    headers          jsonb not null default '{}'::jsonb,
    run_id           uuid,
    attempt          integer,
    claimed_until    timestamptz,
    claimed_by       text,
    publish_count    integer not null default 0,
    created_at       timestamptz not null default now()
);

create index outbox_claimable on outbox (id) include (claimed_until);

create table audit_log (
    id          bigint generated always as identity primary key,
    at          timestamptz not null default now(),
    actor       text not null,
    action      text not null,
    entity      text not null check (entity in ('app', 'schedule', 'run')),
    entity_id   text not null,
    old_value   jsonb,
    new_value   jsonb
);

create index audit_log_entity on audit_log (entity, entity_id, at);
