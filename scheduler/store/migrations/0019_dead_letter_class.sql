-- The error class a worker gave an undecodable job's dead letter (UndecodableMessage), kept beside
-- its text: `dlq list --error-class` (the API's ListDeadLetters) filters these letters by it. The
-- letter's error text has no class before a ':' as a run's error has, so the class the filter read
-- from it was the text itself, and the letter's own class found nothing.
alter table dead_letters add column error_class text;

-- The class of a letter whose writer did not keep it: an undecodable letter (cause 'undecodable')
-- has the one every worker release gives it, UndecodableMessage (worker.py's _dead_undecodable), so
-- that `--error-class UndecodableMessage` finds the letters of before beside those of after; its
-- text, such as "unknown framing (first byte 0xff)", names no class. Any other letter without a run
-- (none a worker writes: forged, or by hand) gets its text's part before a ':', as a run's error.
create function dead_letter_class(cause text, error text) returns text language sql immutable as $$
    select case when cause = 'undecodable' then 'UndecodableMessage' else split_part(error, ':', 1) end
$$;

-- Letters kept before: all written by a reconciler that dropped the class.
update dead_letters set error_class = dead_letter_class(cause, error);

-- A writer that does not name the class gets it the same way: a reconciler of the release before
-- this one, still running while a rollout replaces it (migrations run first), or a row written by
-- hand. Every writer of this release names it, so the function is not called for theirs.
create function dead_letter_error_class() returns trigger language plpgsql as $$
begin
    new.error_class := dead_letter_class(new.cause, new.error);
    return new;
end
$$;

create trigger dead_letter_error_class before insert on dead_letters
    for each row when (new.error_class is null) execute function dead_letter_error_class();

alter table dead_letters alter column error_class set not null;
