-- The batches' arrays are sent in binary (%(name)b): in text form psycopg quotes every element
-- with a regular expression, which cost more than the statements themselves on a bulk create.

-- name: decided_sources
-- Messages of the batch that were rejected before (the batch is being replayed after a crash
-- between the database commit and the Kafka offset commit): their decision stands. The caller
-- compares the digest with the message's bytes: a topic recreated after a loss of Kafka's topics
-- starts its offsets again, and a new message at an old rejection's position is not that message.
select r.source_topic as topic, r.source_partition as partition, r.source_offset as "offset",
       sha256(r.original_bytes) as digest, r.source_timestamp_ms as timestamp_ms
  from ingest_rejections r
  join unnest(%(topics)b::text[], %(partitions)b::int[], %(offsets)b::bigint[])
       as m(source_topic, source_partition, source_offset)
       using (source_topic, source_partition, source_offset);

-- name: claim_commands
-- Claims the batch's command ids in one statement. A new id is inserted (claimed = true: this
-- transaction applies it); an id applied before, or being applied by a concurrent transaction
-- (the insert waits for it), is a duplicate: its counter grows and claimed is false. `xmax = 0`
-- holds exactly for rows this statement inserted rather than updated. Copies of one id within the
-- ids given are folded into one claim and counted as duplicates as well (the ingestor gives each
-- run of its batch without a repeated id apart: scheduler/ingest/apply.py). Ids are claimed in
-- sorted order, so that two ingestors whose batches share ids wait for each other instead of
-- deadlocking; a batch claimed in several runs may still deadlock with another, which PostgreSQL
-- ends and the ingestor retries, as any transient failure.
with command as (
    select c.*,
           count(*) over (partition by c.command_id) as copies,
           row_number() over (partition by c.command_id order by c.ord) as nth
      from unnest(%(command_ids)b::text[], %(apps)b::text[], %(keys)b::text[], %(operations)b::text[],
                  %(topics)b::text[], %(partitions)b::int[], %(offsets)b::bigint[])
           with ordinality
           as c(command_id, app, schedule_key, operation, source_topic, source_partition, source_offset, ord)
)
insert into applied_commands (command_id, app, schedule_key, operation, source_topic, source_partition,
                              source_offset, duplicates)
select command_id, app, schedule_key, operation, source_topic, source_partition, source_offset, copies - 1
  from command
 where nth = 1
 order by command_id
on conflict (command_id) do update
   set duplicates = applied_commands.duplicates + excluded.duplicates + 1
returning command_id, (xmax = 0) as claimed;

-- name: unclaim_commands
-- Claimed commands that were rejected after all (unknown key, conflict) are not applied: a producer
-- that resends one later has it judged again.
delete from applied_commands where command_id = any(%(command_ids)b::text[]);

-- name: schedules_by_key
-- The schedules the batch's keys already name, locked so that the batch's decisions (conflict,
-- not found) hold until it commits.
select k.app, k.schedule_key, k.schedule_id
  from schedule_keys k
 where (k.app, k.schedule_key) in (select * from unnest(%(apps)b::text[], %(keys)b::text[]))
 order by k.app, k.schedule_key
   for update of k;

-- name: known_apps
-- The apps a batch names, with the handlers each declares (null: not declared).
select name, handlers from apps where name = any(%(names)b::text[]);

