-- Schedules name their zone by the IANA database's names only: `posix/Europe/Berlin` and
-- `right/Europe/Berlin` were accepted before (any file under the zone directories was), and a
-- schedule still naming one would go to state `error` at its next scan. Each is the IANA zone it
-- copies; `right/*` counts leap seconds, which no schedule meant (its summer time is wrong from
-- 2027 on). A schedule in `localtime` (this host's zone, another on the next host) has no such
-- name: it goes to state `error`, listed by `scheduler schedules list --state error`, until
-- `scheduler schedules update ID --tz ZONE` names its zone.
update schedules
   set tz = regexp_replace(tz, '^(posix|right)/', ''),
       version = version + 1,
       updated_at = now()
 where tz ~ '^(posix|right)/'
   and tz not in ('posix/posixrules', 'right/posixrules');  -- no zone of its own: as localtime
