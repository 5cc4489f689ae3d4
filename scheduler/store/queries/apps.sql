-- name: create_app
-- An app that exists already is left as it is; the caller learns that from an empty result.
insert into apps (name, partitions)
values (%(name)s::text, %(partitions)s::int)
on conflict (name) do nothing
returning name, partitions, created_at;

-- name: get_app
select name, partitions, created_at from apps where name = %(name)s::text;

-- name: list_apps
select a.name, a.partitions, a.created_at,
       (select count(*) from schedules s where s.app = a.name and s.state = 'active') as active_schedules
  from apps a
 order by a.name;
