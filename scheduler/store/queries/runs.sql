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
        order by r.scheduled_for desc, r.id
        limit %(limit)s::int) r
  join schedules s on s.id = r.schedule_id
 where (%(app)s::text is null or a.name = %(app)s::text)
 order by r.scheduled_for desc, r.id
 limit %(limit)s::int;

-- name: get_run
select * from runs where id = %(id)s::uuid;

-- name: attempts_of_run
select attempt, kind, outcome, worker, started_at, finished_at, error, received_at
  from attempts
 where run_id = %(run_id)s::uuid
 order by received_at, id;
