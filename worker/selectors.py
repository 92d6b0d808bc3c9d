"""Reads that join the segment index, the caps and the limiter: a user's quota, their recent
sends, and the what-if of a draft change of caps. None of them writes anything."""

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import redis

from limits.channels import channels
from limits.limiter import Limits, get_limiter
from limits.selectors import CapsTable, caps_cache, caps_table_read, policy_from
from segments.index import SegmentIndex, get_index, index_status
from segments.parsing import UserListError, iter_ids
from worker.stats import stats_for_days

# Audience members evaluated per what-if: 4 dry runs of 100,000 take a few seconds (two
# channels, now and draft). A larger audience is estimated from a uniform random sample.
WHAT_IF_LIMIT = 100_000
# An uploaded what-if audience is read by the web process: bounded as sent, decompressed and
# in ids, so a large or inflating file is refused in about a second.
WHAT_IF_MAX_BYTES = 100 * 2**20
WHAT_IF_MAX_INFLATED = 128 * 2**20
WHAT_IF_MAX_IDS = 5_000_000


class Unavailable(Exception):
    """The snapshot or Redis is missing: the read cannot be answered (the message says why)."""


def _index() -> SegmentIndex:
    index = get_index()
    if index is None:
        raise Unavailable(f"No segment snapshot is loaded: {index_status()['error']}")
    return index


def _redis_down(exc: Exception) -> Unavailable:
    return Unavailable(f"Redis is not answering ({type(exc).__name__}: {exc}).")


def user_quota(user_id: int, *, now: float | None = None) -> dict[str, Any]:
    """The user's segment and, per channel and `all`: used, limit, remaining, next slot."""
    try:
        return _user_quota(user_id, now=now)
    except redis.RedisError as exc:
        raise _redis_down(exc) from exc


def _user_quota(user_id: int, *, now: float | None) -> dict[str, Any]:
    index = _index()
    segment = index.resolve(user_id)
    limiter = get_limiter()
    scopes: dict[str, Any] = {}
    for channel in channels():
        usage = limiter.peek(
            channel, user_id, caps_cache().policy(segment=segment, channel=channel), now=now
        )
        if usage is None:
            raise Unavailable("Redis is not answering; quotas cannot be read.")
        for scope in usage:
            scopes[scope.scope] = {
                "daily": {
                    "used": scope.daily_used,
                    "limit": scope.limits.daily,
                    "remaining": scope.daily_remaining,
                },
                "weekly": {
                    "used": scope.weekly_used,
                    "limit": scope.limits.weekly,
                    "remaining": scope.weekly_remaining,
                },
                "next_slot_in": scope.next_slot_in,
            }
    return {
        "user_id": user_id,
        "segment": segment,
        "snapshot_version": index.version,
        "scopes": scopes,
    }


