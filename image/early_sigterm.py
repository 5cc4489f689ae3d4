"""Installed into the image's virtualenv with a ``.pth`` file, so it runs as the interpreter starts.

In a container the scheduler is PID 1, and the kernel drops a signal sent to PID 1 that has no
handler. The scheduler installs its own SIGTERM handler (scheduler.runtime.process, the supervisor
of ``run all``), but only once its modules are imported: a ``podman stop`` or a Kubernetes
termination in that first fraction of a second would be ignored until the SIGKILL of the grace
period. This handler covers that window: SIGTERM before the scheduler's own handler exits at once
with the conventional status 143. The scheduler's handler replaces it when installed.

Only as PID 1: any other process dies of the default SIGTERM, as outside a container (the
supervisor of ``run all`` counts a child killed by its SIGTERM before the handler as a clean stop).
"""

import os
import signal
import sys


def _exit(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


if os.getpid() == 1 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _exit)
