"""Ids the scheduler makes: runs' and schedules' are time-ordered, events' random, and neither
repeats across threads or in a forked child (the reconciler drops an event whose id it has seen)."""

from __future__ import annotations

import os
import random
import threading
import uuid

import pytest

from scheduler.domain.ids import new_event_id, new_id


def test_event_ids_are_random_standard_uuids() -> None:
    ids = [new_event_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(type(i) is uuid.UUID and i.version == 4 and i.variant == uuid.RFC_4122 for i in ids)


def test_run_ids_are_time_ordered() -> None:
    ids = [new_id() for _ in range(1_000)]
    assert all(i.version == 7 for i in ids)
    # Their first 48 bits are the time in milliseconds: never decreasing from one id to the next.
    stamps = [i.int >> 80 for i in ids]
    assert stamps == sorted(stamps)


def test_a_handler_seeding_random_does_not_repeat_event_ids() -> None:
    random.seed(7)
    first = new_event_id()
    random.seed(7)
    assert new_event_id() != first


def test_threads_draw_distinct_event_ids() -> None:
    drawn: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def draw(into: list[uuid.UUID]) -> None:
        into.extend(new_event_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for into in drawn for i in into]
    assert len(set(every)) == len(every) == 20_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    # Both generators are in use before the fork.
    new_event_id()
    new_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without running the parent's cleanup
        try:
            os.write(write, " ".join(str(i) for i in (new_event_id(), new_event_id(), new_id())).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = [uuid.UUID(text) for text in pipe.read().split()]
    os.waitpid(pid, 0)
    parent = [new_event_id(), new_event_id(), new_id()]
    assert len(child) == 3
    assert child[0] not in parent[:2] and child[1] not in parent[:2]
    # The v7 ids share the millisecond; the random bits after it must differ.
    assert child[2].int & ((1 << 80) - 1) != parent[2].int & ((1 << 80) - 1)
