"""Quiet hours: when a marketing send must wait for the user's morning, read on the user's own
clock, and when it may go out instead.

An entry applies to the users of one segment (or of every segment) on one channel (or `all`
channels). It names a local start and end (`21:00` to `08:00` wraps midnight) and a spread in
minutes. A send is quiet when the user's local clock reads a time in [start, end) of any entry
that applies; all that apply count (as with cap rules: the strictest wins). It is released at
the first instant after which no entry holds it, plus the user's own offset in [0, spread): a
hash of the user id, the same every time, so that the morning does not start with one burst.

The clock is the wall clock of the user's zone, so around DST changes:
- a window's end that does not exist that day (New York's 02:30 on the spring-forward day) is
  reached at the first instant the clock reads later than it: the end of the gap (03:00 EDT);
- an hour that happens twice is read as the clock reads it: with quiet hours ending at 01:30, a
  send at 01:10 EDT waits until 01:30 EDT, and one at 01:10 EST, an hour later, waits until
  01:30 EST.
Decided in Python, before Redis is asked: a quiet send costs Redis nothing.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from gatekeeper.lib.instants import instant_from_ms, instant_ms, ms_checked
from gatekeeper.lib.words import count
from gatekeeper.lib.zones import zone
from limits.channels import ALL, channel_problem, noun, scope_label

SPREAD_MAX = 720  # minutes: 12 hours
CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
CLOCK_WORDS = "A time of day as HH:MM, 00:00 to 23:59."
DAY_MINUTES = 1440


def minutes_from_text(text: str) -> int:
    """The one rule for a time of day typed as text ("21:00"): minutes after midnight.
    ValueError (saying why) otherwise."""
    found = CLOCK.fullmatch(text)
    if found is None:
        shown = text if len(text) <= 20 else text[:17] + "..."
        raise ValueError(f"'{shown}' is not a time of day. {CLOCK_WORDS}")
    return int(found[1]) * 60 + int(found[2])


def clock_text(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True, slots=True)
class QuietView:
    """An enabled quiet-hours entry, as decisions need it. Times are minutes after midnight."""

    id: int
    segment: str | None
    channel: str
    start: int
    end: int
    spread_minutes: int

    @property
    def wraps(self) -> bool:
        return self.end < self.start

    def holds(self, minute: float) -> bool:
        """Whether a local clock reading (minutes after midnight, with fractions) is quiet."""
        if self.wraps:
            return minute >= self.start or minute < self.end
        return self.start <= minute < self.end


@dataclass
class QuietFields:
    """A quiet-hours entry's editable fields, as a caller gives them (REST body, admin form)."""

    segment: str | None  # a slug; None: every segment
    channel: str
    start: str  # "HH:MM"
    end: str
    spread_minutes: int
    enabled: bool = True


def quiet_problems(fields: QuietFields, *, segments: Iterable[str]) -> dict[str, list[str]]:
    """What is wrong with a quiet-hours entry, by field (the REST API's names); empty when
    nothing is. The one rule for quiet hours: REST, admin and commands all use it."""
    problems: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    known = list(segments)
    if fields.segment is not None and fields.segment not in known:
        add("segment", f"No segment '{fields.segment}'. Known: {', '.join(known) or 'none'}.")
    if (unknown := channel_problem(fields.channel, scope=True)) is not None:
        add("channel", unknown)
    clock: dict[str, int] = {}
    for name in ("start", "end"):
        try:
            clock[name] = minutes_from_text(getattr(fields, name))
        except ValueError as exc:
            add(name, str(exc))
    if len(clock) == 2 and clock["start"] == clock["end"]:
        add("end", "The end must differ from the start: a window of no time, or of every hour.")
    spread = fields.spread_minutes
    if not 0 <= spread <= SPREAD_MAX:
        add("spread_minutes", f"From 0 to {SPREAD_MAX} minutes ({SPREAD_MAX // 60} hours).")
    elif len(clock) == 2 and clock["start"] != clock["end"]:
        open_minutes = (clock["start"] - clock["end"]) % DAY_MINUTES
        if spread >= open_minutes:
            add(
                "spread_minutes",
                f"Releases spread over {spread} minutes would reach the next quiet hours: the "
                f"day outside them is {_minutes_words(open_minutes)} long. Use less than "
                f"{open_minutes}.",
            )
    return problems


