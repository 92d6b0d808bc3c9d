"""The gate end to end in one process: real snapshot, real caps, real Redis."""

import datetime as dt
import logging

import pytest

from limits.policy.selectors import PolicyCache
from limits.policy.services import cap_set
from segments.models import Segment
from tests.support.clocks import instant
from worker import latency, stats
from worker.gate import Gate, GateError, gate_check, gate_release

NOW = 1_763_800_000.0


@pytest.fixture
def snapshot(published):
    return published(
        vip=(10, [1, 2], {"email": (2, 5), "all": (3, None)}),
        dormant=(20, [3], {"email": (0, 0)}),
    )


def reasons(decisions):
    return [(d.user_id, d.segment, d.reason) for d in decisions]


def test_each_user_is_gated_by_their_segments_caps_in_request_order(snapshot):
    cap_set(segment=Segment.objects.get(is_default=True), channel="email", daily=1, weekly=None)
    requests = [(3, "a"), (1, "b"), (9, "c"), (1, "d"), (1, "e"), (9, "f")]
    decisions = gate_check(channel="email", requests=requests, now=instant(NOW))
    assert reasons(decisions) == [
        (3, "dormant", "blocked"),
        (1, "vip", "allowed"),
        (9, "default", "allowed"),
        (1, "vip", "allowed"),
        (1, "vip", "daily_cap"),
        (9, "default", "daily_cap"),
    ]
    assert decisions[4].limits == {"daily": 2, "weekly": 5}
    assert decisions[4].retry_after == pytest.approx(86400)


def test_transactional_sends_are_exempt_and_not_counted(snapshot):
    decisions = gate_check(
        channel="email",
        requests=[(3, "otp1"), (3, "otp2")],
        category="transactional",
        now=instant(NOW),
    )
    assert [(d.allowed, d.reason, d.segment) for d in decisions] == [
        (True, "exempt", "dormant")
    ] * 2
    assert gate_check(channel="email", requests=[(1, "m")], now=instant(NOW))[0].counts == {
        "daily": 1,
        "weekly": 1,
    }


def test_a_repeated_message_id_is_a_duplicate(snapshot):
    gate_check(channel="email", requests=[(1, "m1")], now=instant(NOW))
    again = gate_check(channel="email", requests=[(1, "m1")], now=instant(NOW + 1))[0]
    assert (again.allowed, again.reason, again.counts["daily"]) == (True, "duplicate", 1)


def test_release_gives_the_slot_back(snapshot):
    gate_check(channel="email", requests=[(1, "a"), (1, "b")], now=instant(NOW))
    assert gate_release(channel="email", requests=[(1, "a")]) == [True]
    assert (
        gate_check(channel="email", requests=[(1, "c")], now=instant(NOW + 1))[0].reason
        == "allowed"
    )


def test_no_snapshot_means_unavailable_with_a_clear_log_line(db, redis_client, caplog):
    with caplog.at_level(logging.ERROR):
        decisions = gate_check(channel="email", requests=[(1, "a")], now=instant(NOW))
    assert [(d.allowed, d.reason) for d in decisions] == [(False, "unavailable")]
    assert "No segment snapshot is loaded" in caplog.text


def test_an_unknown_channel_or_category_is_refused(snapshot):
    with pytest.raises(GateError, match="Unknown channel 'fax'"):
        gate_check(channel="fax", requests=[(1, "a")])
    with pytest.raises(GateError, match="Unknown category 'promo'"):
        gate_check(channel="email", requests=[(1, "a")], category="promo")  # unknown on purpose


def test_a_cap_edit_governs_decisions_once_the_cache_expires(snapshot):
    cache = PolicyCache(ttl=2.0)
    gate = Gate(policy=cache, record_stats=False)
    vip = Segment.objects.get(slug="vip")
    daily = {"segment": "vip", "channel": "email"}
    assert cache.table(monotonic=100.0).classic_limits(**daily)["daily"] == 2
    cap_set(segment=vip, channel="email", daily=0, weekly=5)
    # Still cached; then read again once the TTL has passed.
    assert cache.table(monotonic=101.0).classic_limits(**daily)["daily"] == 2
    assert cache.table(monotonic=102.0).classic_limits(**daily)["daily"] == 0
    assert gate.check(channel="email", requests=[(1, "a")], now=instant(NOW))[0].reason == "blocked"


def test_decisions_are_counted_per_day_segment_channel_and_reason(snapshot):
    gate_check(channel="email", requests=[(1, "a"), (3, "b"), (9, "c")], now=instant(NOW))
    stats.flush()
    today = dt.datetime.now(dt.UTC).date()
    counts = stats.stats_for_day(today)
    assert counts[("vip", "email", "allowed")] == 1
    assert counts[("dormant", "email", "blocked")] == 1
    assert counts[("default", "email", "allowed")] == 1


def test_the_counters_and_the_histogram_are_switched_off_each_alone(snapshot):
    today = dt.datetime.now(dt.UTC).date()
    counting = Gate(record_latency=False)  # the decisions counted, the calls not timed
    counting.check(channel="email", requests=[(1, "a")], now=instant(NOW))
    stats.flush()
    latency.flush()
    assert stats.stats_for_day(today) == {("vip", "email", "allowed"): 1}
    assert latency.histograms() == {}
    timing = Gate(record_stats=False, record_latency=True)  # timed, not counted
    timing.check(channel="email", requests=[(1, "b"), (3, "c")], now=instant(NOW))
    stats.flush()
    latency.flush()
    assert stats.stats_for_day(today) == {("vip", "email", "allowed"): 1}
    ((where, (buckets, seconds)),) = latency.histograms().items()
    assert where == ("email", "2-100") and buckets[-1] == ("+Inf", 1) and seconds > 0
    assert (Gate(record_stats=False).record_latency, Gate().record_latency) == (False, True)


def test_dry_run_counts_nothing(snapshot):
    gate_check(channel="email", requests=[(1, "a")], dry_run=True, now=instant(NOW))
    stats.flush()
    assert stats.stats_for_day(dt.datetime.now(dt.UTC).date()) == {}
    assert (
        gate_check(channel="email", requests=[(1, "b")], now=instant(NOW))[0].counts["daily"] == 1
    )
