-- name: list_dead
-- Dead runs (mirrored from .dlq or swept), newest first, with the undecodable letters beside them;
-- `apps` (the API's scope) null: any app. A run's error class is its error's text before the first
-- ':' (`<error_class>: <error>`, as dead_runs_for_replay reads it); an undecodable letter's is the
-- class on the letter, kept apart (its text has none before a ':').
select * from (
    select r.id::text as id, 'run' as kind, r.app, r.schedule_id, r.attempt, r.error,
           r.finished_at as dead_at, r.worker
      from runs r
     where r.state = 'dead'
       and (%(app)s::text is null or r.app = %(app)s::text)
       and (%(apps)s::text[] is null or r.app = any(%(apps)s::text[]))
       and (%(schedule_id)s::uuid is null or r.schedule_id = %(schedule_id)s::uuid)
       and (%(error_class)s::text is null or split_part(r.error, ':', 1) = %(error_class)s::text)
       and (%(since)s::timestamptz is null or r.finished_at >= %(since)s::timestamptz)
       and (%(until)s::timestamptz is null or r.finished_at < %(until)s::timestamptz)
    union all
    select d.event_id, 'undecodable', d.app, null, null, d.error, d.received_at, d.worker
      from dead_letters d
     where %(schedule_id)s::uuid is null
       and (%(error_class)s::text is null or d.error_class = %(error_class)s::text)
       and (%(app)s::text is null or d.app = %(app)s::text)
       and (%(apps)s::text[] is null or d.app = any(%(apps)s::text[]))
       and (%(since)s::timestamptz is null or d.received_at >= %(since)s::timestamptz)
       and (%(until)s::timestamptz is null or d.received_at < %(until)s::timestamptz)
) dead
order by dead_at desc nulls last
limit %(limit)s::int;

-- name: dead_runs_for_replay
-- Dead runs matching the operator's filters (`run_ids` null: any run), oldest death first, with
-- what their next message needs. Runs of cancelled schedules only when the filters name their
-- schedule or the runs: a cancelled job is not run again by a replay of everything that failed.
-- A run replayed before (audit_log says so) is left out unless forced, and one replayed
-- since replayed_since (by an earlier chunk of the same replay) even then. Locked while the
-- replay of this chunk commits, so two operators cannot replay the same run at once. Bounded in
-- payload bytes after the first run, as the scanner's lease is (the runs beyond stay dead, for the
-- next chunk).
with leased as (
    select r.*, s.handler, s.payload, s.timeout_ms, s.max_attempts as budget, s.backoff_base_ms,
           s.backoff_max_ms, now() as now, octet_length(s.payload::text) as payload_bytes,
           case when s.kind <> 'cron' then s.traceparent end as creation_traceparent
      from runs r
      join schedules s on s.id = r.schedule_id
     where r.state = 'dead'
       and (%(run_ids)s::uuid[] is null or r.id = any(%(run_ids)s::uuid[]))
       and (s.state <> 'cancelled' or %(schedule_id)s::uuid is not null or %(run_ids)s::uuid[] is not null)
       and (%(app)s::text is null or r.app = %(app)s::text)
       and (%(schedule_id)s::uuid is null or r.schedule_id = %(schedule_id)s::uuid)
       and (%(error_class)s::text is null or split_part(r.error, ':', 1) = %(error_class)s::text)
       and (%(since)s::timestamptz is null or r.finished_at >= %(since)s::timestamptz)
       and (%(until)s::timestamptz is null or r.finished_at < %(until)s::timestamptz)
       and not exists (select 1 from audit_log a
                        where a.entity = 'run' and a.entity_id = r.id::text and a.action = 'replay'
                          and (not %(force)s::bool or a.at >= %(replayed_since)s::timestamptz))
     order by r.finished_at, r.id
     limit %(limit)s::int
       for update of r skip locked
)
select l.*,
       -- The attempts ended so far, the deaths a replay takes the run back from included: its
       -- next job message carries them to the dead letter's history, as a retry's does (the
       -- newest 100: a run replayed again and again would outgrow the message, migration 0021).
       failed_attempt_history(l.id) as history
  from (select leased.*,
               sum(payload_bytes) over (order by finished_at, id rows unbounded preceding)
                   - payload_bytes as bytes_before
          from leased) l
 where %(max_bytes)s::bigint is null or l.bytes_before < %(max_bytes)s::bigint
 order by l.finished_at, l.id;

-- name: count_dead_of_cancelled
-- The dead runs dead_runs_for_replay leaves out because their schedule is cancelled (when the
-- filters name neither the schedule nor the runs), for the operator to hear of them.
select count(*)::bigint as left_out
  from runs r
  join schedules s on s.id = r.schedule_id
 where r.state = 'dead'
   and s.state = 'cancelled'
   and %(schedule_id)s::uuid is null
   and %(run_ids)s::uuid[] is null
   and (%(app)s::text is null or r.app = %(app)s::text)
   and (%(error_class)s::text is null or split_part(r.error, ':', 1) = %(error_class)s::text)
   and (%(since)s::timestamptz is null or r.finished_at >= %(since)s::timestamptz)
   and (%(until)s::timestamptz is null or r.finished_at < %(until)s::timestamptz)
   and (%(force)s::bool or not exists (select 1 from audit_log a
                                        where a.entity = 'run' and a.entity_id = r.id::text
                                          and a.action = 'replay'));

