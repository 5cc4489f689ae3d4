-- Every run had an entry in runs_open_by_schedule while open, for the overlap policies' one
-- question: does this schedule have an unfinished run? Only schedules whose policy is not allow
-- ask it, and nearly every run (every one-shot's, every allow cron's) is of a schedule that never
-- does. A run now says whether it is guarded, and only guarded open runs are in the index: an
-- index entry less, about 65 B of WAL, for every other job. This release makes a run guarded when
-- its schedule's policy is not allow (or becomes so while the run is open). The default is true:
-- the runs made before, and those a release before this one makes during a rollout, are all
-- guarded, and counted as they were. The index is built while writes to runs wait: on a large
-- table run it in a quiet moment.
alter table runs add column if not exists guarded boolean not null default true;
create index if not exists runs_guarded_open on runs (schedule_id)
 where guarded and state in ('pending', 'dispatched', 'running', 'retry_wait');
drop index if exists runs_open_by_schedule;
