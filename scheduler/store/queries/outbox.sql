-- name: claim_outbox
-- Claims up to %(limit)s publishable rows for one relay. SKIP LOCKED lets any number of relays
-- claim side by side without waiting on each other; a claim is a status (claimed_until), not a
-- held transaction, so a relay that dies mid-publish only delays its rows until the claim lapses.
-- The ids are collected once (array of a subquery, an init plan): as a joined subquery the
-- planner may re-run the locking scan for every outbox row, which stalls a large burst.
update outbox o
   set claimed_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(claim_seconds)s::float8),
       claimed_by = %(relay)s::text,
       publish_count = o.publish_count + 1
 where o.id = any(array(
           select id
             from outbox
            where claimed_until is null
               or claimed_until < coalesce(%(now)s::timestamptz, now())
            order by id
            limit %(limit)s::int
              for update skip locked))
returning o.id, o.topic, o.key, o.value, o.headers, o.run_id, o.attempt, o.publish_count,
          extract(epoch from coalesce(%(now)s::timestamptz, now()) - o.created_at)::float8 as age_s;

-- name: complete_outbox
-- After Kafka acknowledged: remove the rows this relay still holds and mark their runs dispatched.
-- A row whose claim lapsed and was taken by another relay is left to that relay (it republishes,
-- and publish_count records the duplicate).
with published as (
    delete from outbox
     where id = any(%(ids)s::bigint[])
       and claimed_by = %(relay)s::text
    returning run_id, attempt, publish_count
), locked as (
    -- Locked in id order, as the reconciler locks them: a relay and a reconciler never deadlock.
    -- By primary key (array of a subquery), whatever the statistics say about `published`.
    select r.id
      from runs r
     where r.id = any(array(select run_id from published))
     order by r.id
       for update
), dispatched as (
    update runs r
       set state = 'dispatched',
           dispatched_at = coalesce(%(now)s::timestamptz, now()),
           version = r.version + 1
      from published p
     where r.id = any(array(select id from locked))
       and r.id = p.run_id and r.attempt = p.attempt and r.state = 'pending'
    returning r.id
)
select (select count(*) from published) as published,
       (select coalesce(sum(publish_count - 1), 0) from published)::int as republished,
       (select count(*) from dispatched) as dispatched;

-- name: release_outbox
-- Kafka refused the batch: hand the rows back at once instead of waiting for the claim to lapse.
update outbox
   set claimed_until = null, claimed_by = null
 where id = any(%(ids)s::bigint[])
   and claimed_by = %(relay)s::text;

-- name: outbox_stats
-- For the relay's gauges: how many rows wait, and how long the oldest has. The count is exact, so
-- it is taken every few seconds, not per batch; the oldest row is the first by id (the index).
select (select count(*) from outbox) as depth,
       coalesce(extract(epoch from now() - (select created_at from outbox order by id limit 1)), 0)::float8
           as oldest_age_s;
