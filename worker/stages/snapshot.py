"""No snapshot: a process with no segment snapshot loaded (and none cached on disk) cannot
tell whose rules apply, so it refuses the rest as `unavailable` (the worker tries them again)."""

import logging
import time

from limits.reasons import Reason
from worker.stages.base import Batch, Parts, Stage

logger = logging.getLogger(__name__)

_last_log = 0.0


def run(batch: Batch, parts: Parts) -> None:
    if batch.segments is not None or not batch.pending:
        return
    _log_no_snapshot()
    batch.refuse_pending(Reason.UNAVAILABLE)


def _log_no_snapshot() -> None:
    # Once a minute at most: a worker gating millions of users must not write millions of lines.
    global _last_log
    if time.monotonic() - _last_log > 60:
        _last_log = time.monotonic()
        logger.error(
            "No segment snapshot is loaded and none is cached on disk: every marketing send is "
            "refused as 'unavailable' until a snapshot is published (manage.py build_segments)."
        )


STAGE = Stage("snapshot", (Reason.UNAVAILABLE,), run)