def _minutes_words(minutes: int) -> str:
    hours, rest = divmod(minutes, 60)
    if not hours:
        return count(rest, "minute")
    return count(hours, "hour") + (f" {count(rest, 'minute')}" if rest else "")


def quiet_describe(entry: QuietView, *, segment_names: Mapping[str, str] | None = None) -> str:
    """An entry in plain words: 'Gold users: no marketing emails from 21:00 to 08:00 (the next
    morning), in their own time zone; sends held until then go out over 30 minutes'."""
    names = segment_names or {}
    who = (
        f"{names.get(entry.segment, entry.segment)} users"
        if entry.segment is not None
        else "Every user"
    )
    what = "messages" if entry.channel == ALL else noun(entry.channel, 2)
    span = f"from {clock_text(entry.start)} to {clock_text(entry.end)}"
    if entry.wraps:
        span += " (the next morning)"
    text = f"{who}: no marketing {what} {span}, in their own time zone"
    if entry.spread_minutes:
        return text + (
            f"; sends held until then go out over {_minutes_words(entry.spread_minutes)}"
        )
    return text + "; sends held until then go out at once"


def quiet_as_json(entry: Any) -> dict[str, Any]:
    """A QuietHours row as the REST API shows it (and as its history keeps it)."""
    return {
        "id": entry.pk,
        "segment": entry.segment.slug if entry.segment is not None else None,
        "channel": entry.channel,
        "start": f"{entry.start:%H:%M}",
        "end": f"{entry.end:%H:%M}",
        "spread_minutes": entry.spread_minutes,
        "enabled": entry.enabled,
    }


def quiet_view(entry: Any) -> QuietView:
    """A QuietHours row as decisions read it."""
    return QuietView(
        id=entry.pk,
        segment=entry.segment.slug if entry.segment is not None else None,
        channel=entry.channel,
        start=entry.start.hour * 60 + entry.start.minute,
        end=entry.end.hour * 60 + entry.end.minute,
        spread_minutes=entry.spread_minutes,
    )


# --- when a send may go out ----------------------------------------------------------------


