-- name: bound_relay_transaction
-- A relay holds its batch's row locks while it publishes. Should it stop answering mid-batch
-- (SIGSTOP, a hung host), the server ends its session after this long, and the locks with it, so
-- another relay takes the rows; a live relay settles its batch well within it.
select set_config('idle_in_transaction_session_timeout', %(timeout_ms)s::text, true);

-- name: lock_outbox
-- Up to %(limit)s publishable rows for one relay, locked until its transaction ends: the relay
-- publishes them and deletes them (or hands them back) in that one transaction, so a batch costs
-- no write but its delete. SKIP LOCKED lets any number of relays take batches side by side, and a
-- relay that dies mid-publish releases its rows with its session. A row is publishable once its
-- available_at (a fire's jitter, a retry's delay) has passed. claimed_until is only ever set by a
-- relay of an earlier version (which claimed by status); its claims are respected until they lapse.
-- age_s counts from when the row became publishable: a jitter or a retry's delay is no lag. A row
-- published before without an answer counts from its creation, its back-offs included; one held
-- for a missing topic (never produced) from its last hand-back, as nothing tells that wait from a
-- jitter (the relay's held-topic metric and alert report it).
-- A batch is bounded in message bytes too (the first row always goes): a thousand messages of a
-- megabyte took the relay past its memory limit, again at every restart. Rows locked beyond the
-- bound are skipped by other relays until this batch's transaction ends, then taken as usual.
with locked as (
    select o.id, o.topic, o.key, o.value, o.headers, o.run_id, o.attempt, o.publish_count,
           extract(epoch from coalesce(%(now)s::timestamptz, now())
                              - case when o.publish_count = 0 and o.available_at > o.created_at
                                     then o.available_at else o.created_at end)::float8 as age_s,
           octet_length(o.value) as value_bytes
      from outbox o
     where (o.available_at is null or o.available_at <= coalesce(%(now)s::timestamptz, now()))
       and (o.claimed_until is null or o.claimed_until < coalesce(%(now)s::timestamptz, now()))
     order by o.id
     limit %(limit)s::int
       for update skip locked
)
select id, topic, key, value, headers, run_id, attempt, publish_count, age_s
  from (select locked.*, sum(value_bytes) over (order by id rows unbounded preceding) - value_bytes as bytes_before
          from locked) l
 where bytes_before < %(max_bytes)s::bigint
 order by id;

-- name: drop_obsolete_republishes
-- Job messages that may have been published before (the relay chooses: Kafka's answer to an
-- earlier publish was lost, or the row is old enough to have been in the batch of a relay whose
-- session the server ended) whose attempt a worker has already started, or that is past: the first
-- copy reached Kafka and ran, so a second copy would only run the job twice. Dropped instead; only
-- job topics' rows, never a dead letter's (whose run is dead by design).
delete from outbox o
 where o.id = any(%(ids)s::bigint[])
   and left(o.topic, length(%(jobs_prefix)s::text)) = %(jobs_prefix)s::text
   and exists (select 1 from runs r
                where r.id = o.run_id and not (r.state = 'pending' and r.attempt = o.attempt))
returning o.id;

-- name: complete_outbox
-- After Kafka acknowledged: the rows go, and nothing else is written. The run stays `pending`
-- until its worker's start event: marking it `dispatched` here cost a second write of every run
-- and its indexes, and made the relay wait on the reconciler's run locks. A row published before
-- without an answer (publish_count) may now be on the topic twice: counted as republished.
with published as (
    delete from outbox
     where id = any(%(ids)s::bigint[])
    returning publish_count
)
select count(*) as published,
       coalesce(sum(publish_count), 0)::int as republished
  from published;

-- name: release_outbox
-- Kafka did not acknowledge these rows for a reason that may pass: they go back at once, the
-- produced ones (%(produced)s) counted in publish_count, since one of them may be on the topic
-- after all. With %(back_off)s (the rest of their batch went through, so Kafka is up) each waits,
-- so that a row that keeps failing is not taken first again by every batch and the rows behind it
-- go first: a produced row 2^(publishes - 1) s, a row never produced (its topic is missing) a
-- quarter of its age, each at least 1 s and at most 30 s. Times here are the statement's, not the
-- transaction's: the batch's transaction began before its publish, which may have taken seconds.
update outbox
   set claimed_until = null,
       claimed_by = null,
       publish_count = publish_count + case when %(produced)s::bool then 1 else 0 end,
       available_at = case when %(back_off)s::bool
                           then coalesce(%(now)s::timestamptz, statement_timestamp())
                                + make_interval(secs => least(30, greatest(1, case
                                      when %(produced)s::bool then power(2, greatest(publish_count, 0))
                                      else extract(epoch from coalesce(%(now)s::timestamptz, statement_timestamp())
                                                              - created_at) / 4 end))::float8)
                           else available_at end
 where id = any(%(ids)s::bigint[]);

-- name: quarantine_outbox
-- Rows Kafka refuses for good (too large, invalid: the message's own fault): each leaves the
-- outbox for `quarantine` with its reason and bytes, and its run, if it is still waiting for this
-- message (pending at the row's attempt), is dead with the reason, recorded in `attempts` as the
-- sweeper records its verdicts. One statement, one transaction: a row is never both quarantined
-- and still queued, and the rows behind it are not held up. A row of a dead run (a dead letter)
-- leaves its run as it is.
with refused as (
    select id, reason
      from unnest(%(ids)s::bigint[], %(reasons)s::text[]) as r(id, reason)
), removed as (
    delete from outbox o
     using refused f
     where o.id = f.id
    returning o.id, o.topic, o.value, o.run_id, o.attempt, f.reason
), locked as (
    -- Locked in id order, as the reconciler locks them: never a deadlock.
    select r.id
      from runs r
     where r.id = any(array(select run_id from removed))
     order by r.id
       for update
), died as (
    update runs r
       set state = 'dead',
           finished_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
           next_attempt_at = null,
           lease_expires_at = null,
           error = 'RelayRefused: ' || q.reason,
           version = r.version + 1
      from removed q
     where r.id = any(array(select id from locked))
       and r.id = q.run_id and r.attempt = q.attempt and r.state = 'pending'
    returning r.id, r.attempt, q.reason
), quarantined as (
    insert into quarantine (quarantined_at, component, reason, run_id, app, original_bytes)
    select coalesce(%(now)s::timestamptz, statement_timestamp()), 'relay', q.reason, q.run_id, r.app, q.value
      from removed q
      left join runs r on r.id = q.run_id
), recorded as (
    insert into attempts (run_id, attempt, kind, outcome, worker, finished_at, error, error_class)
    select id, attempt, 'dead', 'applied', 'relay', coalesce(%(now)s::timestamptz, statement_timestamp()), reason, 'RelayRefused'
      from died
), notified as (
    -- A run that ended wakes the buffer release (a buffered fire of its schedule may go now).
    select pg_notify('scheduler_run_finished', '') from (select 1 from died limit 1) one
)
select (select count(*) from removed) as quarantined,
       (select count(*) from died) as dead,
       (select count(*) from notified) as notified;

-- name: outbox_next_available
-- How long until the first row held back by its available_at may be taken (null: none is), so
-- an idle relay wakes for it rather than at its next poll.
select extract(epoch from min(available_at) - coalesce(%(now)s::timestamptz, now()))::float8 as wait_s
  from outbox
 where available_at > coalesce(%(now)s::timestamptz, now());

-- name: outbox_stats
-- For the relay's gauges: how many rows wait, and how long the longest-waiting publishable row has,
-- counted as lock_outbox counts age_s: a row held back on purpose (a fire's jitter, a retry's
-- delay) waits from its available_at, and is no wait at all before it; a row published before
-- without an answer waits from its creation, back-offs included. Both read the whole outbox, so
-- they are taken every few seconds, not per batch.
select count(*) as depth,
       coalesce(extract(epoch from now() - min(case when publish_count = 0 and available_at > created_at
                                                    then available_at else created_at end)
                                           filter (where publish_count > 0 or available_at is null
                                                         or available_at <= now())), 0)::float8
           as oldest_age_s
  from outbox;

-- name: outbox_topic_apps
-- Of the job topics the cluster does not have, those whose app exists, with its partitions: the
-- relay creates them (an app committed while Kafka was down, a topic deleted by mistake).
select %(jobs_prefix)s::text || name as topic, partitions
  from apps
 where %(jobs_prefix)s::text || name = any(%(topics)s::text[]);
