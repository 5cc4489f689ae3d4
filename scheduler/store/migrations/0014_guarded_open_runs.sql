-- Every run had an entry in runs_open_by_schedule while open, for the overlap policies' one
-- question: does this schedule have an unfinished run? Only schedules whose policy is not allow
-- ask it, and nearly every run (every one-shot's, every allow cron's) is of a schedule that never
-- does. A run now says whether it is guarded (its schedule's policy was not allow when it was
-- made, or became so while it was open), and only guarded open runs are in the index: an index
-- entry less, about 65 B of WAL, for every other job.
alter table runs add column if not exists guarded boolean not null default false;
update runs r
   set guarded = true
  from schedules s
 where s.id = r.schedule_id
   and s.overlap_policy <> 'allow'
   and r.state in ('pending', 'dispatched', 'running', 'retry_wait');
create index if not exists runs_guarded_open on runs (schedule_id)
 where guarded and state in ('pending', 'dispatched', 'running', 'retry_wait');
drop index if exists runs_open_by_schedule;
