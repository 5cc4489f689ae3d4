-- The release of the IANA time zone database (such as 2026a) that the stored next fires of active
-- cron schedules follow. A fire is stored as an instant, computed under the zone rules of the
-- process that computed it; when a scanner starts under newer rules (a tzdata update), it computes
-- those fires again and records its release here, and a process under older rules leaves them be.
-- One row. `version` is null until a scanner of this release records one: the fires stored before
-- were computed under rules nobody recorded. `done_at` is null while a scanner moves the fires to
-- `version` (it records the release first, so that a process with older rules stops writing, and
-- the time it finished last).
--
-- One pass per release, whatever the number of scanners: `pass_id` names the pass (a claim gives a
-- new one), and its scanner renews `lease_until` with each batch, storing in `resume_after` the
-- schedule id up to which the batches it committed moved every fire (the keyset's position). A
-- scanner under the same rules that finds the pass under way leaves it to its owner while the lease
-- holds; once it has run out (no batch for its length: the owner stopped), it takes the pass over,
-- from `resume_after`.
create table zone_rules (
    one           boolean primary key default true check (one),
    version       text,
    pass_id       uuid,
    claimed_at    timestamptz,
    lease_until   timestamptz,
    resume_after  uuid,
    done_at       timestamptz
);

insert into zone_rules (one) values (true);
