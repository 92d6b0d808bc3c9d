"""Quiet hours on the user's own clock: windows that wrap midnight, DST days, odd offsets, the
spread of releases, and the one rule for a valid entry."""

from collections import Counter
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from gatekeeper.lib.instants import instant_ms
from limits.engine.quiet import (
    QuietFields,
    QuietView,
    minutes_from_text,
    quiet_describe,
    quiet_problems,
    quiet_until,
    release_at,
    user_offset,
)
from limits.engine.table import PolicyTable

NEW_YORK = "America/New_York"


def entry(start: str, end: str, spread: int = 0, *, segment=None, channel="email") -> QuietView:
    return QuietView(
        id=1,
        segment=segment,
        channel=channel,
        start=minutes_from_text(start),
        end=minutes_from_text(end),
        spread_minutes=spread,
    )


HOUR_MS = 3_600_000


def at(zone: str, *wall: int, fold: int = 0) -> int:
    """The instant (epoch ms) a local clock in `zone` reads `wall` (fold 1: the second time it
    does)."""
    return instant_ms(datetime(*wall).replace(tzinfo=ZoneInfo(zone), fold=fold))  # type: ignore[arg-type]


def utc(*wall: int) -> int:
    return instant_ms(datetime(*wall).replace(tzinfo=UTC))  # type: ignore[arg-type]


def until(entries, zone: str, now_ms: int) -> int | None:
    end, _ = quiet_until(entries, zone, now_ms)
    return None if end == now_ms else end


NIGHT = entry("21:00", "08:00")


@pytest.mark.parametrize(
    ("wall", "released"),
    [
        ((2026, 6, 10, 20, 59), None),
        ((2026, 6, 10, 21, 0), (2026, 6, 11, 8, 0)),
        ((2026, 6, 10, 23, 59), (2026, 6, 11, 8, 0)),
        ((2026, 6, 11, 0, 0), (2026, 6, 11, 8, 0)),
        ((2026, 6, 11, 7, 59), (2026, 6, 11, 8, 0)),
        ((2026, 6, 11, 8, 0), None),
        ((2026, 6, 11, 12, 0), None),
    ],
)
def test_a_window_that_wraps_midnight_holds_from_its_start_to_the_next_morning(wall, released):
    got = until([NIGHT], "Europe/Paris", at("Europe/Paris", *wall))
    assert got == (None if released is None else at("Europe/Paris", *released))


def test_a_window_within_one_day():
    lunch = entry("12:00", "14:00")
    assert until([lunch], "UTC", utc(2026, 6, 10, 11, 59)) is None
    assert until([lunch], "UTC", utc(2026, 6, 10, 13, 30)) == utc(2026, 6, 10, 14, 0)
    assert until([lunch], "UTC", utc(2026, 6, 10, 14, 0)) is None


def test_the_user_zone_decides_not_the_server():
    now = utc(2026, 6, 10, 23, 0)  # 19:00 in New York, 08:00 in Tokyo, 01:00 in Paris
    assert until([NIGHT], NEW_YORK, now) is None
    assert until([NIGHT], "Asia/Tokyo", now) is None
    assert until([NIGHT], "Europe/Paris", now) == at("Europe/Paris", 2026, 6, 11, 8, 0)


def test_kathmandu_at_plus_five_forty_five():
    now = utc(2026, 6, 10, 2, 0)  # 07:45 in Kathmandu
    assert until([NIGHT], "Asia/Kathmandu", now) == utc(2026, 6, 10, 2, 15)  # 08:00 local
    assert until([NIGHT], "Asia/Kathmandu", utc(2026, 6, 10, 2, 15)) is None
    assert until([NIGHT], "Asia/Kathmandu", utc(2026, 6, 10, 15, 14)) is None  # 20:59
    assert until([NIGHT], "Asia/Kathmandu", utc(2026, 6, 10, 15, 15)) == utc(2026, 6, 11, 2, 15)


