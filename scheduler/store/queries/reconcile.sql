-- name: apply_outcomes
-- A whole batch of outcome events in one statement. An event counts only if it names the run's
-- current attempt and the run is not terminal (the fencing token); an event seen before is a
-- duplicate. Per run the strongest accepted event of the batch decides the new state (an end
-- beats a retry beats a start or heartbeat).
--
-- What is written where: the run's own row holds its current attempt's applied start and success
-- (worker, started_at, finished_at, result; a heartbeat only renews the lease); `attempts` gets a
-- row for every other event (retries, deaths, stale, duplicate and re-executed ones), so
-- duplicates are counted, never hidden, at one run update per job instead of a row per event.
--
-- An execution is known by its attempt, worker and start instant. A start of an execution already
-- on record (the run's row, a row of its attempt, an earlier start in the batch) is a copy: a
-- duplicate. A start of an attempt that another execution started before is a re-execution (a
-- redelivered job run again), whatever the run; so is an execution known first by its end (a
-- retry or a dead letter, read from their own topics before its start), recorded as a start of
-- its own. Either way the start the run's row held is written out first: every execution stays on
-- record.
with received as (
    select *
      from unnest(%(event_ids)b::text[], %(run_ids)b::uuid[], %(attempts)b::int[], %(kinds)b::text[],
                  %(workers)b::text[], %(started_at)b::timestamptz[], %(finished_at)b::timestamptz[],
                  %(errors)b::text[], %(error_classes)b::text[], %(results)b::jsonb[],
                  %(not_before)b::timestamptz[], %(backoff_ms)b::bigint[], %(first_copies)b::bool[],
                  %(exec_ranks)b::int[], %(copy_ranks)b::int[], %(apps)b::text[])
           with ordinality
           as e(event_id, run_id, attempt, kind, worker, started_at, finished_at, error, error_class,
                result, not_before, backoff_ms, first_copy, exec_rank, copy_rank, app, ord)
), event as (
    -- Each event once; a copy of it later in the same batch is a duplicate. Of one attempt's events
    -- of a kind in the batch, exec_rank numbers the executions by their first event, and copy_rank
    -- one execution's events (a worker announces a start again, with a new id, when Kafka's
    -- answer to the first was lost). The reconciler numbers them (store.reconcile.batch_ranks):
    -- three sorts of the batch here were a fifth of this statement's time, and PostgreSQL is
    -- the one part that does not scale out.
    select e.* from received e where e.first_copy
), run as (
    -- Locked in id order, as every statement that waits for run locks does: no deadlocks.
    -- held_start: the start the row holds for its current attempt, while no row of `attempts`
    -- does: a run started (running, or ended by a success or a cancel). A run waiting for an attempt
    -- has none, whatever started_at still says of the one before; one that ended otherwise has its
    -- start in its end's row.
    select r.id, r.attempt, r.state, r.worker, r.finished_at, r.app,
           case when r.state in ('running', 'succeeded', 'cancelled') then r.started_at end as held_start
      from runs r
     where r.id = any(array(select distinct run_id from event))
     order by r.id
       for update of r
), seen as (
    -- A recorded event, found by the run's key: an event is about one run, which has a few rows.
    select e.event_id
      from event e
     where exists (select 1 from attempts a where a.run_id = e.run_id and a.event_id = e.event_id)
    union all
    -- A start announced again in the same batch.
    select e.event_id
      from event e
     where e.kind = 'started'
       and e.copy_rank > 1
    union all
    -- A copy of what the run's row holds instead of a row, read again (a reconciler that died
    -- before committing its offsets): its attempt's start, or the success that ended it.
    select e.event_id
      from event e
      join run r on r.id = e.run_id
     where e.attempt = r.attempt
       and e.worker is not distinct from r.worker
       and ((e.kind = 'started' and e.started_at = r.held_start)
            or (e.kind = 'succeeded' and e.finished_at = r.finished_at))
    union all
    -- A start of an execution on record in a row of its attempt: its end (a retry, a death), or
    -- a start written out (a re-execution, a lease expiry).
    select e.event_id
      from event e
     where e.kind = 'started'
       and exists (select 1 from attempts a
                    where a.run_id = e.run_id and a.attempt = e.attempt and a.worker = e.worker
                      and a.started_at = e.started_at)
), restarted as (
    -- Evidence that another execution had started the attempt: the start the run's row holds, a
    -- recorded event of that attempt that says when it started, or an earlier start in the batch.
    -- The run's row is looked up in a hashed set, not joined: the planner takes `run` for ten rows
    -- (an array's default estimate) and the starts for one, and joined them in a nested loop over
    -- both, which took 378 of 444 ms for a batch of 1,000 starts and 1,000 successes.
    -- Only the run's own app's starts: another app's is stale (see `accepted`).
    select e.event_id
      from event e
     where e.kind = 'started'
       and e.event_id not in (select event_id from seen)
       and ((e.run_id, e.app) in (select r.id, r.app from run r)) is true
       and (e.exec_rank > 1
            or (e.run_id, e.attempt) in (select r.id, r.attempt from run r where r.held_start is not null)
            or exists (select 1 from attempts a
                        where a.run_id = e.run_id and a.attempt = e.attempt and a.started_at is not null))
), revealed as (
    -- Executions known by an end (or a heartbeat) before their start: of the run's attempt, another
    -- than the one its row holds, with no start of theirs in the batch or on record.
    select distinct e.run_id, e.attempt, e.worker, e.started_at
      from event e
      join run r on r.id = e.run_id
      left join event s
        on s.kind = 'started' and s.run_id = e.run_id and s.attempt = e.attempt and s.worker = e.worker
       and s.started_at = e.started_at
     where e.kind <> 'started'
       and s.event_id is null
       and e.app = r.app
       and e.attempt = r.attempt
       and r.held_start is not null
       and e.started_at is not null
       and (e.worker is distinct from r.worker or e.started_at <> r.held_start)
       and e.event_id not in (select event_id from seen)
       and not exists (select 1 from attempts a
                        where a.run_id = e.run_id and a.attempt = e.attempt and a.worker = e.worker
                          and a.started_at = e.started_at)
), accepted as (
    -- A lookup in a hashed set of the batch's runs, as in `restarted`: a join took 176 of 211 ms
    -- of a batch of 1,000 events under the prepared plan, which takes both for a few rows. `is
    -- true` keeps the test a hashed lookup: a bare `in` would be turned into a join again.
    -- The event's app is its sender's: an app's workers never end, start or retry another app's
    -- runs (junk on one app's topic naming another's run, or a forged job), so such an event is
    -- stale, on record and never applied.
    select e.*
      from event e
     where ((e.run_id, e.attempt, e.app) in (select r.id, r.attempt, r.app from run r
                                              where r.state not in ('succeeded', 'dead', 'skipped', 'cancelled'))) is true
       and e.event_id not in (select event_id from seen)
), decisive as (
    select distinct on (a.run_id) a.*
      from accepted a
     order by a.run_id,
              case a.kind when 'succeeded' then 0 when 'dead' then 0 when 'retry' then 1 else 2 end,
              a.ord desc
), applied as (
    update runs r
       set state = case d.kind when 'succeeded' then 'succeeded' when 'dead' then 'dead'
                               when 'retry' then 'retry_wait' else 'running' end,
           -- The deciding event's execution: its worker and its start, together.
           started_at = coalesce(d.started_at, r.started_at),
           finished_at = case when d.kind in ('succeeded', 'dead') then d.finished_at end,
           worker = d.worker,
           result = case when d.kind = 'succeeded' then d.result else r.result end,
           -- A success has no error (the failed attempts before it keep theirs in `attempts`);
           -- a start or heartbeat keeps the last failure's, shown while the next attempt runs.
           error = case when d.kind in ('retry', 'dead') then d.error_class || ': ' || d.error
                        when d.kind = 'succeeded' then null
                        else r.error end,
           -- The database's clock, never the worker's: the worker says how long to wait (older
           -- workers only say until when), at most the longest backoff a schedule can hold (a
           -- day, MAX_DELAY_MS): an event saying more is junk, and must not park the run for years.
           -- A replay grants a fresh attempt budget, and its retries back off afresh, while the
           -- attempt numbers go on from before it (the fencing token only grows). The worker draws
           -- the wait after attempt n from [0, C(n)], C(n) = min(backoff_max, backoff_base *
           -- 2^(n-1)) (domain/retry.py), so a run replayed after 5 attempts waited up to C(6) = 32
           -- base delays on its first failure. Its draw is scaled to the attempt's place k in the
           -- budget, [0, C(k)]: the same uniform draw on the budget's range. The budget began after
           -- the run's last death (only a replay takes a run back from dead, and every death is on
           -- record in `attempts`); a run that never died keeps the worker's draw. A subquery of
           -- this branch alone, run for a retry's row only: as a CTE joined to the batch, the
           -- prepared plan looped over the batch for every event (41 s for 4,000 retries). The
           -- exponent stops at 62: base (at most a day, 8.64e7 ms) * 2^62 is far past any max and
           -- still a float8, where 2^1000 overflowed.
           next_attempt_at = case when d.kind <> 'retry' then null
                                  when d.backoff_ms is null then least(d.not_before, now() + interval '1 day')
                                  else now() + least(greatest(coalesce(
                                      (select case when c.top_n > 0
                                                   then least(greatest(d.backoff_ms, 0)::float8, c.top_n)
                                                        * c.top_k / c.top_n
                                                   else 0 end
                                         from (select max(a.attempt) as died_at
                                                 from attempts a
                                                where a.run_id = r.id and a.attempt < d.attempt
                                                  and a.kind = 'dead' and a.outcome = 'applied') b
                                         join schedules s on s.id = r.schedule_id
                                        cross join lateral (
                                              select least(s.backoff_max_ms::float8, s.backoff_base_ms
                                                           * power(2::float8, least(d.attempt - 1, 62)))
                                                         as top_n,
                                                     least(s.backoff_max_ms::float8, s.backoff_base_ms
                                                           * power(2::float8,
                                                                   least(d.attempt - b.died_at - 1, 62)))
                                                         as top_k) c
                                        where b.died_at is not null),
                                      d.backoff_ms), 0), 86400000) * interval '1 millisecond' end,
           -- Only a started job holds a lease, renewed by each start and heartbeat; a job that
           -- stopped running holds none.
           lease_expires_at = case when d.kind in ('started', 'heartbeat')
                                   then now() + make_interval(secs => %(lease_window_s)s::float8) end,
           reconciled_at = now(),
           version = r.version + 1
      from decisive d
     where r.id = d.run_id
       -- A start or heartbeat arriving after a retry decision of the same attempt changes nothing.
       and not (d.kind in ('started', 'heartbeat') and r.state = 'retry_wait')
    returning r.id, r.state, r.app
), classified as (
    -- cross_app: sent as another app's than its run's (see `accepted`); counted stale, and kept out
    -- of the run's attempts, which that run's app reads (its text is the other app's).
    select e.*,
           (((e.run_id, e.app) in (select r.id, r.app from run r)) is false
            and (e.run_id in (select r.id from run r)) is true) as cross_app,
           case when e.event_id in (select event_id from seen) or e.ord not in (select ord from event)
                then 'duplicate'
                when e.event_id in (select event_id from restarted) then 'reexecution'
                when e.event_id in (select event_id from accepted) then 'applied'
                else 'stale' end as outcome
      from received e
), reexecuted as (
    select run_id, attempt from classified where outcome = 'reexecution'
    union
    select run_id, attempt from revealed
), recorded as (
    insert into attempts (run_id, attempt, event_id, kind, outcome, worker, started_at, finished_at, error,
                          error_class)
    -- The start the run's row held, before a re-execution of its attempt replaces it there,
    -- unless a row has it already.
    select r.id, r.attempt, null::text, 'started', 'applied', r.worker, r.held_start, null::timestamptz,
           null::text, null::text
      from run r
     where r.held_start is not null
       and (r.id, r.attempt) in (select run_id, attempt from reexecuted)
       and not exists (select 1 from attempts a
                        where a.run_id = r.id and a.attempt = r.attempt and a.kind = 'started'
                          and a.outcome in ('applied', 'reexecution') and a.worker = r.worker
                          and a.started_at = r.held_start)
    union all
    -- An execution known by its end before its start.
    select v.run_id, v.attempt, null::text, 'started', 'reexecution', v.worker, v.started_at,
           null::timestamptz, null::text, null::text
      from revealed v
    union all
    select c.run_id, c.attempt, c.event_id, c.kind, c.outcome, c.worker, c.started_at, c.finished_at,
           c.error, c.error_class
      from classified c
     where not c.cross_app
       and (c.outcome <> 'applied'
        or c.kind in ('retry', 'dead')
        -- An applied first start of an attempt re-executed in this same batch.
        or (c.kind = 'started' and (c.run_id, c.attempt) in (select run_id, attempt from reexecuted)))
)
select (select count(*) from classified where outcome = 'applied') as applied,
       (select count(*) from classified where outcome = 'stale') as stale,
       (select count(*) from classified where outcome = 'duplicate') as duplicate,
       (select count(*) from classified where outcome = 'reexecution')
           + (select count(*) from revealed) as reexecution,
       (select count(*) from applied where state in ('succeeded', 'dead')) as finished,
       array(select app from applied where state = 'dead') as dead_apps,
       (select count(*) from classified where cross_app and outcome = 'stale') as cross_app,
       -- Their ids: such an event is stored nowhere, so its times say nothing of a worker's clock.
       array(select distinct event_id from classified where cross_app) as cross_app_events,
       -- Each event that did not move its run (usually none): what its trace span says it was.
       (select coalesce(jsonb_object_agg(event_id, outcome), '{}') from classified
         where outcome <> 'applied') as not_applied,
       -- The database's clock, which the events' times are checked against (workers' clocks ahead).
       now() as db_now;

-- name: record_undecodable_dead_letters
-- Dead letters without a run (their job could not be decoded) are kept for the DLQ listing, each
-- under its app with the error class and the name its worker gave it (the listing's filter and its
-- worker column); one naming no app
-- there is (forged, or its app deleted) is not kept, and its event id is returned for the caller to
-- quarantine.
with letters as (
    select l.*, exists (select 1 from apps a where a.name = l.app) as app_exists
      from unnest(%(event_ids)b::text[], %(apps)b::text[], %(causes)b::text[], %(errors)b::text[],
                  %(error_classes)b::text[], %(workers)b::text[], %(original_bytes)b::bytea[],
                  %(topics)b::text[], %(partitions)b::int[], %(offsets)b::bigint[])
           as l (event_id, app, cause, error, error_class, worker, original_bytes, source_topic,
                 source_partition, source_offset)
), kept as (
    insert into dead_letters (event_id, app, cause, error, error_class, worker, original_bytes,
                              source_topic, source_partition, source_offset)
    select event_id, app, cause, error, error_class, worker, original_bytes, source_topic,
           source_partition, source_offset
      from letters where app_exists
    on conflict (event_id) do nothing
)
select event_id from letters where not app_exists;

-- name: unswept_dead_letters
-- Only the lease sweeper writes a dead letter without a worker, in the transaction that makes its
-- run dead and records that death (worker 'sweeper', see sweep_expired_leases). The event ids of
-- the letters whose run's attempt has no such record: not the sweeper's (junk, or a producer that
-- is not a worker of this scheduler), for the caller to quarantine. Only the sweeper's own record
-- counts (applied: a stale row a forged letter or a worker named "sweeper" left is none). A letter
-- whose run is not there is passed over, as before: no run is left to its lease, and the history's
-- retention deletes the runs of the sweeper's old letters, which a new consumer group reads again.
select l.event_id
  from unnest(%(event_ids)b::text[], %(run_ids)b::uuid[], %(attempts)b::int[])
       as l (event_id, run_id, attempt)
 where exists (select 1 from runs r where r.id = l.run_id)
   and not exists (select 1 from attempts a
                    where a.run_id = l.run_id and a.attempt = l.attempt and a.kind = 'dead'
                      and a.worker = 'sweeper' and a.outcome = 'applied');

-- name: expired_leases_due
-- Whether any started run's lease has passed, and the database time that answer holds for: the
-- sweeper checks the outcome topics after this, and then sweeps only what had expired by then.
select coalesce(%(now)s::timestamptz, now()) as now,
       exists (select 1 from runs
                where state = 'running' and lease_expires_at < coalesce(%(now)s::timestamptz, now())) as due;

-- name: sweep_expired_leases
-- Started runs whose worker went silent past the lease window (no start event, heartbeat or outcome
-- since): their attempt is over. With attempts left the run waits for its next one, due at once
-- (the sweeper dispatches it in the same transaction); on its last attempt it is dead. Runs that
-- were never started hold no lease: waiting never expires an attempt. Recorded in `attempts` (the
-- start the run's row held first, so the silent worker stays on record), with each run's earlier
-- failed attempts for the next job message's (or the dead letter's) history.
with expired as (
    select r.id, r.attempt, r.max_attempts
      from runs r
     where r.state = 'running'
       and r.lease_expires_at < coalesce(%(now)s::timestamptz, now())
     order by r.lease_expires_at
     limit %(limit)s::int
       for update skip locked
), swept as (
    update runs r
       set state = case when e.attempt >= e.max_attempts then 'dead' else 'retry_wait' end,
           next_attempt_at = case when e.attempt >= e.max_attempts then null
                                  else coalesce(%(now)s::timestamptz, now()) end,
           finished_at = case when e.attempt >= e.max_attempts then coalesce(%(now)s::timestamptz, now()) end,
           lease_expires_at = null,
           error = 'LeaseExpired: ' || %(error)s::text,
           reconciled_at = now(),
           version = r.version + 1
      from expired e
     where r.id = e.id
    returning r.id, r.schedule_id, r.app, r.attempt, r.max_attempts, r.state, r.scheduled_for, r.worker,
              r.started_at
), recorded as (
    insert into attempts (run_id, attempt, kind, outcome, worker, started_at, finished_at, error, error_class)
    select w.id, w.attempt, 'started', 'applied', w.worker, w.started_at, null, null, null
      from swept w
     where w.started_at is not null
       and not exists (select 1 from attempts a
                        where a.run_id = w.id and a.attempt = w.attempt and a.kind = 'started'
                          and a.outcome in ('applied', 'reexecution') and a.worker = w.worker
                          and a.started_at = w.started_at)
    union all
    select id, attempt, case when state = 'dead' then 'dead' else 'retry' end, 'applied', 'sweeper',
           started_at, coalesce(%(now)s::timestamptz, now()), %(error)s::text, 'LeaseExpired'
      from swept
)
select w.id, w.schedule_id, w.app, w.attempt, w.max_attempts, w.state, w.scheduled_for, w.worker,
       w.started_at, s.handler, s.payload, s.timeout_ms, s.backoff_base_ms, s.backoff_max_ms,
       coalesce(%(now)s::timestamptz, now()) as now,
       case when s.kind <> 'cron' then s.traceparent end as creation_traceparent,
       failed_attempt_history(w.id) as history
  from swept w
  join schedules s on s.id = w.schedule_id;

-- name: queue_dead_letters
-- Dead letters the sweeper wrote, published by the relay like any outbox row: in the transaction
-- that made their runs dead, so a letter Kafka refuses now is published later, never lost.
insert into outbox (topic, key, value, headers, run_id, attempt)
select *
  from unnest(%(topics)b::text[], %(keys)b::bytea[], %(values)b::bytea[], %(headers)b::jsonb[],
              %(run_ids)b::uuid[], %(attempts)b::int[]);

-- name: quarantine_messages
-- Outcome messages the reconciler set aside (undecodable, or refused by PostgreSQL), with their
-- bytes and where they were read, so that the messages behind them are applied.
insert into quarantine (component, reason, run_id, app, original_bytes, source_topic, source_partition,
                        source_offset)
select %(component)s::text, q.*
  from unnest(%(reasons)b::text[], %(run_ids)b::uuid[], %(apps)b::text[], %(original_bytes)b::bytea[],
              %(topics)b::text[], %(partitions)b::int[], %(offsets)b::bigint[]) as q;

-- name: release_buffered_runs
-- buffer_one: a waiting fire whose schedule has no unfinished run any more is dispatched now.
select r.id, r.schedule_id, r.scheduled_for, s.id as sid, s.app, s.handler, s.payload, s.timeout_ms,
       s.max_attempts, s.backoff_base_ms, s.backoff_max_ms, now() as now,
       case when s.kind <> 'cron' then s.traceparent end as creation_traceparent
  from runs r
  join schedules s on s.id = r.schedule_id
 where r.buffered
   and r.state = 'pending'
   and not exists (select 1 from runs o
                    where o.guard_schedule_id = r.schedule_id and not o.buffered)
   for update of r skip locked;

-- name: dispatch_buffered_runs
with released as (
    select *
      from unnest(%(ids)b::uuid[], %(topics)b::text[], %(keys)b::bytea[], %(values)b::bytea[],
                  %(headers)b::jsonb[])
           as n(id, topic, key, value, headers)
), moved as (
    update runs r
       -- No lease yet: the run gets one when a worker starts it. dispatched_at: when it was
       -- queued, what a redispatch's cut-off is compared with (its creation may be long before).
       set buffered = false, lease_expires_at = null, dispatched_at = now(), version = r.version + 1
      from released n
     where r.id = n.id and r.buffered
    returning r.id
)
insert into outbox (topic, key, value, headers, run_id, attempt)
select n.topic, n.key, n.value, n.headers, n.id, 1
  from released n
  join moved using (id);

-- name: notify_run_finished
-- Wakes the buffer release as soon as the transaction that ended runs commits.
select pg_notify('scheduler_run_finished', '');
