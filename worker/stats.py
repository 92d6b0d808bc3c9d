"""Per-day counters of gate decisions by segment, channel and reason, kept in Redis.

The dashboard and /metrics read them; every process (web, worker) adds to them. A gate call is
counted once, by its distinct (segment, reason) pairs (one C pass over its decisions, about
0.1 to 0.2 us each; one decision: no pass), under field names made once; the counts are
buffered in process and written at most once a second, in one HINCRBY pipeline
(gatekeeper/lib/counters.py). docs/performance.md has what that costs the gate.
A counter write that fails is logged and dropped: statistics must never stop a send. Each day's
hash (`<prefix>stats:<YYYY-MM-DD>`) expires KEEP_DAYS after its last write.
"""

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import Protocol

from gatekeeper.lib.counters import RedisCounters

KEEP_DAYS = 35
Key = tuple[str, str, str]
"""(segment, channel, reason)"""


class _HasReason(Protocol):
    segment: str | None
    reason: str


_counters = RedisCounters("stats", per_day=True, expire_seconds=KEEP_DAYS * 86400, whole=True)

# A decision's (segment, reason), read in C: a batch is counted by Counter's C loop, and only
# its few distinct pairs pass through Python (0.65 us a decision before, as one tuple each).
_SEGMENT_REASON = attrgetter("segment", "reason")

# Per channel, (segment, reason) -> its field: each name made once, not at every call.
_fields: dict[str, dict[tuple[str | None, str], str]] = {}
_FIELDS_MAX = 10_000  # segments come and go with snapshots: past this, names are made again


def _field(channel: str, pair: tuple[str | None, str]) -> str:
    named = _fields.get(channel)
    if named is None or len(named) >= _FIELDS_MAX:
        named = _fields[channel] = {}
    segment, reason = pair
    field = named[pair] = f"{segment or 'unknown'}|{channel}|{reason}"
    return field


def record(*, channel: str, decisions: Sequence[_HasReason], day: dt.date | None = None) -> None:
    """Count `decisions` made on `channel` on `day` (default today, UTC): once per call, by
    the batch's distinct (segment, reason) pairs, with their fields' names made once."""
    named = _fields.get(channel, {})
    if len(decisions) == 1:  # one request a call: no Counter
        decision = decisions[0]
        pair = (decision.segment, decision.reason)
        _counters.add_one(named.get(pair) or _field(channel, pair), 1, day=day)
        return
    counts: dict[str, int] = {}
    for pair, n in Counter(map(_SEGMENT_REASON, decisions)).items():
        field = named.get(pair) or _field(channel, pair)
        counts[field] = counts.get(field, 0) + n  # None's and `unknown`'s: one field
    _counters.add(counts, day=day)


def flush() -> None:
    _counters.flush()


def stats_for_day(day: dt.date) -> dict[Key, int]:
    """Counts for one day: (segment, channel, reason) -> decisions."""
    result: dict[Key, int] = {}
    for name, value in _counters.read(day).items():
        segment, channel, reason = name.split("|", 2)
        result[(segment, channel, reason)] = int(value)
    return result


def stats_for_days(*, days: int, today: dt.date | None = None) -> dict[dt.date, dict[Key, int]]:
    today = today or dt.datetime.now(dt.UTC).date()
    return {
        today - dt.timedelta(days=i): stats_for_day(today - dt.timedelta(days=i))
        for i in range(days - 1, -1, -1)
    }


def discard_pending() -> None:
    """Forget counts not yet written (tests, which point each test at a fresh Redis DB)."""
    _counters.discard_pending()
