-- Every result event is a row of `attempts`, two per job at least (its start and its end), and each
-- row paid three index entries: the identity key, (run_id, attempt) and event_id. Everything that
-- reads the table starts from a run (its history, duplicate and re-execution checks, the API and
-- CLI), so one key on (run_id, id) serves every reader, event ids included (a run has a handful of
-- rows), and each row costs one index entry. On a large table this rebuilds the key while holding
-- writes to attempts: run it in a quiet moment.
alter table attempts drop constraint attempts_pkey;
alter table attempts add primary key (run_id, id);
drop index if exists attempts_run;
drop index if exists attempts_event;
