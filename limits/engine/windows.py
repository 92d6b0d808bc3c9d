"""Time zones and calendar periods, in Python: Redis holds no time-zone data, so a calendar
window reaches the limiter as period starts already resolved in the user's zone.

A local day starts at the first instant of its date: midnight, or the end of a gap when a zone
skips midnight (a spring-forward at 00:00). It lasts 23, 24 or 25 hours around DST changes, or
other lengths where a zone shifts by 30 minutes (Australia/Lord_Howe). Weeks start on Monday,
months on the 1st.
"""

from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from django.conf import settings

from gatekeeper.lib.zones import zone

UNITS = ("day", "week", "month")
# A period's starts are taken around a clock this much behind the caller's: the limiter's clock
# (Redis TIME) may be a little ahead or behind, and picks the right one of the two periods.
CLOCK_SLACK_MS = 60_000
# Longest a period can be, with a DST hour: what a calendar rule needs the log to keep.
LONGEST = {
    "day": timedelta(hours=26),
    "week": timedelta(days=7, hours=1),
    "month": timedelta(days=31, hours=1),
}


def default_zone_name() -> str:
    return str(settings.GATEKEEPER_DEFAULT_TIME_ZONE)


def resolve_zone(*, requested: str | None, segment_zone: str | None) -> str:
    """The zone a decision uses: the request's, else the segment's default, else the setting."""
    return requested or segment_zone or default_zone_name()


def _local_start(day: date, tz: ZoneInfo) -> int:
    """Epoch ms of the first instant of `day` in `tz`."""
    naive = datetime(day.year, day.month, day.day)
    # zoneinfo reads a wall time that does not exist (a gap) with the offset from before the
    # gap, which lands on the first instant after it: the day's real start.
    start = naive.replace(tzinfo=tz)
    utc = start.astimezone(UTC)
    # A wall time that happens twice (fold) starts at its first occurrence (fold=0), as given.
    return int(utc.timestamp() * 1000)


def _period_start_day(day: date, unit: str) -> date:
    if unit == "day":
        return day
    if unit == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def _next_start_day(day: date, unit: str) -> date:
    if unit == "day":
        return day + timedelta(days=1)
    if unit == "week":
        return day + timedelta(days=7)
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


@lru_cache(maxsize=65536)
def _starts(zone_name: str, unit: str, local_day: date) -> tuple[int, int, int]:
    tz = zone(zone_name)
    first = _period_start_day(local_day, unit)
    second = _next_start_day(first, unit)
    third = _next_start_day(second, unit)
    return (_local_start(first, tz), _local_start(second, tz), _local_start(third, tz))


def period_starts(zone_name: str, unit: str, now_ms: int) -> tuple[int, int, int]:
    """Three consecutive period starts (epoch ms) in the zone: the period holding `now_ms` (a
    minute earlier, see CLOCK_SLACK_MS), and the next two."""
    at = now_ms - CLOCK_SLACK_MS
    local_day = datetime.fromtimestamp(at / 1000, tz=zone(zone_name)).date()
    return _starts(zone_name, unit, local_day)


def period_bounds(zone_name: str, unit: str, now_ms: int) -> tuple[int, int]:
    """The period holding `now_ms` exactly: (start, end) in epoch ms."""
    a, b, c = period_starts(zone_name, unit, now_ms)
    return (b, c) if now_ms >= b else (a, b)
