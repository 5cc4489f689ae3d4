-- The attempt history a run's next job message carries (and its dead letter after it): the newest
-- 100 attempts that failed, oldest first. Every replay adds up to a budget's worth of failures, and
-- the whole history of a run replayed 40 times after 100 failures each (4,000 errors of about 1 KB)
-- made a 4.3 MB job message, over what the producers send (4 MiB): the relay refused it and the run
-- died again, RelayRefused, at every replay. 100 is what a message carried at most before replays
-- took runs back (the largest budget a schedule takes), and what the sizes in docs/architecture.md
-- count; the older attempts stay in `attempts`, where `scheduler runs get` lists them all. One
-- function, so that the scanner's retries, replays, redispatches and the lease sweeper keep the
-- same bound.
create function failed_attempt_history(run uuid) returns jsonb language sql stable as $$
    select coalesce(jsonb_agg(jsonb_build_object(
               'attempt', a.attempt, 'worker', a.worker, 'started_at', a.started_at,
               'finished_at', a.finished_at, 'error', a.error, 'error_class', a.error_class)
               order by a.attempt), '[]'::jsonb)
      from (select attempt, worker, started_at, finished_at, error, error_class
              from attempts
             where run_id = run and kind in ('retry', 'dead') and outcome = 'applied'
             order by attempt desc
             limit 100) a
$$;
