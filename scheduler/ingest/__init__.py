"""The ingestor: schedule commands from Kafka (``<prefix>.schedules``) into PostgreSQL.

Clients that would rather not call the CLI produce Avro ``ScheduleCommand``s (see
the README's wire format, :mod:`scheduler.client`, or ``scheduler produce``). The ingestor decodes
and validates them (:mod:`.commands`), applies each consumed batch in one transaction with the same
rules as every other entry point (:mod:`.apply`, which calls :mod:`scheduler.schedule.service`),
and publishes what it could not apply to ``<prefix>.schedules.rejected`` (:mod:`.ingestor`).
"""
