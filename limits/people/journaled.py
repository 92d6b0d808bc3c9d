"""What a process keeps in memory of a table that journals its changes in commit order (the
suppression list, people's preferences): read whole once, then brought up to date by reading
the journal after the last change it has, at most every `ttl` seconds (at once after this
process made a change: `read_now`), and whole again every hour, so that nothing drifts.

If the database is away, lookups go on with what was last read (a few seconds stale beats
refusing everyone) and the read is tried again after the TTL; if it was never read at all, the
cache raises its `unavailable` error, and the gate refuses marketing as `unavailable` (fail
closed: a send to someone who said no is worse than a send refused for now).
"""

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

FULL_READ_AFTER = 3600.0  # a process reads the whole table again this long after it last did


class JournaledCache:
    """The reading schedule; a subclass says how to read the whole table (`_read_all`), the
    journal after `_last_change` (`_read_changes`), and what to forget (`_reset`)."""

    what = "the table"  # in log lines
    unavailable: type[Exception] = RuntimeError

    def __init__(self, *, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock  # tests pass their own
        self._lock = threading.Lock()
        self._last_change = 0  # the journal id read up to
        self._read_at: float | None = None  # monotonic time of the last read
        self._due = False  # read at the next lookup, whatever the TTL says
        self._full_at: float | None = None  # monotonic time of the last whole read
        self._loaded = False  # read whole at least once
        self._reset()

    def read_now(self) -> None:
        """Read the journal on the next lookup (this process just made a change)."""
        self._due = True

    def clear(self) -> None:
        """Forget everything: the next lookup reads the whole table (tests, a flushed
        database)."""
        with self._lock:
            self._reset()
            self._last_change, self._read_at, self._full_at, self._due = 0, None, None, False
            self._loaded = False

    def _loaded_now(self) -> None:
        """Mark a cache filled by hand (benchmarks) as read, for good."""
        self._read_at, self._loaded = time.monotonic(), True

    def _fresh(self) -> None:
        """Up to date within the TTL; raises `unavailable` while never read."""
        monotonic = self.clock()
        read_at = self._read_at
        if self._due or read_at is None or monotonic - read_at >= self.ttl:
            with self._lock:
                if self._due or self._read_at is None or monotonic - self._read_at >= self.ttl:
                    self._due = False
                    try:
                        self._read(monotonic)
                    except Exception:
                        logger.exception("%s not read; deciding by the last one read", self.what)
                        self._read_at = monotonic
        if not self._loaded:
            raise self.unavailable(f"{self.what} could not be read")

    def _read(self, monotonic: float) -> None:
        if self._full_at is None or monotonic - self._full_at >= FULL_READ_AFTER:
            self._read_all()
            self._loaded = True
            self._full_at = monotonic
        else:
            self._read_changes()
        self._read_at = monotonic

    def _reset(self) -> None:
        raise NotImplementedError

    def _read_all(self) -> None:
        raise NotImplementedError

    def _read_changes(self) -> None:
        raise NotImplementedError
