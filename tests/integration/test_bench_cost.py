"""bench/cost.py's probe counts what the measured system did in its database between the start and
the end of a run: not the probe's own reads, nor what the system's processes go on doing while the
probe waits for the statistics an idle backend reports late (up to 10 s)."""

from __future__ import annotations

import threading

import psycopg

from bench.cost import CostProbe, Watcher

RUN = 40


def test_a_runs_statements_and_transactions_are_only_the_runs_own(database_url: str) -> None:
    probe = CostProbe(database_url)
    stop = threading.Event()
    with (
        psycopg.connect(database_url, autocommit=True) as system,
        psycopg.connect(database_url, autocommit=True) as poller,
    ):

        def idle_polling() -> None:
            # What a pipeline's processes do once the run is over: a look at a table now and then.
            # (A backend reports a transaction that read no table only with its next that did.)
            while not stop.wait(1.0):
                poller.execute("select count(*) from pg_namespace")

        probe.start()
        for _ in range(RUN):
            system.execute("select count(*) from pg_class")
        idle = threading.Thread(target=idle_polling)
        idle.start()
        try:
            cost = probe.finish(RUN)
        finally:
            stop.set()
            idle.join()
    # The run's 40 transactions, one statement each. What the polling did meanwhile is taken out at
    # the rate it goes on at afterwards: within a few, as each backend reports about once a second
    # (and autovacuum's visits to the database add a few now and then). Counted in, the polling
    # and the probe's own reads were about 20 more.
    assert RUN - 8 <= cost["transactions"] <= RUN + 8, cost
    assert cost["statements_per_job"] == 1.0, cost["top_statements"]


def test_the_polling_for_the_end_of_a_run_is_not_counted_as_the_runs(database_url: str) -> None:
    probe = CostProbe(database_url)
    with psycopg.connect(database_url, autocommit=True) as system, Watcher(database_url) as watcher:
        probe.start()
        for _ in range(RUN):
            system.execute("select count(*) from pg_class")
            watcher.fetchone("select count(*) as n from pg_namespace")
        cost = probe.finish(RUN, watcher=watcher)
    assert watcher.statements == RUN
    # The run's 40 (and the few of autovacuum's visits); counted in, the polls were 40 more.
    assert RUN - 2 <= cost["transactions"] <= RUN + 6, cost
    assert cost["statements_per_job"] == 1.0, cost["top_statements"]
    assert cost["observer_statements"] >= RUN
    assert cost["watcher_cpu_ms"] is not None
