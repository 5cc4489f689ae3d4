-- Fewer writes per job (issue 13's profile): a relay now locks its batch's outbox rows for the one
-- transaction that publishes and deletes them, instead of claiming them by status, and it no
-- longer marks runs dispatched.

-- The claim scan's index. The batch is taken in id order by the primary key; the claim columns
-- stay (only relays of earlier versions set them, and their claims are respected until they lapse)
-- but nothing indexes them, which saves an index entry per outbox row.
drop index if exists outbox_claimable;

comment on column runs.dispatched_at is
    'When the current attempt was queued again (a retry, a replay, a redispatch); earlier versions '
    'set it when Kafka acknowledged the job message. Null for a first attempt: its creation is when '
    'it was queued.';
