-- A rejected command's Kafka timestamp, beside its position and bytes. After a loss of Kafka's
-- topics the commands topic is recreated and its offsets start again at 0; the same input produced
-- again puts the same bytes at the same positions. Only the timestamp tells that message from the
-- one rejected there before (a batch read again after a crash has the same one). Null for rows
-- recorded before this column, and for messages without a timestamp: those compare by bytes alone.
alter table ingest_rejections add column source_timestamp_ms bigint;
