-- name: recorded_zone_rules
-- The release of the zone database the stored next fires follow, whether a scanner finished moving
-- them to it, and the pass under way (scheduler/scan/zone_rules.py): whether its owner renewed its
-- lease in time, and where it stopped.
select version, done_at is not null as done, pass_id, resume_after,
       lease_until is not null and lease_until > now() as leased, lease_until
  from zone_rules;

-- name: claim_zone_rules
-- Records the release a scanner is about to move the fires to, before it moves them: from then on
-- a process under older rules, which sees it, writes nothing. Only if the record is still the one
-- the scanner judged (another scanner may have claimed a release, or finished or renewed the pass,
-- since), and, for the same release, only a pass that is not done and whose lease has run out (its
-- owner stopped): no row when not. A pass taken over keeps its position; a new release starts from
-- the first schedule.
update zone_rules
   set version = %(version)s, pass_id = %(pass_id)s, claimed_at = now(),
       lease_until = now() + %(lease_s)s::float8 * interval '1 second',
       resume_after = case when version = %(version)s then resume_after end,
       done_at = null
 where version is not distinct from %(seen)s
   and pass_id is not distinct from %(seen_pass_id)s
   and (version is distinct from %(version)s
        or (done_at is null and (lease_until is null or lease_until <= now())))
returning resume_after;

-- name: renew_zone_rules_pass
-- A batch's first statement: the pass's lease renewed, with the position of the batches committed
-- before, only while the pass is still this one's. It holds the record until the batch commits, so
-- that a claim of a newer release (or a takeover) waits for the batch, and no batch of a pass that
-- is no longer the record's writes after it. No row: the pass has ended.
update zone_rules
   set lease_until = now() + %(lease_s)s::float8 * interval '1 second', resume_after = %(resume_after)s
 where pass_id = %(pass_id)s and done_at is null
returning version;

-- name: finish_zone_rules
update zone_rules set done_at = now(), lease_until = null where pass_id = %(pass_id)s and done_at is null;

-- name: cron_schedules_after
-- The next ids of active cron schedules whose next fire is after the horizon (see below), by the
-- primary key (keyset): which to compute again next. Not locked: lock_fires_to_recompute locks them.
select id
  from schedules
 where id > %(after)s::uuid and kind = 'cron' and state = 'active'
   and next_fire_at > statement_timestamp() + %(lookahead_s)s::float8 * interval '1 second'
 order by id
 limit %(limit)s::int;

-- name: lock_fires_to_recompute
-- Of those, the ones whose next fire comes after the horizon (the statement's clock plus the
-- scanner's look-ahead), locked. A fire within the horizon may be leased or made already, and is
-- left as it is: computed again from the horizon, no fire made can come back, so nothing fires
-- twice. SKIP LOCKED: a row a scanner's batch or a user's change holds is not waited for; the
-- caller tries those again at the end.
select s.id, s.version, s.cron, s.tz, s.start_at, s.end_at, s.next_fire_at,
       statement_timestamp() + %(lookahead_s)s::float8 * interval '1 second' as horizon
  from schedules s
 where s.id = any(%(ids)s::uuid[])
   and s.kind = 'cron' and s.state = 'active'
   and s.next_fire_at > statement_timestamp() + %(lookahead_s)s::float8 * interval '1 second'
 order by s.id
   for update skip locked;

-- name: move_next_fires
-- The fires computed again, only where the row is as it was read (same version and next fire):
-- not a user's change, so the version stays, as the scanner's advance keeps it. A schedule whose
-- new rules leave it no fire within its end bound is completed, as the scanner completes one.
update schedules s
   set next_fire_at = v.next_fire_at,
       state = v.state,
       updated_at = now()
  from unnest(%(ids)b::uuid[], %(versions)b::int[], %(read_fires)b::timestamptz[],
              %(next_fire_at)b::timestamptz[], %(states)b::text[])
       as v(id, version, read_fire, next_fire_at, state)
 where s.id = v.id
   and s.version = v.version
   and s.next_fire_at = v.read_fire
   and s.state = 'active'
returning s.id;