def user_offset(user_id: int, spread_seconds: int) -> int:
    """A user's own place in a spread, in whole seconds [0, spread): the same every time, and
    even over users whatever their ids (a splitmix64 finalizer over the id)."""
    if spread_seconds <= 0:
        return 0
    x = (user_id + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return x % spread_seconds


def _reading(at_ms: int, tz: ZoneInfo) -> datetime:
    """The local clock at an instant, epoch ms (naive: what the clock shows)."""
    return instant_from_ms(at_ms).astimezone(tz).replace(tzinfo=None)


def _minute_of(reading: datetime) -> float:
    return reading.hour * 60 + reading.minute + (reading.second + reading.microsecond / 1e6) / 60


def _first_reading_at_least(wall: datetime, after_ms: int, tz: ZoneInfo) -> int:
    """The first instant (epoch ms) after `after_ms` at which the clock of `tz` reads `wall` or
    later."""
    # zoneinfo maps a wall time to an instant with each of the two offsets around it (fold);
    # when the wall time exists, one of them reads it back; when it falls in a gap, the
    # answer lies between the two: the gap's end, found by bisection to the millisecond.
    candidates = []
    for fold in (0, 1):
        instant = instant_ms(wall.replace(tzinfo=tz, fold=fold))
        if instant > after_ms and _reading(instant, tz) == wall:
            candidates.append(instant)
    if candidates:
        return min(candidates)
    low = instant_ms(wall.replace(tzinfo=tz, fold=1))  # the later offset: reads before `wall`
    high = instant_ms(wall.replace(tzinfo=tz, fold=0))  # the earlier offset: reads after it
    low, high = min(low, high), max(low, high)
    low = max(low, after_ms)
    while high - low > 1:
        middle = (low + high) // 2
        if _reading(middle, tz) >= wall:
            high = middle
        else:
            low = middle
    return high


def _window_end(entry: QuietView, reading: datetime, now_ms: int, tz: ZoneInfo) -> int:
    """The instant (epoch ms) an entry that holds the clock `reading` (at `now_ms`) lets go."""
    day: date = reading.date()
    if entry.wraps and _minute_of(reading) >= entry.start:
        day += timedelta(days=1)
    wall = datetime.combine(day, time(entry.end // 60, entry.end % 60))
    return _first_reading_at_least(wall, now_ms, tz)


def quiet_until(entries: Sequence[QuietView], zone_name: str, now_ms: int) -> tuple[int, int]:
    """When the entries that apply to a send at `now_ms` release it: (epoch ms, the spread of
    the entry that let go last, in seconds); (now_ms, 0) when none holds it now. Chained: the
    end of one entry inside another waits for that one too."""
    ms_checked(now_ms)
    if not entries:
        return now_ms, 0
    tz = zone(zone_name)
    at, spread = now_ms, 0
    for _ in range(len(entries) + 1):
        reading = _reading(at, tz)
        minute = _minute_of(reading)
        holding = [entry for entry in entries if entry.holds(minute)]
        if not holding:
            return at, spread
        ends = [(_window_end(entry, reading, at, tz), entry) for entry in holding]
        at, last = max(ends, key=lambda pair: pair[0])
        spread = last.spread_minutes * 60
    return at, spread


def release_at(end_ms: int, spread_seconds: int, user_id: int) -> int:
    """When a send held until `end_ms` goes out to `user_id` (epoch ms): the end plus the
    user's own offset."""
    return end_ms + user_offset(user_id, spread_seconds) * 1000


# --- quiet hours as an authored record (limits/policy/authored.py) --------------------------------

QUIET_SHOWN = (
    ("segment", "segment"),
    ("channel", "channel"),
    ("start", "start"),
    ("end", "end"),
    ("spread_minutes", "spread"),
    ("enabled", "enabled"),
)


def quiet_read(entry: Any) -> QuietFields:
    """A stored entry's editable fields (the base of a partial change)."""
    return QuietFields(
        segment=entry.segment.slug if entry.segment is not None else None,
        channel=entry.channel,
        start=f"{entry.start:%H:%M}",
        end=f"{entry.end:%H:%M}",
        spread_minutes=entry.spread_minutes,
        enabled=entry.enabled,
    )


def quiet_apply(entry: Any, fields: QuietFields, segment: Any) -> None:
    """Put checked fields on a quiet-hours row (`segment`: the fields' Segment, or None)."""
    entry.segment = segment
    entry.channel = fields.channel
    start, end = minutes_from_text(fields.start), minutes_from_text(fields.end)
    entry.start, entry.end = time(start // 60, start % 60), time(end // 60, end % 60)
    entry.spread_minutes = fields.spread_minutes
    entry.enabled = fields.enabled


def quiet_json_describe(data: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """An entry as its history keeps it (quiet_as_json), in plain words."""
    view = QuietView(
        id=data.get("id") or 0,
        segment=data.get("segment"),
        channel=data.get("channel", ""),
        start=minutes_from_text(data.get("start", "00:00")),
        end=minutes_from_text(data.get("end", "00:00")),
        spread_minutes=data.get("spread_minutes", 0),
    )
    return quiet_describe(view, segment_names=names)


def quiet_value_words(key: str, value: Any, names: Mapping[str, str]) -> str:
    """One field of an entry as its history keeps it, in words."""
    if key == "segment":
        return "every segment" if value is None else names.get(value, value)
    if key == "channel":
        return scope_label(value) if value else "none"
    if key == "spread_minutes":
        return "at once" if not value else f"{value} min"
    if key == "enabled":
        return "yes" if value else "no"
    return "none" if value in (None, "") else str(value)
