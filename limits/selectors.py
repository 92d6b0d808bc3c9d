"""Reads of the caps, with the in-process cache every gate call uses."""

import threading
import time
from dataclasses import dataclass

from django.conf import settings

from limits.channels import ALL
from limits.limiter import Limits, Policy
from limits.models import Cap

CapsTable = dict[str, dict[str, Limits]]
"""segment slug -> scope (each channel and `all`) -> limits. A missing scope means no cap."""


def caps_table_read() -> CapsTable:
    """All caps straight from the database."""
    table: CapsTable = {}
    for segment_slug, channel, daily, weekly in Cap.objects.values_list(
        "segment__slug", "channel", "daily", "weekly"
    ):
        table.setdefault(segment_slug, {})[channel] = Limits(daily=daily, weekly=weekly)
    return table


def policy_from(table: CapsTable, *, segment: str | None, channel: str) -> Policy:
    """The caps a send on `channel` to a user of `segment` must fit: the channel's and `all`'s
    (missing caps: no limit)."""
    caps = table.get(segment or "", {})
    return Policy(channel=caps.get(channel, Limits()), all=caps.get(ALL, Limits()))


@dataclass
class _CachedCaps:
    table: CapsTable
    read_at: float


class CapsCache:
    """Caps kept in process for `ttl` seconds.

    Every gate call needs the caps of every segment; reading them from the database each time
    would cost more than the limiter itself. A short TTL bounds how long an edit made in admin
    or over the API takes to govern decisions in every process (no restart, no signal needed).
    """

    def __init__(self, *, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: _CachedCaps | None = None

    def table(self, *, now: float | None = None) -> CapsTable:
        now = time.monotonic() if now is None else now
        cached = self._cached
        if cached is not None and now - cached.read_at < self.ttl:
            return cached.table
        with self._lock:
            cached = self._cached
            if cached is None or now - cached.read_at >= self.ttl:
                cached = _CachedCaps(table=caps_table_read(), read_at=now)
                self._cached = cached
        return cached.table

    def invalidate(self) -> None:
        self._cached = None

    def policy(self, *, segment: str, channel: str) -> Policy:
        return policy_from(self.table(), segment=segment, channel=channel)


_caps_cache: CapsCache | None = None


def caps_cache() -> CapsCache:
    global _caps_cache
    if _caps_cache is None:
        _caps_cache = CapsCache(ttl=settings.GATEKEEPER_CAPS_TTL_SECONDS)
    return _caps_cache
