-- The release of the IANA time zone database (such as 2026a) that the stored next fires of active
-- cron schedules follow. A fire is stored as an instant, computed under the zone rules of the
-- process that computed it; when a scanner starts under newer rules (a tzdata update), it computes
-- those fires again and records its release here, and a process under older rules leaves them be.
-- One row. `version` is null until a scanner of this release records one: the fires stored before
-- were computed under rules nobody recorded. `done_at` is null while a scanner moves the fires to
-- `version` (it records the release first, so that a process with older rules stops writing, and
-- the time it finished last): a scanner under those rules that finds it null does the work again.
create table zone_rules (
    one         boolean primary key default true check (one),
    version     text,
    claimed_at  timestamptz,
    done_at     timestamptz
);

insert into zone_rules (one) values (true);