def user_recent_sends(
    user_id: int, *, now: float | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Admitted message ids of the last 7 days, newest first, per channel."""
    limiter = get_limiter()
    try:
        sends: list[dict[str, Any]] = [
            {"channel": channel, "message_id": member, "at": at}
            for channel in channels()
            for member, at in limiter.history(user_id, channel, now=now)
        ]
    except redis.RedisError as exc:
        raise _redis_down(exc) from exc
    return sorted(sends, key=lambda s: -s["at"])[:limit]


def what_if(
    *,
    ids: np.ndarray,
    draft: CapsTable,
    only_channels: list[str] | None = None,
    now: float | None = None,
    audience_size: int | None = None,
) -> dict[str, Any]:
    """How many of `ids` one more send would be refused now and under `draft` (the whole caps
    table with the draft applied), per segment and channel, against today's Redis state.

    Dry runs only: nothing is recorded. Ids are de-duplicated; an audience above WHAT_IF_LIMIT
    is estimated from a uniform random sample of that many, scaled up (`sampled` says so).
    `audience_size`: the caller already sampled `ids` from an audience of that many."""
    index = _index()
    unique = np.unique(np.asarray(ids, dtype=np.uint64))
    total = max(int(unique.size), audience_size or 0)
    if unique.size > WHAT_IF_LIMIT:
        unique = np.sort(np.random.default_rng().choice(unique, WHAT_IF_LIMIT, replace=False))
    sampled = total > int(unique.size)
    scale = total / max(1, int(unique.size))
    user_ids = [int(u) for u in unique]
    segments = index.resolve_many(user_ids)
    sizes = Counter(segments)
    current = caps_table_read()
    limiter = get_limiter()
    rows: list[dict[str, Any]] = []
    for channel in only_channels or channels():
        requests = [(u, f"what-if:{u}") for u in user_ids]
        refused: dict[str, Counter[str]] = {}
        for name, table in (("now", current), ("draft", draft)):
            policies = {s: policy_from(table, segment=s, channel=channel) for s in sizes}
            decisions = limiter.acquire(
                channel, requests, [policies[s] for s in segments], dry_run=True, now=now
            )
            if any(d.reason == "unavailable" for d in decisions):
                raise Unavailable("Redis is not answering; the what-if cannot be run.")
            refused[name] = Counter(
                s for s, d in zip(segments, decisions, strict=True) if not d.allowed
            )
        for slug in sorted(sizes, key=lambda s: _priority(index, s)):
            rows.append(
                {
                    "segment": slug,
                    "channel": channel,
                    "audience": round(sizes[slug] * scale),
                    "refused_now": round(refused["now"][slug] * scale),
                    "refused_draft": round(refused["draft"][slug] * scale),
                }
            )
    return {"audience": total, "evaluated": len(user_ids), "sampled": sampled, "rows": rows}


def what_if_segment_audience(slug: str) -> tuple[np.ndarray, int]:
    """(ids to evaluate, audience size) for everyone in a segment of the live snapshot. A
    segment larger than WHAT_IF_LIMIT is sampled by position in its bitmap, so a huge segment
    is never copied out whole. Raises Unavailable saying why there is no audience."""
    index = get_index()
    if index is None:
        raise Unavailable("No segment snapshot is loaded, so no segment can be listed.")
    bitmap = index.bitmaps.get(slug)
    if bitmap is None:
        raise Unavailable(f"{slug} is not in the live snapshot (build first).")
    size = len(bitmap)
    if size <= WHAT_IF_LIMIT:
        return np.asarray(bitmap.to_array(), dtype=np.uint64), size
    positions = np.sort(np.random.default_rng().choice(size, WHAT_IF_LIMIT, replace=False))
    return np.array([bitmap[int(i)] for i in positions], dtype=np.uint64), size


def what_if_file_audience(upload: Any, name: str) -> np.ndarray:
    """The ids of an uploaded audience file (a user list: one id a line, text or gzip), within
    WHAT_IF_MAX_BYTES as sent, WHAT_IF_MAX_INFLATED decompressed and WHAT_IF_MAX_IDS ids.
    Raises Unavailable saying what is wrong with it."""
    larger = "Choose a segment for a larger audience."
    if upload.size > WHAT_IF_MAX_BYTES:
        raise Unavailable(
            f"{name}: {upload.size:,} bytes; a what-if list is at most {WHAT_IF_MAX_BYTES:,} "
            f"bytes. {larger}"
        )
    index = get_index()
    width = index.id_width if index is not None else 32
    parts, count = [], 0
    try:
        for part in iter_ids(upload, width=width, max_bytes=WHAT_IF_MAX_INFLATED):
            count += int(part.size)
            if count > WHAT_IF_MAX_IDS:
                raise Unavailable(f"{name}: more than {WHAT_IF_MAX_IDS:,} ids. {larger}")
            parts.append(part)
    except UserListError as exc:
        raise Unavailable(f"{name}: {exc.messages[0]}") from exc
    if not parts:
        raise Unavailable(f"{name} holds no user ids.")
    return np.concatenate(parts)


def _priority(index: SegmentIndex, slug: str) -> int:
    order = index.segments
    return order.index(slug) if slug in order else len(order)


def draft_table(changes: Mapping[tuple[str, str], Limits]) -> CapsTable:
    """The live caps table with `changes` ((segment, scope) -> Limits) applied."""
    table = {slug: dict(scopes) for slug, scopes in caps_table_read().items()}
    for (slug, scope), limits in changes.items():
        table.setdefault(slug, {})[scope] = limits
    return table


ADMITTED = ("allowed", "duplicate", "exempt")
REFUSED = ("daily_cap", "weekly_cap", "blocked", "unavailable")


def dashboard_stats(*, days: int = 14, today: Any = None) -> dict[str, Any]:
    """Decisions from the per-day Redis counters, shaped for the dashboard's tables and charts:
    today by segment x channel x reason, and admitted / refused per day for `days` days."""
    per_day = stats_for_days(days=days, today=today)
    last_day = max(per_day)
    today_counts = per_day[last_day]
    by_segment: dict[str, Counter[str]] = {}
    rows: dict[tuple[str, str], Counter[str]] = {}
    for (segment, channel, reason), count in today_counts.items():
        by_segment.setdefault(segment, Counter())[reason] += count
        rows.setdefault((segment, channel), Counter())[reason] += count
    reasons = [r for r in (*ADMITTED, *REFUSED) if any(c[r] for c in by_segment.values())]
    table = [
        {
            "segment": segment,
            "channel": channel,
            "admitted": sum(c[r] for r in ADMITTED),
            "refused": sum(c[r] for r in REFUSED),
            "reasons": {r: c[r] for r in reasons},
        }
        for (segment, channel), c in sorted(rows.items())
    ]
    history = {
        "days": [day.isoformat() for day in per_day],
        "admitted": [sum(n for k, n in c.items() if k[2] in ADMITTED) for c in per_day.values()],
        "refused": [sum(n for k, n in c.items() if k[2] in REFUSED) for c in per_day.values()],
    }
    return {
        "day": last_day.isoformat(),
        "reasons": reasons,
        "table": table,
        "today_by_segment": {
            "segments": sorted(by_segment),
            "datasets": {r: [by_segment[s][r] for s in sorted(by_segment)] for r in reasons},
        },
        "history": history,
        "admitted_today": sum(row["admitted"] for row in table),
        "refused_today": sum(row["refused"] for row in table),
    }
