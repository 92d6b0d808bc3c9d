"""Behaviour of the sliding-log limiter against real Redis (one node and a cluster)."""

import pytest

from limits.limiter import Limiter, Limits, Policy, log_key

NOW = 1_763_800_000.0  # seconds; tests pass the clock, nothing waits for a window
DAY = 86_400.0
WEEK = 7 * DAY


def caps(daily=None, weekly=None, all_daily=None, all_weekly=None) -> Policy:
    return Policy(channel=Limits(daily, weekly), all=Limits(all_daily, all_weekly))


def send(
    limiter: Limiter, user: int, message: str, policy: Policy, at: float, channel: str = "email"
):
    return limiter.acquire(channel, [(user, message)], policy, now=at)[0]


def test_it_admits_up_to_the_daily_cap_then_refuses(limiter: Limiter) -> None:
    policy = caps(daily=2)
    first = send(limiter, 1, "m1", policy, NOW)
    second = send(limiter, 1, "m2", policy, NOW + 1)
    third = send(limiter, 1, "m3", policy, NOW + 2)
    assert (first.reason, second.reason, third.reason) == ("allowed", "allowed", "daily_cap")
    assert [first.allowed, second.allowed, third.allowed] == [True, True, False]
    assert second.counts == {"daily": 2, "weekly": 2}
    assert third.counts == {"daily": 2, "weekly": 2}
    assert third.limits == {"daily": 2, "weekly": None}
    # The oldest send leaves the window 24 h after it was made.
    assert third.retry_after == pytest.approx(DAY - 2)


def test_an_entry_exactly_24_hours_old_has_left_the_daily_window(limiter: Limiter) -> None:
    policy = caps(daily=1)
    assert send(limiter, 1, "m1", policy, NOW).reason == "allowed"
    assert send(limiter, 1, "m2", policy, NOW + DAY - 0.001).reason == "daily_cap"
    assert send(limiter, 1, "m3", policy, NOW + DAY).reason == "allowed"


def test_an_entry_exactly_7_days_old_has_left_the_weekly_window(limiter: Limiter) -> None:
    policy = caps(weekly=1)
    assert send(limiter, 1, "m1", policy, NOW).reason == "allowed"
    refused = send(limiter, 1, "m2", policy, NOW + WEEK - 0.001)
    assert refused.reason == "weekly_cap"
    assert refused.retry_after == pytest.approx(0.001)
    assert send(limiter, 1, "m3", policy, NOW + WEEK).reason == "allowed"


def test_it_refuses_when_weekly_cap_reached_although_each_day_had_room(limiter: Limiter) -> None:
    policy = caps(daily=2, weekly=3)
    for i, day in enumerate((0, 1, 2)):
        assert send(limiter, 7, f"m{i}", policy, NOW + day * DAY).reason == "allowed"
    refused = send(limiter, 7, "m9", policy, NOW + 3 * DAY)
    assert refused.reason == "weekly_cap"
    assert refused.counts == {"daily": 0, "weekly": 3}
    assert refused.retry_after == pytest.approx(4 * DAY)


def test_when_both_windows_refuse_the_reason_is_the_one_that_frees_last(limiter: Limiter) -> None:
    policy = caps(daily=1, weekly=1)
    send(limiter, 1, "m1", policy, NOW)
    refused = send(limiter, 1, "m2", policy, NOW + 10)
    assert refused.reason == "weekly_cap"
    assert refused.retry_after == pytest.approx(WEEK - 10)


def test_the_all_cap_counts_every_channel(limiter: Limiter) -> None:
    policy = caps(daily=5, all_daily=2)
    assert send(limiter, 3, "e1", policy, NOW, channel="email").reason == "allowed"
    assert send(limiter, 3, "p1", policy, NOW + 1, channel="push").reason == "allowed"
    refused = send(limiter, 3, "e2", policy, NOW + 2, channel="email")
    assert refused.reason == "daily_cap"
    assert refused.scope == "all"
    assert refused.counts == {"daily": 2, "weekly": 2}
    assert refused.limits == {"daily": 2, "weekly": None}
    # The refused send was recorded nowhere: the email log still holds one entry.
    usage = limiter.peek("email", 3, policy, now=NOW + 3)
    assert usage is not None
    assert (usage[0].daily_used, usage[1].daily_used) == (1, 2)


def test_a_refused_send_is_recorded_in_no_log(limiter: Limiter) -> None:
    policy = caps(daily=1, weekly=10)
    send(limiter, 1, "m1", policy, NOW)
    for i in range(5):
        assert send(limiter, 1, f"x{i}", policy, NOW + i).reason == "daily_cap"
    # A day later, the weekly log holds only the one admitted send.
    assert send(limiter, 1, "m2", policy, NOW + DAY).counts == {"daily": 1, "weekly": 2}


def test_no_cap_admits_everything(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, f"m{i}") for i in range(50)], caps(), now=NOW)
    assert {d.reason for d in decisions} == {"allowed"}
    assert decisions[-1].counts == {"daily": 50, "weekly": 50}


@pytest.mark.parametrize(
    ("policy", "scope"),
    [(caps(daily=0), "email"), (caps(weekly=0), "email"), (caps(all_weekly=0), "all")],
)
def test_a_zero_cap_blocks_without_a_retry_time(
    limiter: Limiter, policy: Policy, scope: str
) -> None:
    decision = send(limiter, 1, "m1", policy, NOW)
    assert (decision.allowed, decision.reason, decision.scope) == (False, "blocked", scope)
    assert decision.retry_after is None


