-- The app each audit entry concerns, recorded with it: a listing scoped to apps (an API token's,
-- `scheduler audit list --app`) walks that app's entries alone by the index, where it filtered
-- the whole log, newest first, through joins to the entries' schedules and runs, and so read all
-- of it for an app whose entries are few (two million entries of another app: 2.5 s a page).
-- Entries recorded before are given theirs as the listing found it: through the schedule or run
-- they name, else the app they recorded. An entry none of these tells stays null, listed only
-- unscoped (as it was: it matched no app).
alter table audit_log add column app text;

update audit_log a
   set app = coalesce(
           (select s.app from schedules s
             where a.entity = 'schedule' and pg_input_is_valid(a.entity_id, 'uuid')
               and s.id = a.entity_id::uuid),
           (select r.app from runs r
             where a.entity = 'run' and pg_input_is_valid(a.entity_id, 'uuid')
               and r.id = a.entity_id::uuid),
           case when a.entity = 'app' then a.entity_id end,
           a.new_value->>'app',
           a.old_value->>'app');

create index audit_log_app on audit_log (app, id);
