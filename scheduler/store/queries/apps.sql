-- name: create_app
-- An app that exists already is left as it is; the caller learns that from an empty result.
insert into apps (name, partitions, handlers)
values (%(name)s::text, %(partitions)s::int, %(handlers)s::text[])
on conflict (name) do nothing
returning name, partitions, handlers, created_at;

-- name: get_app
select name, partitions, handlers, created_at from apps where name = %(name)s::text;

-- name: list_apps
select a.name, a.partitions, a.handlers, a.created_at,
       (select count(*) from schedules s where s.app = a.name and s.state = 'active') as active_schedules,
       (select count(*) from schedules s where s.app = a.name and s.state = 'error') as error_schedules
  from apps a
 order by a.name;

-- name: app_names
-- What `run all` asks every few seconds, for the apps created since it started: the names alone,
-- without the count of each app's schedules that list_apps makes.
select name from apps order by name;

-- name: set_app_handlers
-- Null: the app declares nothing, and whatever its workers registered may be named.
update apps
   set handlers = %(handlers)s::text[]
 where name = %(name)s::text
returning name, partitions, handlers, created_at;
