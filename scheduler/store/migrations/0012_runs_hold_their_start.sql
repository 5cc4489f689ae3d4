-- A job's plain course (its start, heartbeats and success) is held by its run's row rather than by
-- a row of `attempts` per event: `attempts` keeps the events that say more than the run does
-- (retries, deaths, stale, duplicate and re-executed ones). That was two rows and two index
-- entries per job, about 500 B of WAL. reconciled_at is when the reconciler last applied an
-- event or a verdict to the run, which the success's `attempts` row used to tell.
alter table runs add column if not exists reconciled_at timestamptz;
