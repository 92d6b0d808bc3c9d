"""The one rule for a time zone named by a caller, a form, a segment or a setting: an IANA name
that this machine's zone database (or the tzdata package) knows."""

from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django.core.exceptions import ValidationError

from gatekeeper.lib.problems import Problem

EXAMPLE = "Europe/Paris"


class UnknownTimeZone(Problem):
    """A name that is no zone; the message names it and says what a zone's name is."""


def _unknown(name: str) -> UnknownTimeZone:
    shown = name if len(name) <= 64 else name[:61] + "..."
    return UnknownTimeZone(f"Unknown time zone '{shown}'. Use an IANA name such as {EXAMPLE}.")


@lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The IANA zone called `name`; UnknownTimeZone, naming it, when there is none."""
    # ZoneInfo also reads paths; only plain names are zones here.
    if not name or name != name.strip() or "\x00" in name or name.startswith(("/", ".")):
        raise _unknown(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise _unknown(name) from None


def time_zone_checked(name: str, *, field: str) -> ZoneInfo:
    """`zone(name)`, its UnknownTimeZone naming `field` (a request's `time_zone`)."""
    try:
        return zone(name)
    except UnknownTimeZone as exc:
        raise UnknownTimeZone(exc.message, field=field) from None


def validate_time_zone(value: str) -> None:
    try:
        zone(value)
    except UnknownTimeZone as exc:
        raise ValidationError(str(exc), code="time_zone") from None


@lru_cache(maxsize=1)
def zone_names() -> tuple[str, ...]:
    """Every known zone, sorted (for forms and the schema)."""
    return tuple(sorted(available_timezones()))
