-- Every schedule has a key, so that Kafka commands (which address schedules by app and key) can
-- reach any schedule, whichever way it was created. Schedules created before keys were given to
-- the CLI's get their id as their key; from now on the CLI and the API store the key they are
-- given, or the id.
insert into schedule_keys (app, schedule_key, schedule_id)
select s.app, s.id::text, s.id
  from schedules s
 where not exists (select 1 from schedule_keys k where k.schedule_id = s.id)
on conflict do nothing;
