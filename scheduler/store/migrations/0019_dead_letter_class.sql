-- The error class a worker gave an undecodable job's dead letter (UndecodableMessage), kept beside
-- its text: `dlq list --error-class` (the API's ListDeadLetters) filters these letters by it. The
-- letter's error text has no class before a ':' as a run's error has, so the class the filter read
-- from it was the text itself, and the letter's own class found nothing. Letters kept before get
-- the class the filter read from their text until now, so a filter that found them still does.
alter table dead_letters add column error_class text;

update dead_letters set error_class = split_part(error, ':', 1);

-- A writer that does not name the class gets it the same way: a reconciler of the release before
-- this one, still running while a rollout replaces it (migrations run first), or a row written by
-- hand. Every writer of this release names it, so the function is not called for theirs.
create function dead_letter_error_class() returns trigger language plpgsql as $$
begin
    new.error_class := split_part(new.error, ':', 1);
    return new;
end
$$;

create trigger dead_letter_error_class before insert on dead_letters
    for each row when (new.error_class is null) execute function dead_letter_error_class();

alter table dead_letters alter column error_class set not null;
