-- The history retention deletes a deleted (cancelled) schedule once its runs are gone and its cancel
-- is older than the retention. When its last run goes, the cancel is often not that old yet, so it
-- is found later from this index. Only cancelled schedules are in it: a one-shot completing, the
-- pipeline's own write of every immediate job, costs no entry.
create index if not exists schedules_cancelled on schedules (updated_at, id) where state = 'cancelled';