-- name: create_keyed_schedules
-- Every create of a batch in one statement: keys, schedules and their audit rows. A key taken
-- meanwhile by a concurrent transaction is skipped (ON CONFLICT waits for that transaction), and so
-- is its schedule; the caller learns which were created from the ids returned.
with new as (
    select *
      from unnest(%(ids)b::uuid[], %(apps)b::text[], %(keys)b::text[], %(names)b::text[], %(kinds)b::text[],
                  %(crons)b::text[], %(tzs)b::text[], %(run_at)b::timestamptz[], %(start_at)b::timestamptz[],
                  %(end_at)b::timestamptz[], %(handlers)b::text[], %(payloads)b::text[],
                  %(max_attempts)b::int[], %(backoff_base_ms)b::int[], %(backoff_max_ms)b::int[],
                  %(timeout_ms)b::int[], %(misfire_policies)b::text[], %(overlap_policies)b::text[],
                  %(jitter_ms)b::int[], %(next_fire_at)b::timestamptz[], %(actors)b::text[],
                  %(traceparents)b::text[], %(descriptions)b::text[], %(enabled)b::bool[])
           as n(id, app, schedule_key, name, kind, cron, tz, run_at, start_at, end_at, handler, payload,
                max_attempts, backoff_base_ms, backoff_max_ms, timeout_ms, misfire_policy, overlap_policy,
                jitter_ms, next_fire_at, actor, traceparent, description, enabled)
), keyed as (
    insert into schedule_keys (app, schedule_key, schedule_id)
    select app, schedule_key, id from new order by app, schedule_key
    on conflict do nothing
    returning schedule_id
), inserted as (
    insert into schedules (id, app, name, description, kind, cron, tz, run_at, start_at, end_at, handler,
                           payload, max_attempts, backoff_base_ms, backoff_max_ms, timeout_ms,
                           misfire_policy, overlap_policy, jitter_ms, state, next_fire_at, traceparent)
    select n.id, n.app, n.name, n.description, n.kind, n.cron, n.tz, n.run_at, n.start_at, n.end_at,
           n.handler, n.payload::jsonb, n.max_attempts, n.backoff_base_ms, n.backoff_max_ms, n.timeout_ms,
           n.misfire_policy, n.overlap_policy, n.jitter_ms,
           case when n.enabled then 'active' else 'paused' end,
           -- An immediate schedule is due at the database's now, as in insert_schedule.
           coalesce(n.next_fire_at, now()), n.traceparent
      from new n
      join keyed k on k.schedule_id = n.id
    returning *
), audited as (
    insert into audit_log (actor, action, entity, entity_id, old_value, new_value, app)
    select n.actor, 'create', 'schedule', i.id::text, null, to_jsonb(i), i.app
      from inserted i
      join new n on n.id = i.id
)
select id from inserted;

-- name: record_rejections
-- A message already rejected at the same position (a replayed batch) is left as it was and not
-- returned, so its rejection is published once. Other bytes or another timestamp at that position
-- are another message (the topic was recreated, its offsets started again): its rejection replaces
-- the old topic's.
insert into ingest_rejections (code, reason, command_id, schedule_key, app, operation, original_bytes,
                               source_topic, source_partition, source_offset, source_timestamp_ms)
select *
  from unnest(%(codes)b::text[], %(reasons)b::text[], %(command_ids)b::text[], %(keys)b::text[],
              %(apps)b::text[], %(operations)b::text[], %(original_bytes)b::bytea[], %(topics)b::text[],
              %(partitions)b::int[], %(offsets)b::bigint[], %(timestamps)b::bigint[])
on conflict (source_topic, source_partition, source_offset) do update
   set rejected_at = now(), code = excluded.code, reason = excluded.reason,
       command_id = excluded.command_id, schedule_key = excluded.schedule_key, app = excluded.app,
       operation = excluded.operation, original_bytes = excluded.original_bytes,
       source_timestamp_ms = excluded.source_timestamp_ms
 where ingest_rejections.original_bytes <> excluded.original_bytes
    or ingest_rejections.source_timestamp_ms is distinct from excluded.source_timestamp_ms
returning source_topic, source_partition, source_offset, rejected_at;

-- name: list_rejections
select id, rejected_at, code, reason, command_id, schedule_key, app, operation,
       octet_length(original_bytes) as original_size, source_topic, source_partition, source_offset
  from ingest_rejections
 where (%(code)s::text is null or code = %(code)s::text)
   and (%(app)s::text is null or app = %(app)s::text)
 order by rejected_at desc, id desc
 limit %(limit)s::int;
