-- The app each audit entry concerns, recorded with it: a listing scoped to apps (an API token's,
-- `scheduler audit list --app`) walks that app's entries alone by the index, where it filtered
-- the whole log, newest first, through joins to the entries' schedules and runs, and so read all
-- of it for an app whose entries are few (two million entries of another app: 2.5 s a page).
-- Entries recorded before are given theirs as the listing found it: through the schedule or run
-- they name, else the app they recorded. An entry none of these tells stays null, listed only
-- unscoped (as it was: it matched no app). About 16 s per million entries (docs/deploy.md,
-- Upgrading).
alter table audit_log add column app text;

-- The app of an entry that does not name it: through the schedule or run it names, else the app
-- it recorded. An id that is no uuid (an entry written by hand) names no schedule or run; the case
-- keeps the cast from running on it, which a plain "and" in a query would not promise.
create function audit_entry_app(entity text, entity_id text, old_value jsonb, new_value jsonb)
    returns text language plpgsql stable as $$
declare
    entity_uuid uuid := case when pg_input_is_valid(entity_id, 'uuid') then entity_id::uuid end;
begin
    return coalesce(
        (select s.app from schedules s where entity = 'schedule' and s.id = entity_uuid),
        (select r.app from runs r where entity = 'run' and r.id = entity_uuid),
        case when entity = 'app' then entity_id end,
        new_value->>'app',
        old_value->>'app');
end
$$;

update audit_log set app = audit_entry_app(entity, entity_id, old_value, new_value);

create index audit_log_app on audit_log (app, id);

-- A writer that does not name the app gets it the same way: a pod of the release before this one,
-- still running while a rollout replaces it (migrations run first), or an entry written by hand.
-- Every writer of this release names it, so the function is not called for theirs.
create function audit_log_app() returns trigger language plpgsql as $$
begin
    new.app := audit_entry_app(new.entity, new.entity_id, new.old_value, new.new_value);
    return new;
end
$$;

create trigger audit_log_app before insert on audit_log
    for each row when (new.app is null) execute function audit_log_app();
