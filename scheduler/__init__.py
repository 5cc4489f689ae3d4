"""A distributed job scheduler on PostgreSQL (source of truth) and Kafka (transport).

The data flow is the folder layout: ``schedule`` (create and validate) → ``scan`` (due schedules
into runs and outbox rows) → ``relay`` (outbox into Kafka) → ``worker`` (execute) → ``reconcile``
(outcomes back into PostgreSQL). ``domain`` is pure; ``store`` and ``kafka`` are the adapters.
"""

__version__ = "0.1.0"
