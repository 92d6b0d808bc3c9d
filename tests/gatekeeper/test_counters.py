"""The buffered Redis counters (gatekeeper/lib/counters.py), against the tests' Redis: counts
held in process until a flush or a second after the last, one hash or one a UTC day, whole or
fractional, expiring or not, and a failed write dropped rather than raised."""

import datetime as dt
import logging

import pytest
import redis

from bench.servers import free_port
from gatekeeper.lib import counters
from gatekeeper.lib.counters import RedisCounters
from gatekeeper.lib.redis_client import reset_redis_clients
from worker import stats, timings


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The counters' monotonic clock, moved by the test (no sleeping for the second to pass)."""
    now = [1000.0]
    monkeypatch.setattr(counters.time, "monotonic", lambda: now[0])
    return now


def test_counts_are_held_until_a_second_has_passed_then_written_together(
    redis_client: redis.Redis, clock: list[float], settings
) -> None:
    seconds = RedisCounters("test:seconds")
    seconds.add({"a": 0.25})
    seconds.add({"a": 0.5, "b": 2.0})
    assert redis_client.hgetall(f"{settings.GATEKEEPER_KEY_PREFIX}test:seconds") == {}
    clock[0] += 1.0
    seconds.add({"b": 1.0})  # a second since the last write: this add writes all three
    assert seconds.read() == {"a": 0.75, "b": 3.0}
    assert redis_client.ttl(seconds.key()) == -1  # a counter without expiry never goes


def test_flush_writes_at_once_and_discard_forgets(redis_client: redis.Redis, clock) -> None:
    answers = RedisCounters("test:answers", whole=True)
    answers.add({"sent": 2})
    answers.discard_pending()
    answers.add({"sent": 3})
    answers.flush()
    answers.flush()  # nothing left: writes nothing more
    assert answers.read() == {"sent": 3}
    assert isinstance(answers.read()["sent"], int)


def test_per_day_counters_keep_a_hash_a_day_that_expires(
    redis_client: redis.Redis, clock, settings
) -> None:
    days = RedisCounters("test:days", per_day=True, expire_seconds=3600, whole=True)
    monday, tuesday = dt.date(2026, 3, 2), dt.date(2026, 3, 3)
    days.add({"x": 1}, day=monday)
    days.add({"x": 2, "y": 1}, day=tuesday)
    days.add({"x": 4}, day=monday)
    days.flush()
    assert days.key(monday) == f"{settings.GATEKEEPER_KEY_PREFIX}test:days:2026-03-02"
    assert days.read(monday) == {"x": 5}
    assert days.read(tuesday) == {"x": 2, "y": 1}
    assert 0 < redis_client.ttl(days.key(monday)) <= 3600
    assert 0 < redis_client.ttl(days.key(tuesday)) <= 3600


def test_a_day_is_asked_of_per_day_counters_and_refused_by_the_others() -> None:
    with pytest.raises(ValueError, match="kept per day: say which"):
        RedisCounters("test:days", per_day=True).key()
    with pytest.raises(ValueError, match="not kept per day"):
        RedisCounters("test:one").add({"x": 1.0}, day=dt.date(2026, 3, 2))
    with pytest.raises(ValueError, match="expire_seconds must be positive"):
        RedisCounters("test:one", expire_seconds=0)


def test_counts_without_a_day_go_to_today_utc_which_turns_at_midnight(monkeypatch) -> None:
    now = [dt.datetime(2026, 11, 28, 23, 59, 59, 500000, tzinfo=dt.UTC).timestamp()]
    monkeypatch.setattr(counters.time, "time", lambda: now[0])
    days = RedisCounters("test:days", per_day=True)
    assert days.today() == dt.date(2026, 11, 28)
    now[0] += 0.5
    assert days.today() == dt.date(2026, 11, 29)


