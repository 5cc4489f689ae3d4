-- name: recorded_zone_rules
-- The release of the zone database the stored next fires follow, and whether a scanner finished
-- moving them to it (scheduler/scan/zone_rules.py).
select version, done_at is not null as done from zone_rules;

-- name: claim_zone_rules
-- Records the release a scanner is about to move the fires to, before it moves them: from then on
-- a process under older rules, which sees it, writes nothing. Only if the record is still the one
-- the scanner judged (another scanner may have claimed a release since): no row when it is not.
update zone_rules
   set version = %(version)s, claimed_at = now(), done_at = null
 where version is not distinct from %(seen)s
returning version;

-- name: finish_zone_rules
update zone_rules set done_at = now() where version = %(version)s and done_at is null;

-- name: zone_rules_for_batch
-- A batch's first statement: the record, held (FOR SHARE) until the batch commits, so that a claim
-- of a newer release waits for the batch, and no batch under older rules writes after it.
select version from zone_rules for share;

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
