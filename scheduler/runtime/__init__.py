"""How every long-running component runs: one lifecycle, its health endpoints, and supervision.

``service`` is the base every component is built on (start, run until stopped, stop within a grace
period, transient failures retried with capped full-jitter backoff and broken clients rebuilt);
``health`` serves ``/live``, ``/ready``, ``/startup``, ``/health`` and ``/metrics`` on the
component's own port; ``supervisor`` runs several components as child processes (``run all``),
restarting a child that dies.
"""
