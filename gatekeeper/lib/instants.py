"""Instants, one convention: an aware `datetime` at every service, task and view boundary;
epoch milliseconds (an int, named `..._ms`) only inside the limiter's engine (limits/engine/) and
what the gate hands it (its stages, the ledger's stream entries). The conversions between the two,
the check a boundary makes of the `now` it is given (a number or a naive datetime is refused: a
mix-up of seconds, milliseconds and local time would judge leases and expiries hours or years
off), and an instant typed in a form (the admin's start and expiry of a send job, a what-if
move): ISO 8601 with its UTC offset, read as the REST bodies read it."""

import time
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

from gatekeeper.lib.bodies import datetime_from_text


def instant_checked(now: datetime) -> datetime:
    """`now` as given, when it is an aware datetime; a TypeError for anything else (epoch
    seconds or milliseconds, a date), a ValueError for a naive datetime."""
    if not isinstance(now, datetime):
        raise TypeError(
            f"now={now!r} is not a datetime: an instant is an aware datetime here "
            "(instant_from_ms converts epoch milliseconds)"
        )
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now={now.isoformat()} has no UTC offset")
    return now


def instant_or_now(now: datetime | None) -> datetime:
    """`now` (tests, replays), checked by instant_checked; None: this process's clock."""
    return timezone.now() if now is None else instant_checked(now)


def instant_from_text(text: str) -> datetime:
    """An instant carried as text (a task's argument: ISO 8601 with its UTC offset, as JSON
    carries it); a ValueError for a bad one or one without its offset."""
    instant = datetime_from_text(text)
    if instant.tzinfo is None:
        raise ValueError(f"now={text!r} has no UTC offset")
    return instant


def instant_ms(at: datetime) -> int:
    """`at` as the engine counts time: epoch milliseconds."""
    return round(instant_checked(at).timestamp() * 1000)


def instant_from_ms(ms: int) -> datetime:
    """Epoch milliseconds (the engine's) as an aware datetime in UTC."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise TypeError(f"{ms!r} is not epoch milliseconds (an int)")
    return datetime.fromtimestamp(ms // 1000, UTC) + timedelta(milliseconds=ms % 1000)


_Ms = TypeVar("_Ms", bound=int | None)


def ms_checked(ms: _Ms) -> _Ms:
    """Epoch milliseconds (an int; None passes, where it means a clock's own) as given; a
    TypeError for a float or a bool: epoch seconds passed for milliseconds would judge every
    window a thousand times off."""
    if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int)):
        raise TypeError(f"now_ms={ms!r} is not epoch milliseconds (an int)")
    return ms


def ms_or_now(now_ms: int | None) -> int:
    """`now_ms` as given (checked by ms_checked); None: this process's clock, in epoch
    milliseconds."""
    checked = ms_checked(now_ms)
    return round(time.time() * 1000) if checked is None else checked


class InstantField(forms.CharField):
    """An instant typed as ISO 8601 with its UTC offset; empty: None. The service says whether
    it may be (in the future, not too far ahead)."""

    def clean(self, value: Any) -> Any:
        text = (super().clean(value) or "").strip()
        if not text:
            return None
        try:
            return datetime_from_text(text)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


INSTANT_FORMAT = "ISO 8601 with its UTC offset (2026-06-11T09:00:00+02:00)"


def instant_text(at: datetime) -> str:
    """A ledger time as the API writes it: ISO 8601 in UTC, milliseconds (the gate's clock),
    more digits only when it has them."""
    spec = "milliseconds" if at.microsecond % 1000 == 0 else "microseconds"
    return at.isoformat(timespec=spec).replace("+00:00", "Z")
