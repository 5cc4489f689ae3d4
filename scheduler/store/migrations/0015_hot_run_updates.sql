-- A run's update as it ends (its state, worker, times, result) was never a HOT update: PostgreSQL
-- writes a new entry in every index of the table for an update that changes a column any index
-- reads, its predicate included, and `state` was in three predicates. That was the new version
-- plus an entry in the primary key, the fire key and runs_app_fired: about 520 B of WAL per job.
-- Now no index reads `state`:
-- - the retry and lease indexes hold the rows whose next_attempt_at or lease_expires_at is set
--   (only a run waiting for its retry has the one, only a started run the other; a job that
--   starts and succeeds in one batch of the reconciler changes neither);
-- - the overlap policies' index holds guard_schedule_id, the schedule a run holds back while it
--   is guarded and unfinished (null otherwise, so never changed for the runs of an allow schedule).
--   A generated column, so every release's writes keep it right, this one's and the one before.
-- And `runs` leaves 30 % of each page it fills free, for its own rows' next versions: an update
-- that changes no indexed column is then HOT when the page has room (it has unless many of its
-- rows change in one transaction). The table takes about 1/0.7 of the room for new runs.
-- Adding a stored generated column rewrites the table and rebuilds its indexes while every read
-- and write of runs waits: 8 s per 1,000,000 runs on a 2-core machine. Run it in a
-- quiet moment. The pages written before keep their old fill.
-- Early releases left a lease on runs that ended; the old lease index ignored them by their
-- state, the new one would hold them for good (dead runs are never deleted). A lease means
-- nothing once a run stopped running, nor a next attempt's time once it stopped waiting for one.
update runs set lease_expires_at = null where lease_expires_at is not null and state <> 'running';
update runs set next_attempt_at = null where next_attempt_at is not null and state <> 'retry_wait';
alter table runs add column if not exists guard_schedule_id uuid generated always as (
    case when guarded and state in ('pending', 'dispatched', 'running', 'retry_wait') then schedule_id end
) stored;
drop index if exists runs_guarded_open;
create index runs_guarded_open on runs (guard_schedule_id) where guard_schedule_id is not null;
drop index if exists runs_retry_due;
create index runs_retry_due on runs (next_attempt_at) where next_attempt_at is not null;
drop index if exists runs_lease_expiry;
create index runs_lease_expiry on runs (lease_expires_at) where lease_expires_at is not null;
alter table runs set (fillfactor = 70);
-- The rewrite leaves the new column without statistics, and autovacuum would not gather them soon:
-- without them the overlap check can read the whole table instead of the index.
analyze runs;
