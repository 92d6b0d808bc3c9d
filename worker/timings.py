"""Where the worker's time goes: seconds spent per step of a send, summed over every process.

Each process adds the wall-clock seconds of its steps up in memory and writes them to one
Redis hash (`<prefix>worker:seconds`) at most once a second and when it stops, like the
decision counters (worker/stats.py; both are gatekeeper/lib/counters.py's); /metrics shows
them as `gatekeeper_worker_seconds_total` and the gate benchmark reads them for its breakdown. The
steps, in a campaign's order:

- reading: a campaign file's lines parsed and checked (worker.preparing)
- chunking: its recipients stored as chunks and the chunks queued
- fetch: a chunk's task loading the chunk (its recipients decoded) and taking its lease
- gate: the gate's decisions (segments, caps, the limiter in Redis)
- rendering: the templates rendered per admitted send
- claims: the send claims taken and settled in Redis (worker/claims.py)
- dispatch: the provider's calls
- ledger: the outcomes and returned quota written to Redis
- settle: the chunk's counts written to its job, follow-up chunks stored

A step's seconds are wall-clock, so they include waiting for Redis, the database and, on a
busy machine, the CPU. Writing them costs one HINCRBYFLOAT per step and second.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from gatekeeper.lib.counters import RedisCounters

STEPS = (
    "reading",
    "chunking",
    "fetch",
    "gate",
    "rendering",
    "claims",
    "dispatch",
    "ledger",
    "settle",
)

_counters = RedisCounters("worker:seconds")


def timings_key() -> str:
    return _counters.key()


def add(step: str, seconds: float) -> None:
    """Count `seconds` of `step` (one of STEPS)."""
    if step not in STEPS:
        raise ValueError(f"{step!r} is not a worker step: one of {', '.join(STEPS)}")
    _counters.add({step: seconds})


@contextmanager
def timed(step: str) -> Iterator[None]:
    """Count the seconds the block takes as `step`, whether it returns or raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add(step, time.perf_counter() - started)


def flush() -> None:
    """Write the seconds counted so far; a failed write is logged and they are dropped (they
    are figures, not sends)."""
    _counters.flush()


def timings_read() -> dict[str, float]:
    """Seconds per step, every process's, since the hash was made (steps never timed: 0)."""
    found = _counters.read()
    return {step: found.get(step, 0.0) for step in STEPS}


def discard_pending() -> None:
    """Forget seconds not yet written (tests, which point each test at a fresh Redis DB)."""
    _counters.discard_pending()
