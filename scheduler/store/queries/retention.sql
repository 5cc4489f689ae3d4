-- The history's retention (scheduler/reconcile/retention.py). The horizon is always the database's
-- now() less the retention, as every component's clock is the database's.

-- name: expired_runs
-- The oldest finished runs (succeeded, skipped, cancelled; dead runs stay, since they are the
-- dead-letter queue until replayed) that ended before the horizon, locked for the batch that
-- deletes them. Each app's oldest fires come from runs_app_fired, and only the batch's own are
-- locked, after the apps' are merged (locking every app's candidates would write a row lock for
-- each); twice the batch are candidates, so that a second sweeper finds the next batch while the
-- first holds its own. %(after)s, where the previous batch of a back-to-back series stopped, keeps a series from
-- reading again the runs it keeps at the history's old end (dead and open ones). %(skip)s are runs
-- PostgreSQL refused to delete. SKIP LOCKED keeps concurrent sweepers (one per reconciler) off each
-- other's rows and off rows another transaction is writing; a finished run never changes again,
-- and its conditions are checked once more on the locked row.
with oldest as (
    select r.id, r.scheduled_for
      from apps a
     cross join lateral (
           select r.id, r.scheduled_for
             from runs r
            where r.app = a.name
              and r.scheduled_for < now() - make_interval(secs => %(retention_s)s::float8)
              and (%(after)s::timestamptz is null or r.scheduled_for >= %(after)s::timestamptz)
              and r.state in ('succeeded', 'skipped', 'cancelled')
              and coalesce(r.finished_at, r.created_at) < now() - make_interval(secs => %(retention_s)s::float8)
              and r.id <> all(%(skip)s::uuid[])
            order by r.scheduled_for
            limit 2 * %(limit)s::int) r
     order by r.scheduled_for
     limit 2 * %(limit)s::int
)
select r.id, r.scheduled_for
  from runs r
 where r.id = any(array(select id from oldest))
   and r.state in ('succeeded', 'skipped', 'cancelled')
 order by r.scheduled_for
 limit %(limit)s::int
   for update of r skip locked;

-- name: delete_runs
-- Runs the batch locked, with their attempts (found by the attempts key, which starts with the
-- run); the schedules they belonged to are judged next, in the same transaction.
with runs_gone as (
    delete from runs
     where id = any(%(ids)s::uuid[])
    returning id, schedule_id
), attempts_gone as (
    delete from attempts
     where run_id = any(array(select id from runs_gone))
    returning 1
)
select (select count(*) from runs_gone)::int as runs,
       (select count(*) from attempts_gone)::int as attempts,
       array(select distinct schedule_id from runs_gone) as schedule_ids;

-- name: cancelled_schedules_after
-- Deleted schedules whose cancel is older than the horizon, oldest cancel first, after a position
-- (schedules_cancelled): those whose runs went before their cancel was old enough, and those that
-- never fired, which no deleted run leads to.
select id, updated_at
  from schedules
 where state = 'cancelled'
   and updated_at < now() - make_interval(secs => %(retention_s)s::float8)
   and (updated_at, id) > (%(updated_at)s::timestamptz, %(id)s::uuid)
 order by updated_at, id
 limit %(limit)s::int;

-- name: schedules_after
-- A page of every schedule in id order (the primary key), the backstop for the rare finished
-- schedule neither a deleted run nor its cancel leads to (a one-shot whose key the ingestor held
-- when its run went, a completed cron whose last runs two replicas deleted side by side). It comes
-- round once per table's worth of pages.
select id
  from schedules
 where id > %(id)s::uuid
 order by id
 limit %(limit)s::int;

-- name: delete_finished_schedules
-- Of %(ids)s, the finished schedules (completed, cancelled) unchanged since before the horizon
-- that have no run left, with their keys. A key is locked before its schedule, in the order the
-- ingestor and the API lock them, and both with SKIP LOCKED: a schedule someone is working on
-- waits for a later look instead of making anyone wait.
with candidate as (
    select s.id
      from schedules s
     where s.id = any(%(ids)s::uuid[])
       and s.state in ('completed', 'cancelled')
       and s.updated_at < now() - make_interval(secs => %(retention_s)s::float8)
       and not exists (select 1 from runs r where r.schedule_id = s.id)
), key_locked as (
    select k.schedule_id
      from schedule_keys k
     where k.schedule_id = any(array(select id from candidate))
       for update skip locked
), finished as (
    select s.id
      from schedules s
     where s.id = any(array(select id from candidate))
       and (s.id = any(array(select schedule_id from key_locked))
            or not exists (select 1 from schedule_keys k where k.schedule_id = s.id))
       for update skip locked
), keys_gone as (
    delete from schedule_keys
     where schedule_id = any(array(select id from finished))
    returning 1
), schedules_gone as (
    delete from schedules
     where id = any(array(select id from finished))
    returning 1
)
select (select count(*) from schedules_gone)::int as schedules,
       (select count(*) from keys_gone)::int as keys;
