-- Dead letters whose job could not be decoded have no run to mirror them; they are kept here so
-- `scheduler dlq list` shows them next to the dead runs.
create table dead_letters (
    event_id          text primary key,
    app               text not null,
    cause             text not null,
    error             text not null,
    original_bytes    bytea not null,
    source_topic      text,
    source_partition  integer,
    source_offset     bigint,
    received_at       timestamptz not null default now()
);

create index attempts_event on attempts (event_id) where event_id is not null;

create index runs_buffered on runs (schedule_id) where buffered;

-- The attempt history a job message carries to its dead letter needs the class apart from the text.
alter table attempts add column error_class text;
