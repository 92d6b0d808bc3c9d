"""Start-up of processes that gate sends: load the snapshot once, follow new versions.

The snapshot is loaded in the parent before it forks (gunicorn's master with preload_app,
Celery's prefork parent), so the children share the bitmaps' memory copy-on-write: the index
keeps them in numpy buffers that Python's reference counting never writes to. Threads and
connection pools do not survive a fork, so each child starts its own follower and opens its
own Redis connections.
"""

import logging

from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine.limiter import reset_limiter
from segments.index import get_holder, get_index, index_status
from worker import latency, stats
from worker.delivery import answers
from worker.processes import process_report

logger = logging.getLogger(__name__)


def load_snapshot(*, role: str) -> None:
    """In the parent, before it forks: load, without following (the children follow)."""
    get_holder().follow_lazily = False
    if get_index() is None:
        logger.error(
            "%s: no segment snapshot (%s); marketing sends get 'unavailable'",
            role,
            index_status()["error"],
        )
    else:
        status = index_status()
        logger.info(
            "%s: segment snapshot %s loaded from %s", role, status["version"], status["source"]
        )


def after_fork(*, role: str) -> None:
    """In each forked child: its own Redis connections, snapshot follower and report."""
    reset_redis_clients()
    reset_limiter()
    holder = get_holder()
    holder.after_fork()
    holder.on_poll = lambda status: _on_poll(role, status)
    holder.get()  # starts this child's follower
    process_report(role=role, status=holder.status())


def _on_poll(role: str, status: dict[str, object]) -> None:
    """After each snapshot poll: report this process's version, and write the counts it still
    holds (they are written at most once a second, and only when counted again)."""
    process_report(role=role, status=status)
    stats.flush()
    latency.flush()
    answers.flush()
