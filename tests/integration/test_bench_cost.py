"""bench/cost.py's probe counts what the measured system did in its database between the start and
the end of a run: not the probe's own reads, nor what the system's processes go on doing while the
probe waits for the statistics an idle backend reports late (up to 10 s)."""

from __future__ import annotations

import threading

import psycopg

from bench.cost import CostProbe

RUN = 40


def test_a_runs_statements_and_transactions_are_only_the_runs_own(database_url: str) -> None:
    probe = CostProbe(database_url)
    stop = threading.Event()
    with (
        psycopg.connect(database_url, autocommit=True) as system,
        psycopg.connect(database_url, autocommit=True) as poller,
    ):

        def idle_polling() -> None:
            # What a pipeline's processes do once the run is over: a statement now and then.
            while not stop.wait(0.2):
                poller.execute("select 2")

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
    # One statement in each transaction: the run's 40, and a few at most that the server's own
    # processes (autovacuum) may add.
    assert RUN <= cost["transactions"] <= RUN + 4, cost
    assert cost["statements_per_job"] == 1.0, cost["top_statements"]