def test_two_sends_in_the_same_millisecond_are_two_entries(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, "a"), (1, "b")], caps(daily=5), now=NOW)
    assert [d.counts["daily"] for d in decisions] == [1, 2]


def test_a_repeated_message_id_is_a_duplicate_and_not_counted_again(limiter: Limiter) -> None:
    policy = caps(daily=2)
    assert send(limiter, 1, "m1", policy, NOW).reason == "allowed"
    again = send(limiter, 1, "m1", policy, NOW + 5)
    assert (again.allowed, again.reason, again.counts["daily"]) == (True, "duplicate", 1)
    # Even when the cap is full the message keeps its slot.
    send(limiter, 1, "m2", policy, NOW + 6)
    assert send(limiter, 1, "m1", policy, NOW + 7).reason == "duplicate"
    usage = limiter.peek("email", 1, policy, now=NOW + 8)
    assert usage is not None and usage[1].daily_used == 2


def test_a_message_id_repeated_in_one_batch_is_counted_once(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, "m"), (1, "m")], caps(daily=5), now=NOW)
    assert [d.reason for d in decisions] == ["allowed", "duplicate"]


def test_dry_run_decides_but_records_nothing(limiter: Limiter) -> None:
    policy = caps(daily=1)
    assert (
        limiter.acquire("email", [(1, "m1")], policy, now=NOW, dry_run=True)[0].reason == "allowed"
    )
    assert send(limiter, 1, "m2", policy, NOW).reason == "allowed"
    dry = limiter.acquire("email", [(1, "m3")], policy, now=NOW + 1, dry_run=True)[0]
    assert dry.reason == "daily_cap"
    assert limiter.history(1, "email", now=NOW + 2) == [("m2", NOW)]


def test_release_takes_a_send_back_out_of_both_logs(limiter: Limiter) -> None:
    policy = caps(daily=1, all_daily=1)
    send(limiter, 1, "m1", policy, NOW)
    assert limiter.release("email", [(1, "m1"), (1, "never-sent")]) == [True, False]
    assert limiter.history(1, "all", now=NOW) == []
    assert send(limiter, 1, "m2", policy, NOW + 1).reason == "allowed"


def test_peek_reports_usage_remaining_and_the_next_free_slot(limiter: Limiter) -> None:
    policy = caps(daily=2, weekly=5, all_daily=3)
    send(limiter, 9, "m1", policy, NOW)
    send(limiter, 9, "m2", policy, NOW + 60)
    channel, everything = limiter.peek("email", 9, policy, now=NOW + 120) or []
    assert (channel.daily_used, channel.weekly_used) == (2, 2)
    assert (channel.daily_remaining, channel.weekly_remaining) == (0, 3)
    assert channel.next_slot_in == pytest.approx(DAY - 120)
    assert (everything.daily_remaining, everything.weekly_remaining) == (1, None)
    assert everything.next_slot_in is None


def test_history_lists_the_week_newest_first_and_reset_forgets_it(limiter: Limiter) -> None:
    send(limiter, 4, "old", caps(), NOW - WEEK + 10)
    send(limiter, 4, "new", caps(), NOW)
    assert limiter.history(4, "email", now=NOW) == [("new", NOW), ("old", NOW - WEEK + 10)]
    assert limiter.history(4, "all", now=NOW)[0] == ("email:new", NOW)
    assert limiter.reset(4, ["email", "push", "all"]) == 2
    assert limiter.history(4, "email", now=NOW) == []


def test_logs_are_trimmed_on_write_and_expire_after_a_quiet_week(limiter: Limiter) -> None:
    send(limiter, 5, "old", caps(), NOW)
    send(limiter, 5, "new", caps(), NOW + WEEK + 1)
    client = limiter.client
    key = log_key(limiter.prefix, 5, "email")
    assert client.zcard(key) == 1
    assert 7 * 86400 < client.ttl(key) <= 8 * 86400


def test_a_batch_keeps_request_order_across_many_users(limiter: Limiter) -> None:
    requests = [(user, f"m{user}") for user in range(0, 3000, 3)]
    decisions = limiter.acquire("email", requests, caps(daily=1), now=NOW)
    assert [(d.user_id, d.message_id) for d in decisions] == requests
    again = limiter.acquire("email", [(u, "x") for u, _ in requests], caps(daily=1), now=NOW)
    assert {d.reason for d in again} == {"daily_cap"}


def test_per_request_policies_apply_to_their_own_request(limiter: Limiter) -> None:
    decisions = limiter.acquire(
        "email", [(1, "a"), (2, "b")], [caps(daily=0), caps(daily=1)], now=NOW
    )
    assert [d.reason for d in decisions] == ["blocked", "allowed"]


def test_the_server_clock_is_used_when_no_time_is_given(limiter: Limiter) -> None:
    decision = limiter.acquire("email", [(1, "m")], caps(daily=1))[0]
    assert decision.reason == "allowed"
    ((_, at),) = limiter.history(1, "email")
    import time

    assert abs(at - time.time()) < 5


def test_ping_runs_the_real_function(limiter: Limiter) -> None:
    assert limiter.ping() is True