def test_a_write_redis_refuses_is_logged_and_dropped(
    redis_client: redis.Redis, settings, caplog: pytest.LogCaptureFixture
) -> None:
    seconds = RedisCounters("test:seconds")
    seconds.add({"a": 1.0})
    live = settings.REDIS_URL
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    reset_redis_clients()
    try:
        with caplog.at_level(logging.WARNING, logger="gatekeeper.lib.counters"):
            seconds.flush()  # does not raise
    finally:
        settings.REDIS_URL = live
        reset_redis_clients()
    assert "Could not write the counters of test:seconds" in caplog.text
    seconds.flush()
    assert seconds.read() == {}  # dropped, not held for the next write


class _Decision:
    def __init__(self, segment: str | None, reason: str) -> None:
        self.segment, self.reason = segment, reason


def test_the_decisions_per_day_are_whole_counts_in_the_days_hash(
    redis_client: redis.Redis, settings
) -> None:
    day = dt.date(2026, 3, 2)
    decisions = [_Decision(None, "allowed"), _Decision("unknown", "allowed")]
    stats.record(channel="email", decisions=[*decisions, _Decision("vip", "blocked")], day=day)
    stats.flush()
    key = f"{settings.GATEKEEPER_KEY_PREFIX}stats:2026-03-02"
    # A decision without a segment counts as `unknown`'s, with the rest of that segment's.
    assert redis_client.hgetall(key) == {b"unknown|email|allowed": b"2", b"vip|email|blocked": b"1"}
    assert 0 < redis_client.ttl(key) <= stats.KEEP_DAYS * 86400
    assert stats.stats_for_day(day) == {
        ("unknown", "email", "allowed"): 2, ("vip", "email", "blocked"): 1
    }  # fmt: skip


def test_one_decision_a_call_counts_under_the_fields_a_batch_does(
    redis_client: redis.Redis, settings
) -> None:
    day = dt.date(2026, 3, 2)
    stats.record(channel="email", decisions=[_Decision(None, "allowed")], day=day)
    stats.record(channel="email", decisions=[_Decision("unknown", "allowed")], day=day)
    stats.record(channel="push", decisions=[_Decision("vip", "allowed")], day=day)
    stats.record(channel="email", decisions=[_Decision(None, "allowed")] * 3, day=day)
    stats.record(channel="email", decisions=[], day=day)  # counts nothing
    stats.flush()
    # The one-decision path names the fields as the batch's does: one field for both.
    assert redis_client.hgetall(f"{settings.GATEKEEPER_KEY_PREFIX}stats:2026-03-02") == {
        b"unknown|email|allowed": b"5", b"vip|push|allowed": b"1"
    }  # fmt: skip


def test_add_one_adds_to_what_add_holds(redis_client: redis.Redis, clock) -> None:
    days = RedisCounters("test:one", per_day=True, whole=True)
    monday = dt.date(2026, 3, 2)
    days.add({"x": 2}, day=monday)
    days.add_one("x", 3, day=monday)
    days.add_one("y", 1, day=monday)
    assert days.read(monday) == {}  # held like any add
    clock[0] += 1.0
    days.add_one("x", 1, day=monday)  # a second since the last write: writes them all
    assert days.read(monday) == {"x": 6, "y": 1}
    with pytest.raises(ValueError, match="not kept per day"):
        RedisCounters("test:flat").add_one("x", 1, day=monday)


def test_the_worker_step_seconds_are_one_hash_without_expiry(
    redis_client: redis.Redis, settings
) -> None:
    timings.add("gate", 0.5)
    timings.add("gate", 0.25)
    timings.flush()
    key = f"{settings.GATEKEEPER_KEY_PREFIX}worker:seconds"
    assert timings.timings_key() == key
    assert redis_client.hgetall(key) == {b"gate": b"0.75"}
    assert redis_client.ttl(key) == -1
    assert timings.timings_read()["gate"] == 0.75
    assert timings.timings_read()["dispatch"] == 0.0
