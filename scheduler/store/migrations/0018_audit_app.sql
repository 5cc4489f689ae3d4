-- The app each audit entry concerns, recorded with it: a listing scoped to apps (an API token's,
-- `scheduler audit list --app`) walks that app's entries alone by the index, where it filtered
-- the whole log, newest first, through joins to the entries' schedules and runs, and so read all
-- of it for an app whose entries are few (two million entries of another app: 2.5 s a page).
-- Entries recorded before are given theirs as the listing found it: through the schedule or run
-- they name, else the app they recorded. An entry none of these tells stays null, listed only
-- unscoped (as it was: it matched no app). About 12 s per million entries (docs/deploy.md,
-- Upgrading).
alter table audit_log add column app text;

-- An id that is no uuid (an entry written by hand) names no schedule or run: the case keeps the
-- cast from running on it, which a plain "and" would not promise.
update audit_log a
   set app = coalesce(
           (select s.app from schedules s
             where a.entity = 'schedule'
               and s.id = case when pg_input_is_valid(a.entity_id, 'uuid') then a.entity_id::uuid end),
           (select r.app from runs r
             where a.entity = 'run'
               and r.id = case when pg_input_is_valid(a.entity_id, 'uuid') then a.entity_id::uuid end),
           case when a.entity = 'app' then a.entity_id end,
           a.new_value->>'app',
           a.old_value->>'app');

create index audit_log_app on audit_log (app, id);

-- A writer that does not name the app gets it as the listing found it before: a pod of the release
-- before this one, still running while a rollout replaces it (migrations run first), or an entry
-- written by hand. Every writer of this release names it, so the function is not called for theirs.
create function audit_log_app() returns trigger language plpgsql as $$
declare
    entity_uuid uuid := case when pg_input_is_valid(new.entity_id, 'uuid') then new.entity_id::uuid end;
begin
    new.app := coalesce(
        (select s.app from schedules s where new.entity = 'schedule' and s.id = entity_uuid),
        (select r.app from runs r where new.entity = 'run' and r.id = entity_uuid),
        case when new.entity = 'app' then new.entity_id end,
        new.new_value->>'app',
        new.old_value->>'app');
    return new;
end
$$;

create trigger audit_log_app before insert on audit_log
    for each row when (new.app is null) execute function audit_log_app();
