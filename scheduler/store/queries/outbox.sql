-- name: claim_outbox
-- Claims up to %(limit)s publishable rows for one relay. SKIP LOCKED lets any number of relays
-- claim side by side without waiting on each other; a claim is a status (claimed_until), not a
-- held transaction, so a relay that dies mid-publish only delays its rows until the claim lapses.
update outbox o
   set claimed_until = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(claim_seconds)s::float8),
       claimed_by = %(relay)s::text,
       publish_count = o.publish_count + 1
  from (select id
          from outbox
         where claimed_until is null
            or claimed_until < coalesce(%(now)s::timestamptz, now())
         order by id
         limit %(limit)s::int
           for update skip locked) due
 where o.id = due.id
returning o.id, o.topic, o.key, o.value, o.headers, o.run_id, o.attempt, o.publish_count;
