"""Ids of new schedules and runs (time-ordered UUIDs, version 7, RFC 9562) and of events."""

from __future__ import annotations

from uuid import UUID

from uuid_utils.compat import uuid4, uuid7


def new_id() -> UUID:
    """A UUIDv7: its first 48 bits are the Unix time in milliseconds, so ids made one after another
    sort together. A primary key (and every key that starts with the id) then takes each new row at
    its right edge, as a sequence would, instead of on a random leaf page: on a history of millions
    of runs a random key makes nearly every insert touch a page of its own, and the first change of
    a page after a checkpoint writes the whole page to the WAL. Still unique without coordination,
    as version 4 ids are. (uuid-utils keeps the time the clock's at any rate; uuid6's uuid7 adds a
    millisecond per id made within one, so above 1,000 ids a second its time runs ahead.)"""
    return uuid7()


def new_event_id() -> UUID:
    """A random UUID (version 4) naming one event: unique without coordination, as ``uuid.uuid4()``
    is (uuid-utils reseeds its generator in a forked child), but made while keeping the GIL. The
    standard library's reads ``os.urandom`` for each id, which lets go of the GIL; on a worker
    whose other threads keep it busy, taking it back waits for one of them to yield (up to the
    interpreter's 5 ms switch interval), twice per job on the jobs loop."""
    return uuid4()
