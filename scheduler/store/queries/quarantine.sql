-- name: list_quarantine
-- What the components set aside, newest first; the bytes themselves only when asked for.
select q.id, q.quarantined_at, q.component, q.reason, q.run_id, q.app, q.source_topic, q.source_partition,
       q.source_offset, octet_length(q.original_bytes) as size_bytes,
       case when %(with_bytes)s::bool then q.original_bytes end as original_bytes
  from quarantine q
 where (%(component)s::text is null or q.component = %(component)s::text)
   and (%(app)s::text is null or q.app = %(app)s::text)
   and (%(since)s::timestamptz is null or q.quarantined_at >= %(since)s::timestamptz)
 order by q.quarantined_at desc, q.id desc
 limit %(limit)s::int;
