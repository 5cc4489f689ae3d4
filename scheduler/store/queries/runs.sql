-- name: list_runs
select id, schedule_id, app, scheduled_for, state, attempt, max_attempts, dispatched_at, started_at,
       finished_at, worker, error, skip_reason, lease_expires_at, next_attempt_at, created_at
  from runs
 where (%(schedule_id)s::uuid is null or schedule_id = %(schedule_id)s::uuid)
   and (%(app)s::text is null or app = %(app)s::text)
   and (%(state)s::text is null or state = %(state)s::text)
 order by scheduled_for desc, id
 limit %(limit)s::int;

-- name: get_run
select * from runs where id = %(id)s::uuid;

-- name: attempts_of_run
select attempt, kind, outcome, worker, started_at, finished_at, error, received_at
  from attempts
 where run_id = %(run_id)s::uuid
 order by received_at, id;