-- name: count_dead_replayed_before
-- The dead runs dead_runs_for_replay leaves out, unless forced, because a replay took them before
-- (and they died again), for the operator to hear of them and of --force. Those of cancelled
-- schedules it leaves out anyway are count_dead_of_cancelled's, which counts none of these.
select count(*)::bigint as left_out
  from runs r
  join schedules s on s.id = r.schedule_id
 where r.state = 'dead'
   and not %(force)s::bool
   and (%(run_ids)s::uuid[] is null or r.id = any(%(run_ids)s::uuid[]))
   and (s.state <> 'cancelled' or %(schedule_id)s::uuid is not null or %(run_ids)s::uuid[] is not null)
   and (%(app)s::text is null or r.app = %(app)s::text)
   and (%(schedule_id)s::uuid is null or r.schedule_id = %(schedule_id)s::uuid)
   and (%(error_class)s::text is null or split_part(r.error, ':', 1) = %(error_class)s::text)
   and (%(since)s::timestamptz is null or r.finished_at >= %(since)s::timestamptz)
   and (%(until)s::timestamptz is null or r.finished_at < %(until)s::timestamptz)
   and exists (select 1 from audit_log a
                where a.entity = 'run' and a.entity_id = r.id::text and a.action = 'replay');

-- name: lost_runs_for_redispatch
-- Runs whose job message left the outbox before the cut-off (Kafka acknowledged it) and that no
-- worker ever started: after the topics were lost, their job messages went with them. The relay
-- does not record when it published a run, so the cut-off is compared with when the run's current
-- attempt was queued: dispatched_at for an attempt queued again (a retry, a replay, a redispatch,
-- or Kafka's acknowledgement in earlier versions), else the run's creation. Locked like
-- dead_runs_for_replay.
select r.*, s.handler, s.payload, s.timeout_ms, s.max_attempts as budget, s.backoff_base_ms,
       s.backoff_max_ms, now() as now,
       case when s.kind <> 'cron' then s.traceparent end as creation_traceparent,
       -- The attempts ended so far, which the lost message carried: its copy carries them too.
       failed_attempt_history(r.id) as history
  from runs r
  join schedules s on s.id = r.schedule_id
 where r.state in ('pending', 'dispatched')
   and not r.buffered
   and coalesce(r.dispatched_at, r.created_at) < %(before)s::timestamptz
   and (%(app)s::text is null or r.app = %(app)s::text)
   and not exists (select 1 from outbox o where o.run_id = r.id)
 order by coalesce(r.dispatched_at, r.created_at), r.id
 limit %(limit)s::int
   for update of r skip locked;

-- name: replay_runs
-- Each replayed (dead) or redispatched (lost) run gets a new attempt number (so late outcomes of
-- its old attempts stay fenced off), the attempt budget given, its message in the outbox, and an
-- audit row naming the action.
with replay as (
    select *
      from unnest(%(ids)b::uuid[], %(attempts)b::int[], %(max_attempts)b::int[],
                  %(lease_expires_at)b::timestamptz[], %(topics)b::text[], %(keys)b::bytea[],
                  %(values)b::bytea[], %(headers)b::jsonb[])
           as n(id, attempt, max_attempts, lease_expires_at, topic, key, value, headers)
), previous as (
    -- What each run was before: every part of one statement sees the same snapshot.
    select r.id, r.state from runs r join replay n using (id)
), moved as (
    update runs r
       set state = 'pending', attempt = n.attempt, max_attempts = n.max_attempts,
           -- When this attempt was queued: a redispatch's cut-off is compared with it, so the
           -- same runs are not taken again once their new messages leave the outbox.
           lease_expires_at = n.lease_expires_at, next_attempt_at = null, dispatched_at = now(),
           started_at = null, finished_at = null, worker = null, error = null, version = r.version + 1
      from replay n
     -- Each run was selected and locked (FOR UPDATE) in this transaction as dead, or as lost
     -- (pending or dispatched, its message gone); the guard only keeps any other state out.
     where r.id = n.id and r.state in ('dead', 'pending', 'dispatched')
    returning r.id, r.app, r.attempt
), audited as (
    insert into audit_log (actor, action, entity, entity_id, old_value, new_value, app)
    select %(actor)s::text, %(action)s::text, 'run', m.id::text,
           jsonb_build_object('state', p.state, 'attempt', m.attempt - 1),
           jsonb_build_object('state', 'pending', 'attempt', m.attempt), m.app
      from moved m
      join previous p using (id)
), queued as (
    insert into outbox (topic, key, value, headers, run_id, attempt)
    select n.topic, n.key, n.value, n.headers, n.id, n.attempt
      from replay n
      join moved using (id)
    returning run_id
)
select coalesce(array_agg(run_id order by run_id), '{}') as run_ids from queued;
