-- name: lease_due_schedules
-- The scanner's lease: due active schedules, oldest first, and those whose next fire comes within
-- the look-ahead (overlap allow only: skip and buffer_one decide at the fire's instant). The range
-- on next_fire_at keeps it on the partial index schedules_due; the policy is a filter on the few
-- rows inside the look-ahead. SKIP LOCKED lets several scanners share the work; the row locks hold
-- until the batch's transaction commits its runs and outbox rows.
-- A batch is bounded in payload bytes too (the first schedule always goes): 500 payloads of a
-- megabyte each took the scanner past its memory limit, again at every restart. The schedules
-- locked beyond the bound stay due, for the next batch.
with leased as (
    select s.*, octet_length(s.payload::text) as payload_bytes
      from schedules s
     where s.state = 'active'
       and s.next_fire_at <= coalesce(%(now)s::timestamptz, now()) + %(lookahead_s)s::float8 * interval '1 second'
       and (s.overlap_policy = 'allow' or s.next_fire_at <= coalesce(%(now)s::timestamptz, now()))
     order by s.next_fire_at
     limit %(limit)s::int
       for update skip locked
)
select l.*, coalesce(%(now)s::timestamptz, now()) as scan_now
  from (select leased.*,
               sum(payload_bytes) over (order by next_fire_at, id rows unbounded preceding)
                   - payload_bytes as bytes_before
          from leased) l
 where l.bytes_before < %(max_bytes)s::bigint
 order by l.next_fire_at;

-- name: open_runs_of
-- For overlap policies: how many unfinished and how many buffered runs each schedule has. Only
-- guarded runs count (those of a schedule whose overlap policy is not allow): guard_schedule_id
-- names the schedule of a guarded unfinished run (runs_guarded_open), and is null for every other.
select guard_schedule_id as schedule_id,
       count(*) filter (where not buffered) as open_runs,
       count(*) filter (where buffered) as buffered_runs
  from runs
 where guard_schedule_id = any(%(schedule_ids)s::uuid[])
 group by guard_schedule_id;

-- name: create_runs
-- One statement for a whole batch: the runs, and an outbox row for each run that was really
-- created and is to be dispatched now. UNIQUE (schedule_id, scheduled_for) makes a fire that
-- another scanner already created a no-op, and its message is dropped with it. A new run has no
-- lease (a worker's start gives it one), and a fire's jitter delays its row's publication.
with candidate as (
    select *
      from unnest(%(ids)b::uuid[], %(schedule_ids)b::uuid[], %(apps)b::text[],
                  %(scheduled_for)b::timestamptz[], %(states)b::text[], %(max_attempts)b::int[],
                  %(skip_reasons)b::text[], %(buffered)b::bool[], %(guarded)b::bool[],
                  %(delay_ms)b::int[],
                  %(topics)b::text[], %(keys)b::bytea[], %(values)b::bytea[], %(headers)b::jsonb[])
           as c(id, schedule_id, app, scheduled_for, state, max_attempts, skip_reason, buffered, guarded,
                delay_ms, topic, key, value, headers)
), created as (
    insert into runs (id, schedule_id, app, scheduled_for, state, attempt, max_attempts,
                      skip_reason, buffered, guarded, finished_at)
    select id, schedule_id, app, scheduled_for, state, 1, max_attempts, skip_reason, buffered, guarded,
           case when state = 'skipped' then now() end
      from candidate
        on conflict (schedule_id, scheduled_for) do nothing
    returning id, state
), queued as (
    insert into outbox (topic, key, value, headers, run_id, attempt, available_at)
    select c.topic, c.key, c.value, c.headers, c.id, 1,
           -- The relay's clock is the database's: the delay counts from this transaction's now.
           case when c.delay_ms > 0 then now() + c.delay_ms * interval '1 millisecond' end
      from candidate c
      join created using (id)
     where c.value is not null
    returning run_id
)
select (select count(*) from created where state <> 'skipped') as created,
       (select count(*) from created where state = 'skipped') as skipped,
       (select count(*) from queued) as queued,
       (select coalesce(array_agg(id), '{}') from created) as ids;

-- name: advance_schedules
-- Not a user's update, so the version stays: a five-second cron must not defeat optimistic locking.
update schedules s
   set next_fire_at = v.next_fire_at,
       state = v.state,
       updated_at = now()
  from unnest(%(ids)b::uuid[], %(next_fire_at)b::timestamptz[], %(states)b::text[])
       as v(id, next_fire_at, state)
 where s.id = v.id;

-- name: set_schedules_error
-- Schedules whose fires could not be computed leave the scan, with the reason, until a user fixes
-- (update) or resumes them. Their next_fire_at stays, so that a resume judges what was missed.
-- Audited, since it changes what a user asked for: the scanner stopped the schedule.
with errored as (
    update schedules s
       set state = 'error',
           error = e.error,
           errored_at = now(),
           updated_at = now()
      from unnest(%(ids)b::uuid[], %(errors)b::text[]) as e(id, error)
     where s.id = e.id
       and s.state = 'active'
    returning s.id, s.app, s.error, s.errored_at
)
insert into audit_log (actor, action, entity, entity_id, old_value, new_value, app)
select 'scanner', 'error', 'schedule', id::text, jsonb_build_object('state', 'active'),
       jsonb_build_object('state', 'error', 'error', error, 'errored_at', errored_at), app
  from errored;

-- name: schedules_in_error
select count(*)::int as n from schedules where state = 'error';

-- name: lease_due_retries
-- Runs whose retry delay has passed, with what the next attempt's message needs: the schedule's
-- settings except its app and max_attempts, which are the run's own (a replay raises the budget).
-- Bounded in payload bytes as lease_due_schedules is.
with leased as (
    select r.*, s.handler, s.payload, s.timeout_ms, s.backoff_base_ms, s.backoff_max_ms,
           octet_length(s.payload::text) as payload_bytes,
           -- A one-shot's attempts continue the trace of its creation, as its first did.
           case when s.kind <> 'cron' then s.traceparent end as creation_traceparent
      from runs r
      join schedules s on s.id = r.schedule_id
     where r.state = 'retry_wait'
       and r.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
     order by r.next_attempt_at
     limit %(limit)s::int
       for update of r skip locked
)
select l.*, coalesce(%(now)s::timestamptz, now()) as scan_now,
       -- The attempts ended so far travel with the job, for the dead letter's history: those that
       -- failed, a death before a replay included (a plain success or start has no row), the
       -- newest 100 of them (migration 0021 says why).
       failed_attempt_history(l.id) as history
  from (select leased.*,
               sum(payload_bytes) over (order by next_attempt_at, id rows unbounded preceding)
                   - payload_bytes as bytes_before
          from leased) l
 where l.bytes_before < %(max_bytes)s::bigint
 order by l.next_attempt_at;

-- name: redispatch_runs
-- The next attempt of each leased retry: a new fencing token and its message in the outbox. Like
-- a new run it has no lease until a worker starts it.
with next_attempt as (
    select *
      from unnest(%(ids)b::uuid[], %(attempts)b::int[],
                  %(topics)b::text[], %(keys)b::bytea[], %(values)b::bytea[], %(headers)b::jsonb[])
           as n(id, attempt, topic, key, value, headers)
), moved as (
    update runs r
       -- dispatched_at: when this attempt was queued, what a redispatch's cut-off is compared with.
       -- started_at is the current attempt's (the one before is in its `attempts` row): a start
       -- of the new attempt is then told from a re-execution by the run's row alone.
       set state = 'pending', attempt = n.attempt, next_attempt_at = null, dispatched_at = now(),
           started_at = null, lease_expires_at = null, version = r.version + 1
      from next_attempt n
     where r.id = n.id and r.state = 'retry_wait' and r.attempt = n.attempt - 1
    returning r.id
)
insert into outbox (topic, key, value, headers, run_id, attempt)
select n.topic, n.key, n.value, n.headers, n.id, n.attempt
  from next_attempt n
  join moved using (id);

-- name: next_due_in
-- Seconds until the scanner has work (null when none): the earliest retry, or the earliest
-- schedule's lease time. That is its next fire for a guarded schedule (skip, buffer_one). For
-- overlap allow it is the first such fire less %(lookahead_s)s plus a slice: the time from that
-- fire to the %(slice_fires)s-th allow fire, held between %(min_slice_s)s and %(max_slice_s)s (the
-- scanner's docstring says why); the scan then leases about that many schedules' fires. Each walk
-- of schedules_due is bounded by scalar subqueries, which the planner takes as index conditions
-- (a bound joined in from another CTE was a join filter, and the walk went on to the end of the
-- index: 216 ms with a million sparse active schedules): the one for the first allow fire reads
-- the look-ahead after the first fire of all, the one for the slice at most the longest slice
-- after that allow fire; both stop at the row they look for, and read the guarded schedules in
-- their stretch on the way.
with first as (
    select min(next_fire_at) as at from schedules where state = 'active'
), allow as (
    select min(s.next_fire_at) as at
      from schedules s
     where s.state = 'active' and s.overlap_policy = 'allow'
       and s.next_fire_at < (select at from first) + %(lookahead_s)s::float8 * interval '1 second'
), slice_end as (
    select s.next_fire_at as at
      from schedules s
     where s.state = 'active' and s.overlap_policy = 'allow'
       and s.next_fire_at >= (select at from allow)
       and s.next_fire_at <= (select at from allow) + %(max_slice_s)s::float8 * interval '1 second'
     order by s.next_fire_at
    offset greatest(%(slice_fires)s::int - 1, 0) limit 1
), allow_due as (
    select a.at - %(lookahead_s)s::float8 * interval '1 second'
           + least(%(max_slice_s)s::float8,
                   greatest(%(min_slice_s)s::float8,
                            coalesce(extract(epoch from (select at from slice_end) - a.at)::float8,
                                     %(max_slice_s)s::float8)))
             * interval '1 second' as at
      from allow a
)
select extract(epoch from least(
           (select at from first),
           (select at from allow_due),
           (select min(next_attempt_at) from runs where state = 'retry_wait'))
       - coalesce(%(now)s::timestamptz, now()))::float8 as seconds;

-- name: notify_outbox
-- Wakes the relays as soon as the batch commits.
select pg_notify('scheduler_outbox', '');
