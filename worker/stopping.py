"""A send worker told to stop (SIGTERM to its main process, as systemd with KillMode=mixed and
Kubernetes send it) finishes the dispatcher batch each of its processes is sending, hands its
chunk back and exits, instead of finishing every chunk (minutes) or being killed in the middle
of one (its sends then wait out their lease, and one cut off in flight counts as ambiguous).

Celery's warm shutdown tells the main process; its pool's processes, which run the chunks,
hear nothing. So the main process, when its shutdown begins (`worker_shutting_down`), sends
each of them SIGUSR2 (Celery and billiard use SIGUSR1 for tracebacks and soft time limits), and
each notes it (`stopping()`). A chunk run looks between dispatcher batches (worker/chunks.py):
the batch it was sending is settled in the chunk's record, its lease given back, and its task
queued again, for another worker at once (docs/worker.md, "Stopping a worker").
"""

import contextlib
import os
import signal
from typing import Any

from billiard.process import active_children
from celery.signals import worker_process_init, worker_shutting_down

STOP_SIGNAL = signal.SIGUSR2

_stopping = False


class WorkerStopping(Exception):
    """This process's worker is stopping: the chunk run handed its chunk back."""


def stopping() -> bool:
    """Whether this process's worker has been told to stop."""
    return _stopping


def _stop(*args: Any) -> None:
    global _stopping
    _stopping = True


@worker_process_init.connect
def _listen(**kwargs: Any) -> None:
    signal.signal(STOP_SIGNAL, _stop)


@worker_shutting_down.connect
def _tell(sig: Any = None, how: str | None = None, **kwargs: Any) -> None:
    # With the solo pool the chunks run in this very process.
    _stop()
    for child in active_children():
        if child.pid:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(child.pid, STOP_SIGNAL)
