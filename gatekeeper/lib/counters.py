"""Counters every process adds to and any process reads: one Redis hash each (or one a UTC day),
so /metrics and the dashboard, served by whichever process is asked, show every process's counts.

A process adds in memory and writes what it counted at most once a second (when it next adds),
in one pipeline of HINCRBYFLOAT (HINCRBY for whole counts), and when asked (`flush`: /metrics
and the dashboard before they read, a worker child after each snapshot poll and when it stops).
A write that fails is logged and the counts are dropped: they are figures, never worth holding
up a send. A hash without an expiry only grows, so Prometheus takes its fields as counters
(`..._total`); a hash per day is given an expiry, renewed at each write, so old days go.

Each use is one instance made at import (the gate's decisions per day, worker/stats.py; the
worker's step timings, worker/timings.py; the gate's call seconds, worker/latency.py; the
providers' answers, worker/delivery/answers.py).
"""

import datetime as dt
import logging
import threading
import time
from collections.abc import Mapping

from django.conf import settings

from gatekeeper.lib.redis_client import get_redis

logger = logging.getLogger(__name__)

FLUSH_EVERY_SECONDS = 1.0
EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


class RedisCounters:
    """The counters of the hash `<prefix><name>` (per day: `<prefix><name>:<YYYY-MM-DD>`), by
    field. `whole`: the counts are ints, written by HINCRBY and read as ints. `expire_seconds`:
    each hash written is given that expiry (renewed at each write)."""

    def __init__(
        self,
        name: str,
        *,
        per_day: bool = False,
        expire_seconds: int | None = None,
        whole: bool = False,
    ) -> None:
        if expire_seconds is not None and expire_seconds <= 0:
            raise ValueError(f"expire_seconds must be positive, not {expire_seconds}")
        self.name = name
        self.per_day = per_day
        self.expire_seconds = expire_seconds
        self.whole = whole
        self._lock = threading.Lock()
        self._pending: dict[tuple[dt.date | None, str], float] = {}
        self._last_flush = time.monotonic()
        self._day = dt.date.min
        self._day_ends = 0.0  # time.time() at which `_day` ends (UTC midnight)

    def key(self, day: dt.date | None = None) -> str:
        """The hash's key (per day: `day`'s, which must then be given)."""
        if not self.per_day:
            if day is not None:
                raise ValueError(f"the counters of {self.name} are not kept per day")
            return f"{settings.GATEKEEPER_KEY_PREFIX}{self.name}"
        if day is None:
            raise ValueError(f"the counters of {self.name} are kept per day: say which")
        # One hash per day; a single key lands on one cluster node, which is fine at this volume.
        return f"{settings.GATEKEEPER_KEY_PREFIX}{self.name}:{day.isoformat()}"

    def today(self) -> dt.date:
        """Today in UTC, the day counts added without one go to (worked out once a day, not at
        every add: a gate batch adds once, and a date from the clock costs more than the add)."""
        now = time.time()
        if now >= self._day_ends:
            self._day = dt.datetime.fromtimestamp(now, dt.UTC).date()
            self._day_ends = (self._day.toordinal() - EPOCH_ORDINAL + 1) * 86400.0
        return self._day

    def _day_of(self, day: dt.date | None) -> dt.date | None:
        """The day counts go to: `day`, today (UTC) by default when kept per day; none else."""
        if self.per_day:
            return day or self.today()
        if day is not None:
            raise ValueError(f"the counters of {self.name} are not kept per day")
        return None

    def add(self, counts: Mapping[str, float], *, day: dt.date | None = None) -> None:
        """Add `counts` (field: amount; ints if `whole`) to `day`'s hash (per day; default
        today, UTC) or the one hash; written with the others within a second."""
        day = self._day_of(day)
        with self._lock:
            pending = self._pending
            for field, amount in counts.items():
                pending[(day, field)] = pending.get((day, field), 0) + amount
            due = time.monotonic() - self._last_flush >= FLUSH_EVERY_SECONDS
        if due:
            self.flush()

    def add_one(self, field: str, amount: float, *, day: dt.date | None = None) -> None:
        """`add` of one field (a one-request gate call's count: no mapping made and walked)."""
        slot = (self._day_of(day), field)
        with self._lock:
            self._pending[slot] = self._pending.get(slot, 0) + amount
            due = time.monotonic() - self._last_flush >= FLUSH_EVERY_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the counts added so far, in one pipeline."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        if not pending:
            return
        try:
            pipe = get_redis().pipeline(transaction=False)
            keys = set()
            for (day, field), amount in pending.items():
                key = self.key(day)
                if self.whole:
                    pipe.hincrby(key, field, int(amount))
                else:
                    pipe.hincrbyfloat(key, field, amount)
                keys.add(key)
            if self.expire_seconds is not None:
                for key in keys:
                    pipe.expire(key, self.expire_seconds)
            pipe.execute()
        except Exception as exc:  # any failure, not only Redis's: figures never stop a send
            logger.warning("Could not write the counters of %s to Redis: %s", self.name, exc)

    def read(self, day: dt.date | None = None) -> dict[str, float]:
        """Every process's counts that were written, by field (of `day`'s hash, per day)."""
        raw = get_redis().hgetall(self.key(day))
        number = int if self.whole else float
        return {k.decode() if isinstance(k, bytes) else str(k): number(v) for k, v in raw.items()}

    def discard_pending(self) -> None:
        """Forget counts not yet written (tests, which point each test at a fresh Redis DB)."""
        with self._lock:
            self._pending = {}
