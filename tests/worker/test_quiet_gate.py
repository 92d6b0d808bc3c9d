"""Quiet hours at the gate: real snapshot, real rules, real Redis. A quiet send is refused with
`quiet_hours`, charged nothing, and told when to come back: the end of the window plus the
user's own place in the spread."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
import redis

from bench.servers import RedisServer
from limits.engine.limiter import Limiter
from limits.engine.quiet import QuietFields, user_offset
from limits.policy.services import QUIET_HOURS, cap_set
from segments.models import Segment
from tests.support.clocks import instant
from worker.gate import Gate, gate_check

PARIS = ZoneInfo("Europe/Paris")
NIGHT = datetime(2026, 6, 10, 23, 0, tzinfo=PARIS).timestamp()  # 23:00 in Paris
MORNING = datetime(2026, 6, 11, 8, 0, tzinfo=PARIS).timestamp()
DAY = datetime(2026, 6, 11, 12, 0, tzinfo=PARIS).timestamp()


@pytest.fixture
def snapshot(published):
    version = published(vip=(10, [1, 2], {"email": (1, None)}))
    Segment.objects.filter(slug="vip").update(time_zone="Europe/Paris")
    return version


def quiet(segment=None, channel="email", start="21:00", end="08:00", spread=30):
    return QUIET_HOURS.create(
        fields=QuietFields(
            segment=segment, channel=channel, start=start, end=end, spread_minutes=spread
        ),
        via="command",
    )


def test_a_quiet_send_is_refused_uncharged_and_told_when_it_may_go(snapshot):
    quiet("vip")
    decisions = gate_check(channel="email", requests=[(1, "a"), (2, "b")], now=instant(NIGHT))
    assert [(d.allowed, d.reason, d.segment) for d in decisions] == [
        (False, "quiet_hours", "vip")
    ] * 2
    for decision in decisions:
        offset = user_offset(decision.user_id, 1800)
        assert decision.retry_after == pytest.approx(MORNING - NIGHT + offset)
        assert decision.rule is None
    # Nothing was recorded: in the morning the daily cap of 1 still has its slot.
    later = gate_check(channel="email", requests=[(1, "a")], now=instant(DAY))[0]
    assert (later.reason, later.counts["daily"]) == ("allowed", 1)


def test_the_request_zone_overrides_the_segment_zone(snapshot):
    quiet("vip")
    tokyo, paris = gate_check(
        channel="email",
        requests=[(1, "a"), (2, "b")],
        time_zones=["Asia/Tokyo", None],  # 06:00 in Tokyo, 23:00 in Paris
        now=datetime(2026, 6, 10, 21, 0, tzinfo=UTC),
    )
    assert (tokyo.reason, paris.reason) == ("quiet_hours", "quiet_hours")
    assert tokyo.retry_after is not None and paris.retry_after is not None
    assert tokyo.retry_after < paris.retry_after


def test_quiet_hours_of_another_segment_or_channel_do_not_apply(snapshot):
    quiet("vip", channel="push")
    quiet(None, channel="email", start="01:00", end="02:00", spread=0)
    decisions = gate_check(channel="email", requests=[(1, "a"), (9, "b")], now=instant(NIGHT))
    assert [d.reason for d in decisions] == ["allowed", "allowed"]


def test_every_channel_quiet_hours_apply_to_each_channel(snapshot):
    quiet(None, channel="all")
    decisions = gate_check(
        channel="push", requests=[(9, "a")], time_zones=["Europe/Paris"], now=instant(NIGHT)
    )
    assert decisions[0].reason == "quiet_hours"


def test_transactional_and_refused_sends_keep_their_reasons(snapshot):
    quiet("vip")
    receipt = gate_check(
        channel="email", requests=[(1, "r")], category="transactional", now=instant(NIGHT)
    )
    assert receipt[0].reason == "exempt"
    gate_check(channel="email", requests=[(1, "x")], now=instant(DAY))
    mixed = gate_check(
        channel="email",
        requests=[(1, "y"), (9, "z"), (1, "w")],
        now=instant(DAY + 60),
        dry_run=True,
    )
    assert [d.reason for d in mixed] == ["daily_cap", "allowed", "daily_cap"]


def test_a_disabled_entry_holds_nobody(snapshot):
    entry = quiet("vip")
    QUIET_HOURS.update(row=entry, changes={"enabled": False}, via="command")
    assert (
        gate_check(channel="email", requests=[(1, "a")], now=instant(NIGHT))[0].reason == "allowed"
    )


@pytest.mark.processes
def test_quiet_sends_cost_redis_nothing(snapshot, tmp_path):
    # A redis-server of the test's own: its command counts are this test's alone.
    server = RedisServer(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        gate = Gate(limiter=Limiter(client, prefix="test:"), record_stats=False)
        quiet(None, channel="all")
        gate.check(channel="email", requests=[(9, "warm")], now=instant(DAY))  # loads the library
        client.config_resetstat()
        decisions = gate.check(
            channel="email", requests=[(u, f"m{u}") for u in range(100, 200)], now=instant(NIGHT)
        )
        assert {d.reason for d in decisions} == {"quiet_hours"}
        assert "cmdstat_fcall" not in client.info("commandstats")
        gate.check(channel="email", requests=[(100, "day")], now=instant(DAY))
        assert "cmdstat_fcall" in client.info("commandstats")  # what a decision would cost
        client.close()
    finally:
        server.stop()


def test_retry_after_never_comes_before_the_release(snapshot):
    quiet("vip", spread=30)
    for second in range(0, 3600, 7):
        now = NIGHT + second + 0.0004
        for decision in gate_check(
            channel="email", requests=[(1, "a"), (2, "b")], now=instant(now)
        ):
            release = MORNING + user_offset(decision.user_id, 1800)
            assert decision.retry_after is not None
            assert release <= now + decision.retry_after < release + 0.001


def test_cap_and_quiet_hours_together_in_one_batch_keep_request_order(snapshot):
    cap_set(segment=Segment.objects.get(slug="vip"), channel="email", daily=5, weekly=None)
    quiet("vip")
    decisions = gate_check(
        channel="email", requests=[(9, "a"), (1, "b"), (9, "c"), (2, "d")], now=instant(NIGHT)
    )
    assert [(d.user_id, d.reason) for d in decisions] == [
        (9, "allowed"),
        (1, "quiet_hours"),
        (9, "allowed"),
        (2, "quiet_hours"),
    ]
