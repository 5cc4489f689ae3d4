"""The pure domain: the scheduling rules every component shares, free of PostgreSQL and Kafka.

``schedule`` is the :class:`Schedule` entity with its kinds, states and policies, and the
execution settings a job message carries; ``run`` is the :class:`Run` entity; ``run_state`` is the
run state machine; ``cron`` turns a cron expression and an IANA zone into UTC fire times (DST
rules, ``H``); ``policies`` decides what a scan does with a due schedule (one-shot or cron, end
bound, misfire, overlap); ``retry`` is the backoff maths; ``ids`` makes the ids of new schedules
and runs. Nothing here performs I/O, and nothing but a new id (its time, UUIDv7) reads a clock:
callers pass ``now`` in, and the store maps its rows to these entities.
"""
