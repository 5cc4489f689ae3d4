-- name: list_dead
-- Dead runs (mirrored from .dlq or swept), newest first, with the undecodable letters beside them.
select * from (
    select r.id::text as id, 'run' as kind, r.app, r.schedule_id, r.attempt, r.error,
           r.finished_at as dead_at, r.worker
      from runs r
     where r.state = 'dead'
       and (%(app)s::text is null or r.app = %(app)s::text)
       and (%(schedule_id)s::uuid is null or r.schedule_id = %(schedule_id)s::uuid)
       and (%(since)s::timestamptz is null or r.finished_at >= %(since)s::timestamptz)
       and (%(until)s::timestamptz is null or r.finished_at < %(until)s::timestamptz)
    union all
    select d.event_id, 'undecodable', d.app, null, null, d.error, d.received_at, null
      from dead_letters d
     where %(schedule_id)s::uuid is null
       and (%(app)s::text is null or d.app = %(app)s::text)
       and (%(since)s::timestamptz is null or d.received_at >= %(since)s::timestamptz)
       and (%(until)s::timestamptz is null or d.received_at < %(until)s::timestamptz)
) dead
order by dead_at desc nulls last
limit %(limit)s::int;
