-- The API (`scheduler run api`): a schedule's description, the pages it lists, and the two tables
-- that every API replica shares, so that limits and idempotency hold across replicas.

alter table schedules add column description text check (char_length(description) <= 2000);

-- ListSchedules pages by (created_at, id) over all apps; per app, schedules_app serves.
create index schedules_created on schedules (created_at, id);

-- One token bucket per principal and rate-limit class. A request takes a token in one statement
-- (refilled first by the time elapsed since the last take, from the database's clock, so every
-- replica refills alike); a refused request writes nothing.
create table api_rate_buckets (
    principal    text not null,
    bucket       text not null,
    tokens       double precision not null,
    refilled_at  timestamptz not null,
    primary key (principal, bucket)
) with (fillfactor = 70);  -- every take is an update of a row: room for HOT updates

-- The first response to each idempotency key, per principal and method, for 24 hours. The row is
-- inserted in the transaction that does the work, so a concurrent duplicate waits on it and then
-- returns the same response; a failed request leaves no row. Expired rows are deleted by the API's
-- retention sweep and, until then, are treated as absent.
create table api_idempotency (
    principal        text not null,
    method           text not null,
    idempotency_key  text not null check (char_length(idempotency_key) between 1 and 200),
    request_hash     text not null,
    response         jsonb,
    created_at       timestamptz not null default now(),
    expires_at       timestamptz not null,
    primary key (principal, method, idempotency_key)
);

create index api_idempotency_expiry on api_idempotency (expires_at);