def test_new_york_spring_forward_a_night_is_an_hour_shorter():
    # 8 March 2026: 02:00 EST is followed by 03:00 EDT.
    start = at(NEW_YORK, 2026, 3, 7, 22, 0)
    assert until([NIGHT], NEW_YORK, start) == at(NEW_YORK, 2026, 3, 8, 8, 0)
    assert at(NEW_YORK, 2026, 3, 8, 8, 0) - start == 9 * HOUR_MS  # 22:00 to 08:00 is 9 hours


def test_new_york_spring_forward_an_end_that_does_not_exist_is_reached_at_the_gap_end():
    early = entry("21:00", "02:30")  # 02:30 does not happen on 8 March 2026
    now = at(NEW_YORK, 2026, 3, 8, 1, 50)  # EST
    assert until([early], NEW_YORK, now) == utc(2026, 3, 8, 7, 0)  # 03:00 EDT
    assert until([early], NEW_YORK, utc(2026, 3, 8, 7, 0)) is None


def test_new_york_spring_forward_a_start_in_the_gap_holds_from_the_gap_end():
    late = entry("02:15", "05:00")
    assert until([late], NEW_YORK, utc(2026, 3, 8, 6, 59)) is None  # 01:59 EST
    assert until([late], NEW_YORK, utc(2026, 3, 8, 7, 0)) == at(NEW_YORK, 2026, 3, 8, 5, 0)


def test_new_york_fall_back_the_repeated_hour_is_read_as_the_clock_reads_it():
    # 1 November 2026: 01:00-02:00 happens twice, first in EDT, then in EST.
    short = entry("21:00", "01:30")
    first = at(NEW_YORK, 2026, 11, 1, 1, 10, fold=0)
    second = at(NEW_YORK, 2026, 11, 1, 1, 10, fold=1)
    assert second - first == HOUR_MS
    assert until([short], NEW_YORK, first) == at(NEW_YORK, 2026, 11, 1, 1, 30, fold=0)
    assert until([short], NEW_YORK, at(NEW_YORK, 2026, 11, 1, 1, 45, fold=0)) is None
    assert until([short], NEW_YORK, second) == at(NEW_YORK, 2026, 11, 1, 1, 30, fold=1)


def test_a_clock_in_seconds_is_refused():
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        quiet_until([NIGHT], NEW_YORK, utc(2026, 6, 10, 23, 0) / 1000)  # type: ignore[arg-type]


def test_new_york_fall_back_a_night_is_an_hour_longer():
    start = at(NEW_YORK, 2026, 10, 31, 22, 0)
    assert quiet_until([NIGHT], NEW_YORK, start)[0] - start == 11 * HOUR_MS


def test_lord_howe_shifts_by_thirty_minutes():
    # 5 April 2026, 02:00 LHDT (+11) becomes 01:30 LHST (+10:30): 01:30-02:00 happens twice.
    zone = "Australia/Lord_Howe"
    short = entry("22:00", "01:45")
    first = at(zone, 2026, 4, 5, 1, 40, fold=0)
    second = at(zone, 2026, 4, 5, 1, 40, fold=1)
    assert second - first == HOUR_MS // 2
    assert until([short], zone, first) == at(zone, 2026, 4, 5, 1, 45, fold=0)
    assert until([short], zone, second) == at(zone, 2026, 4, 5, 1, 45, fold=1)


def test_entries_that_overlap_release_when_the_last_lets_go():
    evening, night = entry("20:00", "23:00"), entry("22:00", "07:00", spread=10)
    end, spread = quiet_until([evening, night], "UTC", utc(2026, 6, 10, 20, 30))
    assert (end, spread) == (utc(2026, 6, 11, 7, 0), 600)


