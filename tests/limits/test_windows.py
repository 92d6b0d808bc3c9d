"""Calendar periods in users' time zones, on the days a zone's clock moves (limits/engine/windows.py),
and calendar rules deciding across those days against real Redis."""

from datetime import UTC, datetime

import pytest

from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.engine.limiter import Limiter
from limits.engine.windows import period_bounds, period_starts
from tests.limits.rulesets import rule, rule_set

HOUR_MS = 3_600_000


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("zone_name", "at", "start", "hours"),
    [
        # New York springs forward on 2026-03-08 (02:00 -> 03:00): a 23-hour day.
        ("America/New_York", ms(2026, 3, 8, 12), ms(2026, 3, 8, 5), 23),
        # ... and falls back on 2026-11-01 (02:00 -> 01:00): 01:00 to 02:00 twice, 25 hours.
        ("America/New_York", ms(2026, 11, 1, 12), ms(2026, 11, 1, 4), 25),
        # London: 2026-03-29 (01:00 -> 02:00) and 2026-10-25 (02:00 -> 01:00).
        ("Europe/London", ms(2026, 3, 29, 12), ms(2026, 3, 29, 0), 23),
        ("Europe/London", ms(2026, 10, 25, 12), ms(2026, 10, 24, 23), 25),
        # Lord Howe moves by half an hour: 2026-04-05 (02:00 -> 01:30) and 2026-10-04.
        ("Australia/Lord_Howe", ms(2026, 4, 5, 0), ms(2026, 4, 4, 13), 24.5),
        ("Australia/Lord_Howe", ms(2026, 10, 4, 0), ms(2026, 10, 3, 13, 30), 23.5),
        # Kathmandu is 5:45 ahead all year: its days start at 18:15 UTC.
        ("Asia/Kathmandu", ms(2026, 3, 8, 12), ms(2026, 3, 7, 18, 15), 24),
    ],
)
def test_a_local_day_is_as_long_as_the_zone_makes_it(
    zone_name: str, at: int, start: int, hours: float
) -> None:
    begin, end = period_bounds(zone_name, "day", at)
    assert begin == start
    assert end - begin == hours * HOUR_MS


def test_weeks_start_on_monday_and_months_on_the_first() -> None:
    # Wednesday 2026-03-11 in New York; its week started on Monday 2026-03-09 (EDT).
    week = period_bounds("America/New_York", "week", ms(2026, 3, 11, 15))
    assert week == (ms(2026, 3, 9, 4), ms(2026, 3, 16, 4))
    # A week over the spring-forward Sunday is an hour short.
    across = period_bounds("America/New_York", "week", ms(2026, 3, 5, 15))
    assert across[1] - across[0] == (7 * 24 - 1) * HOUR_MS
    month = period_bounds("Europe/London", "month", ms(2026, 3, 31, 22))
    assert month == (ms(2026, 3, 1, 0), ms(2026, 3, 31, 23))  # April starts at 23:00 UTC
    february = period_bounds("Asia/Kathmandu", "month", ms(2028, 2, 15))
    assert february[1] - february[0] == 29 * 24 * HOUR_MS  # a leap year


def test_the_periods_passed_to_redis_cover_a_clock_a_minute_either_side() -> None:
    midnight = ms(2026, 3, 9, 4)  # 00:00 in New York
    a, b, c = period_starts("America/New_York", "day", midnight + 30_000)
    # Taken a minute before: the day that just ended, then the new one, then the next.
    assert (a, b, c) == (ms(2026, 3, 8, 5), midnight, ms(2026, 3, 10, 4))


def test_an_unknown_zone_is_named() -> None:
    with pytest.raises(UnknownTimeZone, match="Unknown time zone 'Mars/Olympus'"):
        zone("Mars/Olympus")
    for bad in ("", " UTC", "/etc/localtime", "../UTC"):
        with pytest.raises(UnknownTimeZone):
            zone(bad)


@pytest.mark.parametrize(
    ("zone_name", "first_send", "hours_to_midnight"),
    [
        # 22:00 on the spring-forward day in New York: 2 hours to its midnight, as ever.
        ("America/New_York", ms(2026, 3, 9, 2), 2),
        # 00:30 on the fall-back day, before 01:00-02:00 comes twice: 24.5 hours to midnight.
        ("America/New_York", ms(2026, 11, 1, 4, 30), 24.5),
        ("Australia/Lord_Howe", ms(2026, 4, 4, 13, 0), 24.5),
        ("Asia/Kathmandu", ms(2026, 3, 8, 12), 6.25),
    ],
)
def test_a_calendar_day_rule_frees_at_the_users_next_midnight(
    limiter: Limiter, zone_name: str, first_send: int, hours_to_midnight: float
) -> None:
    daily = rule(1, limit=1, unit="day")
    first = rule_set(daily, now_ms=first_send, zone=zone_name)
    assert limiter.acquire("push", [(1, "a")], first, now_ms=first_send)[0].allowed
    later = first_send + 60_000
    refused = limiter.acquire(
        "push", [(1, "b")], rule_set(daily, now_ms=later, zone=zone_name), now_ms=later
    )[0]
    assert refused.reason == "daily_cap"
    assert refused.retry_after == pytest.approx(hours_to_midnight * 3600 - 60)
    after = first_send + round(hours_to_midnight * HOUR_MS)
    next_day = limiter.acquire(
        "push", [(1, "c")], rule_set(daily, now_ms=after, zone=zone_name), now_ms=after
    )[0]
    assert next_day.allowed
