-- name: take_rate_token
-- One request's token from its bucket, in one round trip. The bucket refills by rate per second
-- since its last take (the database's clock: every replica refills alike) up to capacity. A request
-- that finds less than a token takes nothing and writes nothing: the second branch then reads the
-- bucket as it stands, so the caller can say when the next token comes.
with taken as (
    insert into api_rate_buckets as b (principal, bucket, tokens, refilled_at)
    values (%(principal)s::text, %(bucket)s::text, %(capacity)s::float8 - 1, clock_timestamp())
    on conflict (principal, bucket) do update
       set tokens = least(%(capacity)s::float8,
                          b.tokens + extract(epoch from clock_timestamp() - b.refilled_at)
                                     * %(rate)s::float8) - 1,
           refilled_at = clock_timestamp()
     where least(%(capacity)s::float8,
                 b.tokens + extract(epoch from clock_timestamp() - b.refilled_at) * %(rate)s::float8) >= 1
    returning b.tokens
)
select true as allowed, tokens from taken
union all
select false, least(%(capacity)s::float8,
                    b.tokens + extract(epoch from clock_timestamp() - b.refilled_at) * %(rate)s::float8)
  from api_rate_buckets b
 where b.principal = %(principal)s::text
   and b.bucket = %(bucket)s::text
   and not exists (select 1 from taken);

-- name: claim_idempotency_key
-- The key for this request, in the transaction that does its work. A row another transaction is
-- inserting makes this one wait until that commits (then nothing is returned: the caller reads the
-- first response) or rolls back (then this one inserts). An expired row not yet swept is taken over.
insert into api_idempotency as i (principal, method, idempotency_key, request_hash, expires_at)
values (%(principal)s::text, %(method)s::text, %(idempotency_key)s::text, %(request_hash)s::text,
        now() + make_interval(secs => %(ttl_s)s::float8))
on conflict (principal, method, idempotency_key) do update
   set request_hash = excluded.request_hash, response = null, created_at = now(),
       expires_at = excluded.expires_at
 where i.expires_at <= now()
returning idempotency_key;

-- name: first_response
select request_hash, response
  from api_idempotency
 where principal = %(principal)s::text
   and method = %(method)s::text
   and idempotency_key = %(idempotency_key)s::text;

-- name: record_response
update api_idempotency
   set response = %(response)s::jsonb
 where principal = %(principal)s::text
   and method = %(method)s::text
   and idempotency_key = %(idempotency_key)s::text;

-- name: delete_expired_idempotency_keys
-- The retention sweep, a bounded batch at a time so that it never holds many locks for long.
delete from api_idempotency
 where ctid = any(array(select ctid from api_idempotency
                         where expires_at <= now()
                         order by expires_at
                         limit %(limit)s::int))
returning 1;

-- name: delete_idle_rate_buckets
-- A bucket untouched for longer than any refill takes is full: dropping it changes nothing.
delete from api_rate_buckets
 where ctid = any(array(select ctid from api_rate_buckets
                         where refilled_at < now() - make_interval(secs => %(idle_s)s::float8)
                         limit %(limit)s::int))
returning 1;

-- name: schedules_page
-- A page of schedules in creation order with their keys, after the cursor's (created_at, id):
-- keyset paging, so a page never repeats or skips a row however many are created or changed
-- meanwhile. `apps` null: any app. Each app's next page is read from schedules_app_created and
-- only those are merged: one index per order is one index entry fewer for every schedule made.
--
-- With `max_bytes` (the API's), the page also ends where its payloads pass it: 500 payloads of a
-- megabyte were an answer of half a gigabyte. `sized` walks the candidates in order, adding up
-- their payloads' JSON text (page_bytes, up to and including the row's), and stops at the first
-- row past the bound, which it returns too, so that the caller knows more follow; after the first
-- row it always takes the second, so that one row over the bound alone is a page of its own with
-- more after it. A walk, not a window: a row's size costs its payload's detoasting and text, so
-- rows past the bound are never measured (a window over 501 payloads of a megabyte took 8.7 s to
-- keep 5). Each step reads its row by primary key from the candidates' ids in an array (a join
-- with the candidates would scan them all at every step). The positions are numbered after the
-- limit: numbered before it, the sort of every app's candidates could not keep only the top ones.
-- Without `max_bytes` (the CLI's lists) nothing is measured and every candidate returned.
with recursive candidate as materialized (
    select s.*, k.schedule_key, row_number() over (order by s.created_at, s.id) as position
      from (select s.id
              from apps a
             cross join lateral (
                   select s.id, s.created_at
                     from schedules s
                    where s.app = a.name
                      and (%(state)s::text is null or s.state = %(state)s::text)
                      and (%(enabled)s::bool is null or (s.state = 'active') = %(enabled)s::bool)
                      and (%(after_created)s::timestamptz is null
                           or (s.created_at, s.id) > (%(after_created)s::timestamptz, %(after_id)s::uuid))
                    order by s.created_at, s.id
                    limit %(limit)s::int) s
             where (%(apps)s::text[] is null or a.name = any(%(apps)s::text[]))
             order by s.created_at, s.id
             limit %(limit)s::int) page
      -- The page's rows and keys only: each app's candidates are read from the index alone, and
      -- only the page's rows from the table (all read and their keys joined, before the limit, a
      -- page over 1,000 apps of 501 schedules took 2.4-4.7 s).
      join schedules s on s.id = page.id
      left join schedule_keys k on k.schedule_id = s.id
), walked as (
    select array_agg(c.id order by c.position) as ids from candidate c where %(max_bytes)s::bigint is not null
), sized (position, page_bytes) as (
    select 1::bigint, (select octet_length(s.payload::text)::bigint from schedules s where s.id = w.ids[1])
      from walked w
     where w.ids is not null
    union all
    select z.position + 1,
           z.page_bytes + (select octet_length(s.payload::text)
                             from schedules s
                            where s.id = (select w.ids[z.position + 1] from walked w))
      from sized z
     where z.position < (select cardinality(w.ids) from walked w)
       and (z.page_bytes <= %(max_bytes)s::bigint or z.position = 1)
)
select c.*, z.page_bytes
  from candidate c
  left join sized z on z.position = c.position
 where %(max_bytes)s::bigint is null or z.position is not null
 order by c.position;

