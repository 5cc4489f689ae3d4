-- name: list_runs_of_schedule
-- One schedule's runs, newest fire first: the (schedule_id, scheduled_for) key serves it.
select r.id, r.schedule_id, s.name as schedule_name, r.app, r.scheduled_for, r.state, r.attempt,
       r.max_attempts, r.dispatched_at, r.started_at, r.finished_at, r.worker, r.error, r.skip_reason,
       r.lease_expires_at, r.next_attempt_at, r.created_at
  from runs r
  join schedules s on s.id = r.schedule_id
 where r.schedule_id = %(schedule_id)s::uuid
   and (%(app)s::text is null or r.app = %(app)s::text)
   and (%(state)s::text is null or r.state = %(state)s::text)
 order by r.scheduled_for desc, r.id
 limit %(limit)s::int;

-- name: list_runs
-- Runs of one app or of every app, newest fire first. Each app's newest are read from
-- runs_app_fired and only those are merged, so the history's length (millions of runs) does not
-- make the listing slower, which a sort of the whole table would.
select r.id, r.schedule_id, s.name as schedule_name, r.app, r.scheduled_for, r.state, r.attempt,
       r.max_attempts, r.dispatched_at, r.started_at, r.finished_at, r.worker, r.error, r.skip_reason,
       r.lease_expires_at, r.next_attempt_at, r.created_at
  from apps a
 cross join lateral (
       select r.*
         from runs r
        where r.app = a.name
          and (%(state)s::text is null or r.state = %(state)s::text)
          -- As in app_runs_page_in_state (api.sql): running and retry_wait runs from their indexes.
          and (%(state)s::text is distinct from 'running' or r.lease_expires_at is not null)
          and (%(state)s::text is distinct from 'retry_wait' or r.next_attempt_at is not null)
        order by r.scheduled_for desc, r.id
        limit %(limit)s::int) r
  join schedules s on s.id = r.schedule_id
 where (%(app)s::text is null or a.name = %(app)s::text)
 order by r.scheduled_for desc, r.id
 limit %(limit)s::int;

-- name: get_run
select * from runs where id = %(id)s::uuid;

-- name: states_of_runs
-- The app and state of each run named that exists; an id that names an undecodable dead letter
-- instead (the DLQ listing shows them beside the dead runs) has the state 'undecodable'.
select id, app, state from runs where id = any(%(ids)s::uuid[])
union all
select d.event_id::uuid, d.app, 'undecodable'
  from dead_letters d
 where d.event_id = any(%(ids)s::uuid[]::text[])
   and not exists (select 1 from runs r where r.id = any(%(ids)s::uuid[]) and r.id::text = d.event_id);

-- name: runs_held
-- Of the runs named, those another transaction holds locked now (a replay under way, say), found
-- without waiting for it; the caller rolls back, which frees those this one locked.
select id from runs
 where id = any(%(ids)s::uuid[])
   and id not in (select id from runs where id = any(%(ids)s::uuid[]) for update skip locked);

-- name: history_of_runs
-- Each run's attempts as a user reads them: the events recorded in `attempts`, and the two that
-- the run's own row holds instead of a row (apply_outcomes records only the events that say more
-- than the run does): its current attempt's applied start, while it runs or once it ended by a
-- success or a cancel, and its success. Those are shown unless a row of theirs was recorded (a
-- re-execution writes the start out; rows from before migration 0012). An attempt that ended
-- otherwise shows as its end (a retry, a death), which says when it started; a run waiting for
-- its next attempt has no start of it. received_at orders each run's
-- entries: a held start by when it began, a success by when it was reconciled.
select h.run_id, h.attempt, h.kind, h.outcome, h.worker, h.started_at, h.finished_at, h.error, h.received_at
  from (select a.run_id, a.attempt, a.kind, a.outcome, a.worker, a.started_at, a.finished_at, a.error,
               a.received_at, a.id
          from attempts a
         where a.run_id = any(%(run_ids)s::uuid[])
        union all
        select r.id, r.attempt, 'started', 'applied', r.worker, r.started_at, null, null, r.started_at, 0
          from runs r
         where r.id = any(%(run_ids)s::uuid[])
           and r.started_at is not null
           and r.state in ('running', 'succeeded', 'cancelled')
           and not exists (select 1 from attempts a
                            where a.run_id = r.id and a.attempt = r.attempt and a.kind = 'started'
                              and a.outcome in ('applied', 'reexecution')
                              and a.worker is not distinct from r.worker and a.started_at = r.started_at)
        union all
        select r.id, r.attempt, 'succeeded', 'applied', r.worker, r.started_at, r.finished_at, null,
               coalesce(r.reconciled_at, r.finished_at), 0
          from runs r
         where r.id = any(%(run_ids)s::uuid[])
           and r.state = 'succeeded'
           and not exists (select 1 from attempts a
                            where a.run_id = r.id and a.attempt = r.attempt and a.kind = 'succeeded'
                              and a.outcome = 'applied')) h
 order by h.run_id, h.received_at, h.id;
