-- name: delete_expired_history
-- A bounded batch of the history past its retention, in one statement: finished runs (succeeded,
-- skipped, cancelled; dead runs stay, since they are the dead-letter queue until replayed) that
-- ended before the horizon, their attempts, and the schedules those runs leave with no run at all
-- that had finished before the horizon too (a one-shot completed, a schedule deleted), with their
-- keys. The horizon is the database's now() less the retention: every component's clock is the
-- database's. Each app's oldest fires come first, from runs_app_fired, so a batch reads about what
-- it deletes however long the history is (plus the dead and open runs at its old end). SKIP
-- LOCKED keeps concurrent sweepers (one per reconciler) off each other's rows and off rows that
-- another transaction is writing.
with horizon as (
    select now() - make_interval(secs => %(retention_s)s::float8) as cutoff
), expired as (
    select r.id, r.schedule_id
      from horizon h
     cross join apps a
     cross join lateral (
           select r.id, r.schedule_id
             from runs r
            where r.app = a.name
              and r.scheduled_for < h.cutoff
              and r.state in ('succeeded', 'skipped', 'cancelled')
              and coalesce(r.finished_at, r.created_at) < h.cutoff
            order by r.scheduled_for
            limit %(limit)s::int
              for update of r skip locked) r
     limit %(limit)s::int
), runs_gone as (
    delete from runs r
     using expired e
     where r.id = e.id
    returning r.id, r.schedule_id
), attempts_gone as (
    delete from attempts a
     using runs_gone g
     where a.run_id = g.id
    returning 1
), finished_schedules as (
    -- This statement's snapshot still sees the runs it deletes, hence the explicit exclusion.
    select s.id
      from schedules s, horizon h
     where s.id in (select schedule_id from runs_gone)
       and s.state in ('completed', 'cancelled')
       and s.updated_at < h.cutoff
       and not exists (select 1 from runs r
                        where r.schedule_id = s.id
                          and r.id <> all (array(select id from runs_gone)))
       for update of s skip locked
), keys_gone as (
    delete from schedule_keys k
     using finished_schedules f
     where k.schedule_id = f.id
    returning 1
), schedules_gone as (
    delete from schedules s
     using finished_schedules f
     where s.id = f.id
    returning 1
)
select (select count(*) from runs_gone)::int as runs,
       (select count(*) from attempts_gone)::int as attempts,
       (select count(*) from schedules_gone)::int as schedules,
       (select count(*) from keys_gone)::int as keys;
