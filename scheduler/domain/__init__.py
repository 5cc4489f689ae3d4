"""The pure domain: the scheduling rules every component shares, free of PostgreSQL and Kafka.

``cron`` turns a cron expression and an IANA zone into UTC fire times (DST rules, ``H``);
``policies`` decides what a scan does with due fires (misfire, overlap); ``retry`` is the backoff
maths; ``run_state`` is the run state machine; ``schedule`` names a schedule's kinds, states and
policies. Nothing here performs I/O or reads a clock: callers pass ``now`` in.
"""
