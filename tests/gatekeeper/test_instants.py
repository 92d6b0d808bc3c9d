"""One convention for instants (gatekeeper/lib/instants.py): an aware datetime at every
boundary, epoch milliseconds inside the engine, and a boundary given the one for the other (or a
naive datetime) refusing it rather than judging leases and expiries years off."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gatekeeper.lib.instants import (
    instant_checked,
    instant_from_ms,
    instant_from_text,
    instant_ms,
    instant_or_now,
    ms_or_now,
)
from limits.privacy.erasure import erasures_due
from worker.chunks import chunks_due
from worker.tasks import send_chunks_due

AT = datetime(2026, 3, 29, 1, 30, 0, 123000, tzinfo=UTC)


def test_epoch_milliseconds_and_datetimes_convert_both_ways_exactly() -> None:
    assert instant_ms(AT) == 1774747800123
    assert instant_from_ms(1774747800123) == AT
    paris = AT.astimezone(timezone(timedelta(hours=1)))
    assert instant_ms(paris) == instant_ms(AT)  # the same instant whatever its offset
    assert instant_from_ms(-1) == datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)


def test_a_number_or_a_naive_datetime_is_not_an_instant() -> None:
    with pytest.raises(TypeError, match="is not a datetime"):
        instant_checked(1774747800123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is not a datetime"):
        instant_or_now(1774747800.123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no UTC offset"):
        instant_checked(datetime(2026, 3, 29, 1, 30))
    with pytest.raises(TypeError, match="is not epoch milliseconds"):
        instant_from_ms(AT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no UTC offset"):
        instant_from_text("2026-03-29T01:30:00")
    assert instant_from_text("2026-03-29T03:30:00.123+02:00") == AT
    assert instant_or_now(AT) is AT
    assert instant_or_now(None).tzinfo is not None


def test_the_engines_clock_is_the_one_given_or_this_processs_in_milliseconds() -> None:
    assert ms_or_now(1_780_000_000_123) == 1_780_000_000_123
    before = round(datetime.now(UTC).timestamp() * 1000)
    assert before - 1000 <= ms_or_now(None) <= before + 60_000
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        ms_or_now(1_780_000_000.5)  # type: ignore[arg-type]


@pytest.mark.django_db
def test_a_service_given_milliseconds_or_local_time_refuses_it() -> None:
    with pytest.raises(TypeError, match="is not a datetime"):
        chunks_due(now=instant_ms(AT))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no UTC offset"):
        erasures_due(now=datetime(2026, 3, 29, 1, 30))
    assert chunks_due(now=AT) == []
    with pytest.raises(ValueError, match="has no UTC offset"):
        send_chunks_due("2026-03-29T01:30:00")  # a task's `now` comes as text
