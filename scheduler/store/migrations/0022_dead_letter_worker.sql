-- The worker that read an undecodable job and wrote its dead letter (the letter's `worker`, as a
-- run's is in runs.worker): `dlq list` and the API's ListDeadLetters showed none for these letters,
-- which leaves an operator nothing to find the worker's log by. Null for the letters kept before
-- (their reconciler dropped it) and for those an older reconciler keeps during a rollout.
alter table dead_letters add column worker text;