def test_each_user_has_the_same_offset_every_time_within_the_spread():
    offsets = [user_offset(user_id, 1800) for user_id in range(1000)]
    assert offsets == [user_offset(user_id, 1800) for user_id in range(1000)]
    assert all(0 <= o < 1800 for o in offsets)
    assert user_offset(42, 0) == 0
    assert release_at(1_000_000, 0, 42) == 1_000_000
    assert release_at(1_000_000, 1800, 42) == 1_000_000 + user_offset(42, 1800) * 1000


@pytest.mark.parametrize("ids", ["sequential", "sparse"])
def test_ten_thousand_users_over_thirty_minutes_no_minute_gets_twice_the_mean(ids):
    users = range(1, 10_001) if ids == "sequential" else range(7, 7 + 10_000 * 7919, 7919)
    end = utc(2026, 6, 11, 8, 0)
    minutes = Counter((release_at(end, 1800, u) - end) // 60_000 for u in users)
    assert set(minutes) == set(range(30))
    mean = 10_000 / 30
    assert max(minutes.values()) <= 2 * mean
    assert min(minutes.values()) >= mean / 2


def test_the_one_rule_for_an_entry_names_each_problem():
    def problems(**changes):
        fields = {
            "segment": None,
            "channel": "email",
            "start": "21:00",
            "end": "08:00",
            "spread_minutes": 30,
            **changes,
        }
        return quiet_problems(QuietFields(**fields), segments=["gold", "default"])

    assert problems() == {}
    assert problems(segment="gold", channel="all") == {}
    assert "No segment 'silver'" in problems(segment="silver")["segment"][0]
    assert "Unknown channel 'fax'" in problems(channel="fax")["channel"][0]
    assert "'25:00' is not a time of day" in problems(start="25:00")["start"][0]
    assert "'8:00' is not a time of day" in problems(end="8:00")["end"][0]
    assert "must differ" in problems(end="21:00")["end"][0]
    assert "From 0 to 720" in problems(spread_minutes=721)["spread_minutes"][0]
    assert "From 0 to 720" in problems(spread_minutes=-1)["spread_minutes"][0]
    # 13:00-12:00 leaves one hour: a 60-minute spread would release into the next night.
    assert (
        "Use less than 60"
        in problems(start="13:00", end="12:00", spread_minutes=60)["spread_minutes"][0]
    )


def test_an_entry_in_plain_words():
    gold = entry("21:00", "08:00", 30, segment="gold")
    assert quiet_describe(gold, segment_names={"gold": "Gold"}) == (
        "Gold users: no marketing emails from 21:00 to 08:00 (the next morning), in their own "
        "time zone; sends held until then go out over 30 minutes"
    )
    lunch = entry("12:00", "14:00", channel="all")
    assert quiet_describe(lunch) == (
        "Every user: no marketing messages from 12:00 to 14:00, in their own time zone; sends "
        "held until then go out at once"
    )


@pytest.mark.parametrize("zone", [NEW_YORK, "Asia/Kathmandu", "Australia/Lord_Howe"])
def test_the_answer_kept_per_minute_is_the_exact_answer_at_every_second(zone):
    # What the gate asks: the policy table keeps one answer per minute; around DST days and
    # odd offsets it must equal the exact one at any second of that minute.
    entries = (entry("21:00", "01:30", 10), entry("01:15", "02:45", 20, channel="all"))
    table = PolicyTable(rules=(), classic={}, zones={}, quiet=entries)
    days = {
        NEW_YORK: [(2026, 3, 8), (2026, 11, 1)],
        "Asia/Kathmandu": [(2026, 6, 10)],
        "Australia/Lord_Howe": [(2026, 4, 5), (2026, 10, 4)],
    }[zone]
    for day in days:
        start = at(zone, *day, 0, 0) - 4 * HOUR_MS
        for step in range(0, 8 * HOUR_MS, 37_000):
            now_ms = start + step
            exact_end, exact_spread = quiet_until(entries, zone, now_ms)
            kept = table.quiet_release(segment="gold", channel="email", zone=zone, now_ms=now_ms)
            assert kept == (None if exact_end == now_ms else (exact_end, exact_spread)), now_ms
