-- The Avro command ingestor (`scheduler run ingestor`): client-chosen schedule keys, the command ids
-- already applied (so a resent command is applied once), and every rejected command.

-- A client names a schedule by (app, schedule_key) and never learns its id: every later command for
-- it uses the key. A mapping table rather than a column keeps `schedules` the same for every entry
-- point; schedules made by the CLI simply have no key.
create table schedule_keys (
    app           text not null references apps (name),
    schedule_key  text not null check (char_length(schedule_key) between 1 and 200),
    schedule_id   uuid not null unique references schedules (id),
    created_at    timestamptz not null default now(),
    primary key (app, schedule_key)
);

-- One row per command id the ingestor applied. The ingestor claims a batch's ids here first, in the
-- batch's transaction, so two ingestors that meet the same command (a producer's retry landing on
-- another partition, a rebalance) apply it once: the second waits on the row and then sees it.
-- Replays are counted in `duplicates`, never hidden.
create table applied_commands (
    command_id        text primary key check (char_length(command_id) between 1 and 200),
    app               text not null,
    schedule_key      text not null,
    operation         text not null
                      check (operation in ('create', 'update', 'pause', 'resume', 'cancel', 'trigger')),
    source_topic      text not null,
    source_partition  integer not null,
    source_offset     bigint not null,
    duplicates        integer not null default 0,
    applied_at        timestamptz not null default now()
);

-- Every command the ingestor did not apply, with the bytes as consumed: `scheduler schedules
-- rejected` lists these, and `<prefix>.schedules.rejected` carries the same facts to producers. A
-- message is decided once: its source position is unique, so a batch replayed after a crash neither
-- records nor publishes its rejections twice.
create table ingest_rejections (
    id                bigint generated always as identity primary key,
    rejected_at       timestamptz not null default now(),
    code              text not null check (code in ('undecodable', 'invalid', 'not_found', 'conflict')),
    reason            text not null,
    command_id        text,
    schedule_key      text,
    app               text,
    operation         text,
    original_bytes    bytea not null,
    source_topic      text not null,
    source_partition  integer not null,
    source_offset     bigint not null,
    unique (source_topic, source_partition, source_offset)
);

create index ingest_rejections_recent on ingest_rejections (rejected_at desc, id desc);
