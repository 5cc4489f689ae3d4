-- name: insert_schedule
insert into schedules (id, app, name, description, kind, cron, tz, run_at, start_at, end_at, handler,
                       payload, max_attempts, backoff_base_ms, backoff_max_ms, timeout_ms, misfire_policy,
                       overlap_policy, jitter_ms, state, next_fire_at, traceparent)
values (%(id)s::uuid, %(app)s::text, %(name)s::text, %(description)s::text, %(kind)s::text, %(cron)s::text,
        %(tz)s::text, %(run_at)s::timestamptz, %(start_at)s::timestamptz, %(end_at)s::timestamptz,
        %(handler)s::text, %(payload)s::jsonb, %(max_attempts)s::int, %(backoff_base_ms)s::int,
        %(backoff_max_ms)s::int, %(timeout_ms)s::int, %(misfire_policy)s::text, %(overlap_policy)s::text,
        %(jitter_ms)s::int,
        -- Paused when created disabled; it keeps its first fire time, judged by its misfire policy
        -- on resume like any paused schedule.
        case when %(enabled)s::bool then 'active' else 'paused' end,
        -- An immediate schedule is due at the database's now, not at a client's clock.
        coalesce(%(next_fire_at)s::timestamptz, now()),
        %(traceparent)s::text)
returning *;

-- name: get_schedule
select * from schedules where id = %(id)s::uuid;

-- name: set_schedule_state
-- Optimistic locking: the update applies only to the version the caller read. The reason a
-- schedule was in error goes with the error state (the audit log keeps it).
update schedules
   set state = %(state)s::text,
       next_fire_at = %(next_fire_at)s::timestamptz,
       error = case when %(state)s::text = 'error' then error end,
       errored_at = case when %(state)s::text = 'error' then errored_at end,
       version = version + 1,
       updated_at = now()
 where id = %(id)s::uuid
   and version = %(version)s::int
returning *;

-- name: replace_schedule_spec
-- An update: every field of the spec replaced at once, on the version the caller read. A schedule
-- in error whose spec now computes is active again; a paused one stays paused.
update schedules
   set name = %(name)s::text,
       description = %(description)s::text,
       kind = %(kind)s::text,
       cron = %(cron)s::text,
       tz = %(tz)s::text,
       run_at = %(run_at)s::timestamptz,
       start_at = %(start_at)s::timestamptz,
       end_at = %(end_at)s::timestamptz,
       handler = %(handler)s::text,
       payload = %(payload)s::jsonb,
       max_attempts = %(max_attempts)s::int,
       backoff_base_ms = %(backoff_base_ms)s::int,
       backoff_max_ms = %(backoff_max_ms)s::int,
       timeout_ms = %(timeout_ms)s::int,
       misfire_policy = %(misfire_policy)s::text,
       overlap_policy = %(overlap_policy)s::text,
       jitter_ms = %(jitter_ms)s::int,
       next_fire_at = coalesce(%(next_fire_at)s::timestamptz, now()),
       state = case when state = 'error' then 'active' else state end,
       error = null,
       errored_at = null,
       version = version + 1,
       updated_at = now()
 where id = %(id)s::uuid
   and version = %(version)s::int
returning *;

-- name: guard_open_runs
-- A schedule whose overlap policy was allow and is no longer: its open runs, made without an
-- entry in runs_guarded_open, are guarded now, so that its next fires see them. A statement of its
-- own, after the schedule's update has locked the schedule: a scanner that made runs of it before
-- has committed them (it held that lock), and one after sees the new policy. The runs are locked
-- in id order, as every statement that waits for run locks does (no deadlock with the reconciler).
-- It reads the schedule's runs by their (schedule_id, scheduled_for) key, once per such update.
with open_run as (
    select id
      from runs
     where schedule_id = %(id)s::uuid
       and not guarded
       and state in ('pending', 'dispatched', 'running', 'retry_wait')
     order by id
       for update
)
update runs r
   set guarded = true
  from open_run o
 where r.id = o.id;

-- name: get_schedule_for_update
-- The schedule, locked as an update of it locks it: two updates wait for each other instead of
-- both holding a share lock and each waiting for the other's (a deadlock).
select * from schedules where id = %(id)s::uuid for no key update;

-- name: get_schedule_for_share
-- The schedule, locked against updates until the transaction ends (its trigger makes a run under
-- the overlap policy it reads).
select * from schedules where id = %(id)s::uuid for share;

-- name: insert_audit
insert into audit_log (actor, action, entity, entity_id, old_value, new_value, app)
values (%(actor)s::text, %(action)s::text, %(entity)s::text, %(entity_id)s::text,
        %(old_value)s::jsonb, %(new_value)s::jsonb, %(app)s::text);

-- name: notify_due
-- Wakes sleeping scanners at once (delivered when the transaction commits).
select pg_notify('scheduler_due', '');

-- name: db_now
select now() as now;

-- name: insert_schedule_key
-- The key of a schedule just created; nothing when the app already has a schedule of that key.
insert into schedule_keys (app, schedule_key, schedule_id)
values (%(app)s::text, %(schedule_key)s::text, %(schedule_id)s::uuid)
on conflict do nothing
returning schedule_key;

-- name: schedule_id_by_key
select schedule_id from schedule_keys where app = %(app)s::text and schedule_key = %(schedule_key)s::text;

-- name: schedule_key
-- A schedule's key, which never changes once it is made.
select schedule_key from schedule_keys where schedule_id = %(id)s::uuid;

-- name: schedule_with_key
select s.*, k.schedule_key
  from schedules s
  left join schedule_keys k on k.schedule_id = s.id
 where s.id = %(id)s::uuid;

-- name: lock_schedule_with_key
-- An update's read: locked, so that a concurrent update merges its fields on this one's result
-- rather than on the row both read (a lost update).
select s.*, k.schedule_key
  from schedules s
  left join schedule_keys k on k.schedule_id = s.id
 where s.id = %(id)s::uuid
   for update of s;

-- name: schedules_with_keys
select s.*, k.schedule_key
  from schedules s
  left join schedule_keys k on k.schedule_id = s.id
 where s.id = any(%(ids)s::uuid[]);

-- name: latest_fire
-- A schedule's latest fire, for a refusal to say what became of a one-shot's (from its unique key):
-- the runs a trigger made, which its audit entries name, are not fires.
select r.id, r.state, r.scheduled_for
  from runs r
 where r.schedule_id = %(id)s::uuid
   and not exists (select 1 from audit_log a
                    where a.entity = 'schedule' and a.entity_id = %(id)s::text and a.action = 'trigger'
                      and a.new_value->>'run_id' = r.id::text)
 order by r.scheduled_for desc
 limit 1;