-- name: runs_page
-- A schedule's runs, newest fire first, after the cursor's fire time (unique per schedule).
select r.*
  from runs r
 where r.schedule_id = %(schedule_id)s::uuid
   and (%(before)s::timestamptz is null or r.scheduled_for < %(before)s::timestamptz)
 order by r.scheduled_for desc
 limit %(limit)s::int;

-- name: app_runs_page
-- Runs of the apps in scope (`apps` null: every app), newest fire first, after the cursor's
-- (scheduled_for, id). Each app's next runs come from runs_app_fired, which has that order, and
-- only those are merged, so the history's length does not make a page slower.
select r.*
  from apps a
 cross join lateral (
       select r.*
         from runs r
        where r.app = a.name
          and (%(after_fired)s::timestamptz is null
               or (r.scheduled_for <= %(after_fired)s::timestamptz
                   and (r.scheduled_for < %(after_fired)s::timestamptz or r.id > %(after_id)s::uuid)))
        order by r.scheduled_for desc, r.id
        limit %(limit)s::int) r
 where (%(apps)s::text[] is null or a.name = any(%(apps)s::text[]))
 order by r.scheduled_for desc, r.id
 limit %(limit)s::int;

-- name: app_runs_page_in_state
-- The same page in one state. One statement over the apps in scope, not a loop over every app: a
-- loop lets the planner take a partial index of open runs (not keyed by app) once per app, which on
-- a big table with stale statistics cost seconds a page; this way it picks one plan for the page.
select r.*
  from runs r
 where r.state = %(state)s::text
   -- No index reads state (HOT updates, migration 0015), but a running run always holds a lease and
   -- a retry_wait one its next attempt's time: said so, those few are read from their partial
   -- indexes rather than the whole history.
   and (%(state)s::text is distinct from 'running' or r.lease_expires_at is not null)
   and (%(state)s::text is distinct from 'retry_wait' or r.next_attempt_at is not null)
   and (%(apps)s::text[] is null or r.app = any(%(apps)s::text[]))
   and (%(after_fired)s::timestamptz is null
        or (r.scheduled_for <= %(after_fired)s::timestamptz
            and (r.scheduled_for < %(after_fired)s::timestamptz or r.id > %(after_id)s::uuid)))
 order by r.scheduled_for desc, r.id
 limit %(limit)s::int;

-- name: audit_page
-- Audit entries newest first with the app each concerns (recorded with it: migration 0018),
-- after the cursor's id. `apps` null: any app. With `max_bytes`, the page ends where the entries' old and new values pass it, walked as
-- schedules_page walks its payloads: an entry of a schedule holds its payload.
with recursive candidate as materialized (
    select page.*, row_number() over (order by page.id desc) as position
      from (select a.id, a.at, a.actor, a.action, a.entity, a.entity_id, a.old_value, a.new_value,
                   a.app, k.schedule_key
              from audit_log a
              -- An id that is no uuid (a row written by hand) joins nothing rather than fail the page.
              left join schedules s on s.id = case when a.entity = 'schedule' and pg_input_is_valid(a.entity_id, 'uuid')
                                                   then a.entity_id::uuid end
              -- A schedule's key is not a column of its row (only a single create's entry
              -- recorded it): from the key's own row, which never changes while the schedule lives.
              left join schedule_keys k on k.schedule_id = s.id
             where (%(before_id)s::bigint is null or a.id < %(before_id)s::bigint)
               and (%(entity)s::text is null or a.entity = %(entity)s::text)
               and (%(entity_id)s::text is null or a.entity_id = %(entity_id)s::text)
               and (%(actor)s::text is null or a.actor = %(actor)s::text)
               and (%(since)s::timestamptz is null or a.at >= %(since)s::timestamptz)
               -- Each entry's app, recorded with it: by the index on (app, id), a scoped page reads
               -- the entries of its apps alone, however many other apps have.
               and (%(apps)s::text[] is null or a.app = any(%(apps)s::text[]))
             order by a.id desc
             limit %(limit)s::int) page
), walked as (
    select array_agg(c.id order by c.position) as ids from candidate c where %(max_bytes)s::bigint is not null
), sized (position, page_bytes) as (
    select 1::bigint,
           (select (coalesce(octet_length(e.old_value::text), 0)
                    + coalesce(octet_length(e.new_value::text), 0))::bigint
              from audit_log e
             where e.id = w.ids[1])
      from walked w
     where w.ids is not null
    union all
    select z.position + 1,
           z.page_bytes + (select coalesce(octet_length(e.old_value::text), 0)
                                  + coalesce(octet_length(e.new_value::text), 0)
                             from audit_log e
                            where e.id = (select w.ids[z.position + 1] from walked w))
      from sized z
     where z.position < (select cardinality(w.ids) from walked w)
       and (z.page_bytes <= %(max_bytes)s::bigint or z.position = 1)
)
select c.id, c.at, c.actor, c.action, c.entity, c.entity_id, c.old_value, c.new_value, c.app,
       c.schedule_key, z.page_bytes
  from candidate c
  left join sized z on z.position = c.position
 where %(max_bytes)s::bigint is null or z.position is not null
 order by c.position;
