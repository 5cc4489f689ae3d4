-- Schedules were in two creation-order indexes: (app, created_at) for one app's list and
-- (created_at, id) for every app's. Each is written at a schedule's creation and again when a
-- one-shot completes (that update moves the row out of schedules_due, so it is not a HOT update):
-- two index entries, about 130 B of WAL, per immediate job. One index (app, created_at, id) serves
-- both lists now; every app's is each app's page merged. The retention's walk over every schedule
-- goes by id. On a large table the new index is built while writes to schedules wait: run it in
-- a quiet moment.
create index if not exists schedules_app_created on schedules (app, created_at, id);
drop index if exists schedules_app;
drop index if exists schedules_created;
