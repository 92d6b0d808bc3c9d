"""Counters every process adds to and any process reads: one Redis hash each, so /metrics,
served by whichever web process is asked, shows every process's counts.

A process adds in memory and writes what it counted at most once a second (when it next adds),
in one pipeline of HINCRBYFLOAT, and when asked (`flush`: /metrics before it reads, a worker
child after each snapshot poll and when it stops). A write that fails is logged and the counts
are dropped: they are figures, never worth holding up a send. The hash never expires, so its
fields only grow: Prometheus takes them as counters (`..._total`).

The decision counters per day (worker/stats.py) and the worker's step timings
(worker/timings.py) keep their own hashes the same way.
"""

import logging
import threading
import time

from django.conf import settings

from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 1.0


class RedisCounters:
    """The counters of the hash `<prefix><name>`, by field."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}
        self._last_flush = time.monotonic()

    def key(self) -> str:
        return f"{settings.GATEKEEPER_KEY_PREFIX}{self.name}"

    def add(self, counts: dict[str, float]) -> None:
        """Add `counts` (field: amount); written with the others within a second."""
        with self._lock:
            for field, amount in counts.items():
                self._pending[field] = self._pending.get(field, 0.0) + amount
            due = time.monotonic() - self._last_flush >= FLUSH_EVERY_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        if not pending:
            return
        try:
            pipe = get_redis().pipeline(transaction=False)
            for field, amount in pending.items():
                pipe.hincrbyfloat(self.key(), field, amount)
            pipe.execute()
        except REDIS_DOWN as exc:
            logger.warning("Could not write the counters of %s to Redis: %s", self.key(), exc)

    def read(self) -> dict[str, float]:
        """Every process's counts that were written, by field."""
        raw = get_redis().hgetall(self.key())
        return {k.decode() if isinstance(k, bytes) else str(k): float(v) for k, v in raw.items()}

    def discard_pending(self) -> None:
        """Forget counts not yet written (tests, which point each test at a fresh Redis DB)."""
        with self._lock:
            self._pending = {}
