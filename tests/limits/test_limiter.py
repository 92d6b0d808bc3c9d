"""Behaviour of the limiter against real Redis (one node and a cluster): the log and the rules."""

import time

import pytest

from limits.engine import log
from limits.engine.limiter import Decision, Limiter
from limits.engine.table import RuleSet
from tests.limits.rulesets import DAY_S, WEEK_S, caps, ms, rule, rule_set

NOW = 1_763_800_000.0  # seconds (as retry_after reads); the engine is given ms(NOW)
DAY = 86_400.0
WEEK = 7 * DAY
HOUR = 3_600.0


def send(
    limiter: Limiter,
    user: int,
    message: str,
    rules: RuleSet,
    at: float,
    channel: str = "email",
    **options: object,
) -> Decision:
    return limiter.acquire(channel, [(user, message)], rules, now_ms=ms(at), **options)[0]  # type: ignore[arg-type]


def test_it_admits_up_to_the_daily_cap_then_refuses(limiter: Limiter) -> None:
    rules = caps(daily=2)
    first = send(limiter, 1, "m1", rules, NOW)
    second = send(limiter, 1, "m2", rules, NOW + 1)
    third = send(limiter, 1, "m3", rules, NOW + 2)
    assert (first.reason, second.reason, third.reason) == ("allowed", "allowed", "daily_cap")
    assert [first.allowed, second.allowed, third.allowed] == [True, True, False]
    assert second.counts == {"daily": 2, "weekly": 2}
    assert third.counts == {"daily": 2, "weekly": 2}
    assert third.limits == {"daily": 2, "weekly": None}
    assert third.rule == {
        "id": 1,
        "kind": "rule",
        "name": "rule 1",
        "window": {"kind": "rolling", "seconds": DAY_S},
        "limit": 2,
        "used": 2,
    }
    # The oldest send leaves the window 24 h after it was made.
    assert third.retry_after == pytest.approx(DAY - 2)


def test_an_entry_exactly_24_hours_old_has_left_the_daily_window(limiter: Limiter) -> None:
    rules = caps(daily=1)
    assert send(limiter, 1, "m1", rules, NOW).reason == "allowed"
    assert send(limiter, 1, "m2", rules, NOW + DAY - 0.001).reason == "daily_cap"
    assert send(limiter, 1, "m3", rules, NOW + DAY).reason == "allowed"


def test_an_entry_exactly_7_days_old_has_left_the_weekly_window(limiter: Limiter) -> None:
    rules = caps(weekly=1)
    assert send(limiter, 1, "m1", rules, NOW).reason == "allowed"
    refused = send(limiter, 1, "m2", rules, NOW + WEEK - 0.001)
    assert refused.reason == "weekly_cap"
    assert refused.retry_after == pytest.approx(0.001)
    assert send(limiter, 1, "m3", rules, NOW + WEEK).reason == "allowed"


def test_it_refuses_when_weekly_cap_reached_although_each_day_had_room(limiter: Limiter) -> None:
    rules = caps(daily=2, weekly=3)
    for i, day in enumerate((0, 1, 2)):
        assert send(limiter, 7, f"m{i}", rules, NOW + day * DAY).reason == "allowed"
    refused = send(limiter, 7, "m9", rules, NOW + 3 * DAY)
    assert refused.reason == "weekly_cap"
    assert refused.counts == {"daily": 0, "weekly": 3}
    assert refused.retry_after == pytest.approx(4 * DAY)


def test_when_several_rules_refuse_the_one_that_frees_last_decides(limiter: Limiter) -> None:
    rules = caps(daily=1, weekly=1)
    send(limiter, 1, "m1", rules, NOW)
    refused = send(limiter, 1, "m2", rules, NOW + 10)
    assert refused.reason == "weekly_cap"
    assert refused.rule is not None and refused.rule["id"] == 2
    assert refused.retry_after == pytest.approx(WEEK - 10)


def test_rules_that_free_at_the_same_moment_are_decided_by_list_order(limiter: Limiter) -> None:
    rules = rule_set(
        rule(7, limit=1, seconds=4 * 3600), rule(3, limit=1, seconds=4 * 3600, channel="all")
    )
    send(limiter, 1, "m1", rules, NOW)
    refused = send(limiter, 1, "m2", rules, NOW + 1)
    assert refused.rule is not None and refused.rule["id"] == 7


def test_the_all_rule_counts_every_channel(limiter: Limiter) -> None:
    rules = caps(daily=5, all_daily=2)
    assert send(limiter, 3, "e1", rules, NOW, channel="email").reason == "allowed"
    assert send(limiter, 3, "p1", rules, NOW + 1, channel="push").reason == "allowed"
    refused = send(limiter, 3, "e2", rules, NOW + 2, channel="email")
    assert refused.reason == "daily_cap"
    assert refused.rule is not None and refused.rule["id"] == 3 and refused.rule["used"] == 2
    # Counts are the request's channel's; limits its classic caps.
    assert refused.counts == {"daily": 1, "weekly": 1}
    assert refused.limits == {"daily": 5, "weekly": None}


def test_a_refused_send_is_recorded_nowhere(limiter: Limiter) -> None:
    rules = caps(daily=1, weekly=10)
    send(limiter, 1, "m1", rules, NOW)
    for i in range(5):
        assert send(limiter, 1, f"x{i}", rules, NOW + i).reason == "daily_cap"
    # A day later, the week holds only the one admitted send.
    assert send(limiter, 1, "m2", rules, NOW + DAY).counts == {"daily": 1, "weekly": 2}


def test_no_rule_admits_everything(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, f"m{i}") for i in range(50)], caps(), now_ms=ms(NOW))
    assert {d.reason for d in decisions} == {"allowed"}
    assert decisions[-1].counts == {"daily": 50, "weekly": 50}


@pytest.mark.parametrize("rules", [caps(daily=0), caps(weekly=0), caps(all_weekly=0)])
def test_a_zero_limit_blocks_without_a_retry_time(limiter: Limiter, rules: RuleSet) -> None:
    decision = send(limiter, 1, "m1", rules, NOW)
    assert (decision.allowed, decision.reason, decision.retry_after) == (False, "blocked", None)


def test_a_blocking_rule_decides_over_one_that_frees_later(limiter: Limiter) -> None:
    rules = rule_set(rule(1, limit=1, seconds=WEEK_S), rule(2, limit=0, seconds=60))
    send(limiter, 1, "m1", rule_set(), NOW)
    refused = send(limiter, 1, "m2", rules, NOW + 1)
    assert (refused.reason, refused.retry_after) == ("blocked", None)
    assert refused.rule is not None and refused.rule["id"] == 2


def test_two_sends_in_the_same_millisecond_are_two_entries(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, "a"), (1, "b")], caps(daily=5), now_ms=ms(NOW))
    assert [d.counts["daily"] for d in decisions] == [1, 2]


def test_a_repeated_message_id_is_a_duplicate_and_not_counted_again(limiter: Limiter) -> None:
    rules = caps(daily=2)
    assert send(limiter, 1, "m1", rules, NOW).reason == "allowed"
    again = send(limiter, 1, "m1", rules, NOW + 5)
    assert (again.allowed, again.reason, again.counts["daily"]) == (True, "duplicate", 1)
    # Even when the cap is full the message keeps its slot.
    send(limiter, 1, "m2", rules, NOW + 6)
    assert send(limiter, 1, "m1", rules, NOW + 7).reason == "duplicate"
    # The same message id on another channel is another send.
    assert send(limiter, 1, "m1", rules, NOW + 8, channel="push").reason == "allowed"


def test_a_message_id_repeated_in_one_batch_is_counted_once(limiter: Limiter) -> None:
    decisions = limiter.acquire("email", [(1, "m"), (1, "m")], caps(daily=5), now_ms=ms(NOW))
    assert [d.reason for d in decisions] == ["allowed", "duplicate"]


def test_dry_run_decides_but_records_nothing(limiter: Limiter) -> None:
    rules = caps(daily=1)
    dry = limiter.acquire("email", [(1, "m1")], rules, now_ms=ms(NOW), dry_run=True)[0]
    assert dry.reason == "allowed"
    assert send(limiter, 1, "m2", rules, NOW).reason == "allowed"
    dry = limiter.acquire("email", [(1, "m3")], rules, now_ms=ms(NOW + 1), dry_run=True)[0]
    assert dry.reason == "daily_cap"
    assert [e.message for e in limiter.entries(1)] == [log.stored_message_hash("m2")]


@pytest.mark.parametrize("distinct_sets", [1, 130])
def test_dry_runs_marked_one_by_one_record_nothing_beside_the_rest(
    limiter: Limiter, distinct_sets: int
) -> None:
    """The control group's held-out users ride in the same calls as the others (one round
    trip), marked one by one; past 127 rule sets a call cannot mark them and splits in two."""
    users = list(range(1, 201))
    sets = [caps(daily=1 + n % distinct_sets) for n in range(len(users))]
    dry = [user % 3 == 0 for user in users]
    first = limiter.acquire(
        "email", [(u, f"a{u}") for u in users], sets, now_ms=ms(NOW), dry_run=dry
    )
    assert {d.reason for d in first} == {"allowed"}
    again = limiter.acquire("email", [(u, f"b{u}") for u in users], sets, now_ms=ms(NOW + 1))
    for user, flag, decision in zip(users, dry, again, strict=True):
        # Recorded only where it was not a dry run: its one slot a day is taken.
        limit = 1 + (user - 1) % distinct_sets
        assert decision.allowed == (flag or limit > 1), (user, decision)
        assert decision.counts["daily"] == (1 if flag else 2) - (0 if decision.allowed else 1)


def test_release_takes_a_send_back_out(limiter: Limiter) -> None:
    rules = caps(daily=1, all_daily=1)
    send(limiter, 1, "m1", rules, NOW)
    send(limiter, 1, "p1", rule_set(), NOW, channel="push")
    assert limiter.release("email", [(1, "m1"), (1, "never-sent"), (1, "p1")]) == [
        True,
        False,
        False,
    ]
    assert [e.channel for e in limiter.entries(1)] == ["push"]
    assert limiter.release("push", [(1, "p1")]) == [True]
    assert limiter.entries(1) == []
    assert send(limiter, 1, "m2", rules, NOW + 1).reason == "allowed"


def test_usage_reports_each_rule_with_the_next_free_slot(limiter: Limiter) -> None:
    rules = caps(daily=2, weekly=5, all_daily=3)
    send(limiter, 9, "m1", rules, NOW)
    send(limiter, 9, "m2", rules, NOW + 60)
    figures = limiter.usage(9, [("email", rules)], now_ms=ms(NOW + 120))
    assert figures is not None
    daily, weekly, everything = figures
    assert (daily.used, daily.remaining, daily.next_slot_in) == (2, 0, pytest.approx(DAY - 120))
    assert (weekly.used, weekly.remaining, weekly.next_slot_in) == (2, 3, None)
    assert (everything.used, everything.remaining) == (2, 1)


def test_history_lists_the_week_newest_first_and_reset_forgets_it(limiter: Limiter) -> None:
    send(limiter, 4, "old", caps(), NOW - WEEK + 10)
    send(limiter, 4, "new", caps(), NOW, priority=8)
    history = limiter.history(4, now_ms=ms(NOW))
    assert [(e.message, e.at_ms, e.priority) for e in history] == [
        (log.stored_message_hash("new"), NOW * 1000, 8),
        (log.stored_message_hash("old"), (NOW - WEEK + 10) * 1000, 5),
    ]
    assert limiter.reset(4) is True
    assert limiter.history(4, now_ms=ms(NOW)) == []
    assert limiter.reset(4) is False


def test_entries_leave_the_log_on_write_once_older_than_the_retention(limiter: Limiter) -> None:
    send(limiter, 5, "old", caps(), NOW, retention_ms=8 * 86_400_000)
    send(limiter, 5, "new", caps(), NOW + 8 * DAY, retention_ms=8 * 86_400_000)
    assert [e.message for e in limiter.entries(5)] == [log.stored_message_hash("new")]


def test_a_group_and_its_bucket_outlive_the_retention_by_two_days_and_then_expire(
    limiter: Limiter,
) -> None:
    send(limiter, 5, "m", caps(), NOW, retention_ms=8 * 86_400_000)
    bucket, group = log.user_keys(limiter.prefix, 5)
    assert 9 * DAY < limiter.client.ttl(group) <= 10 * DAY
    # The bucket, which says it has groups, two days past its group.
    assert 11 * DAY < limiter.client.ttl(bucket) <= 12 * DAY


def test_the_users_of_one_group_share_one_key(limiter: Limiter) -> None:
    for user in (256, 257, 271, 272, 512):
        send(limiter, user, "m", caps(), NOW)
    client = limiter.client
    assert client.hlen(log.group_key(limiter.prefix, 256)) == 3 + 1  # and its expiry
    assert client.hlen(log.group_key(limiter.prefix, 272)) == 1 + 1
    assert client.hlen(log.group_key(limiter.prefix, 512)) == 1 + 1
    # Their buckets hold only their expiry, saying they have groups.
    assert client.hkeys(log.bucket_key(limiter.prefix, 256)) == [log.EXPIRY_FIELD]


def test_the_sweep_drops_users_whose_log_has_aged_out(limiter: Limiter) -> None:
    send(limiter, 1, "quiet", caps(), NOW - 10 * DAY)
    send(limiter, 2, "recent", caps(), NOW - DAY)
    key = log.group_key(limiter.prefix, 1)
    assert limiter.sweep([key], retention_ms=8 * 86_400_000, now_ms=ms(NOW)) == (1, 0)
    assert limiter.entries(1) == [] and len(limiter.entries(2)) == 1
    # The last user gone, the group goes too.
    assert limiter.sweep([key], retention_ms=8 * 86_400_000, now_ms=ms(NOW + 8 * DAY)) == (1, 1)
    assert not limiter.client.exists(key)


def test_a_batch_keeps_request_order_across_many_users(limiter: Limiter) -> None:
    requests = [(user, f"m{user}") for user in range(0, 3000, 3)]
    decisions = limiter.acquire("email", requests, caps(daily=1), now_ms=ms(NOW))
    assert [(d.user_id, d.message_id) for d in decisions] == requests
    again = limiter.acquire("email", [(u, "x") for u, _ in requests], caps(daily=1), now_ms=ms(NOW))
    assert {d.reason for d in again} == {"daily_cap"}


def test_per_request_rule_sets_apply_to_their_own_request(limiter: Limiter) -> None:
    decisions = limiter.acquire(
        "email", [(1, "a"), (2, "b")], [caps(daily=0), caps(daily=1)], now_ms=ms(NOW)
    )
    assert [d.reason for d in decisions] == ["blocked", "allowed"]


def test_the_server_clock_is_used_when_no_time_is_given(limiter: Limiter) -> None:
    decision = limiter.acquire("email", [(1, "m")], caps(daily=1))[0]
    assert decision.reason == "allowed"
    (entry,) = limiter.entries(1)
    assert abs(entry.at_ms / 1000 - time.time()) < 5


@pytest.mark.parametrize("clock", [NOW, float(ms(NOW)), True])
def test_a_clock_that_is_not_epoch_milliseconds_is_refused(limiter: Limiter, clock) -> None:
    # Epoch seconds taken for milliseconds would judge every window a thousand times off.
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        limiter.acquire("email", [(1, "m")], caps(daily=1), now_ms=clock)
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        limiter.usage(1, [("email", caps(daily=1))], now_ms=clock)
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        limiter.history(1, now_ms=clock)
    with pytest.raises(TypeError, match="not epoch milliseconds"):
        limiter.sweep([log.bucket_key(limiter.prefix, 1)], retention_ms=1, now_ms=clock)
    assert limiter.entries(1) == []


def test_ping_runs_the_real_function(limiter: Limiter) -> None:
    assert limiter.ping() is True


# --- rules beyond the classic caps ------------------------------------------------------------


def test_a_tag_rule_counts_only_the_sends_carrying_its_tag(limiter: Limiter) -> None:
    promos = rule_set(rule(1, limit=1, seconds=DAY_S, match="tag", tag="promo"))
    assert send(limiter, 1, "a", promos, NOW, tags=("promo", "shoes")).reason == "allowed"
    assert send(limiter, 1, "b", rule_set(), NOW + 1, tags=("news",)).reason == "allowed"
    refused = send(limiter, 1, "c", promos, NOW + 2, tags=("promo",))
    assert refused.reason == "daily_cap"
    assert refused.rule is not None and refused.rule["used"] == 1
    assert refused.retry_after == pytest.approx(DAY - 2)


def test_a_tag_rule_counts_sends_made_before_the_log_had_tag_slots(limiter: Limiter) -> None:
    promos = rule_set(rule(1, limit=2, seconds=DAY_S, match="tag", tag="promo"))
    send(limiter, 1, "plain", rule_set(), NOW)
    send(limiter, 1, "one", rule_set(), NOW + 1, tags=("promo",))
    send(limiter, 1, "three", rule_set(), NOW + 2, tags=("a", "b", "promo"))
    assert send(limiter, 1, "next", promos, NOW + 3, tags=("promo",)).reason == "daily_cap"
    assert [len(e.tags) for e in limiter.entries(1)] == [0, 1, 3]


def test_a_campaign_rule_counts_each_campaign_on_its_own(limiter: Limiter) -> None:
    once = rule_set(rule(1, limit=1, seconds=DAY_S, match="campaign"))
    assert send(limiter, 1, "a1", once, NOW, campaign="spring").reason == "allowed"
    assert send(limiter, 1, "b1", once, NOW + 1, campaign="summer").reason == "allowed"
    refused = send(limiter, 1, "a2", once, NOW + 2, campaign="spring")
    assert (refused.reason, refused.retry_after) == ("daily_cap", pytest.approx(DAY - 2))


def test_a_minimum_gap_is_a_rolling_rule_with_limit_1(limiter: Limiter) -> None:
    gap = rule_set(rule(1, limit=1, seconds=4 * 3600))
    send(limiter, 1, "a", gap, NOW)
    refused = send(limiter, 1, "b", gap, NOW + HOUR)
    assert (refused.reason, refused.retry_after) == ("cap", pytest.approx(3 * HOUR))
    assert send(limiter, 1, "c", gap, NOW + 4 * HOUR).reason == "allowed"


@pytest.mark.parametrize(
    ("rules", "channel"),
    [
        (rule_set(rule(1, limit=1, seconds=4 * 3600)), "email"),
        (rule_set(rule(1, limit=1, seconds=4 * 3600, channel="all")), "push"),
        (rule_set(rule(1, limit=1, seconds=4 * 3600, match="campaign")), "email"),
    ],
)
def test_an_entry_exactly_a_window_old_has_left_it_for_every_kind_of_rule(
    limiter: Limiter, rules: RuleSet, channel: str
) -> None:
    send(limiter, 1, "a", rules, NOW, campaign="c")
    refused = send(limiter, 1, "b", rules, NOW + 4 * HOUR - 0.001, channel=channel, campaign="c")
    assert refused.reason == "cap"
    assert send(limiter, 1, "c", rules, NOW + 4 * HOUR, channel=channel, campaign="c").allowed


def test_a_window_starting_exactly_on_an_entry_in_the_middle_of_the_log(limiter: Limiter) -> None:
    for hour in range(6):
        send(limiter, 1, f"m{hour}", rule_set(), NOW + hour * HOUR)
    # At 5 h + 2 h, a 4-hour window starts exactly on the 3 h entry: 4 h and 5 h are inside.
    at = NOW + 7 * HOUR
    refused = send(limiter, 1, "x", rule_set(rule(1, limit=2, seconds=4 * 3600)), at)
    assert (refused.reason, refused.rule and refused.rule["used"]) == ("cap", 2)
    assert refused.retry_after == pytest.approx(HOUR)  # when the 4 h entry is 4 hours old
    assert send(limiter, 1, "y", rule_set(rule(1, limit=3, seconds=4 * 3600)), at).allowed


def test_a_calendar_day_ends_at_the_users_local_midnight(limiter: Limiter) -> None:
    # 2026-03-10 22:00 in New York (EDT, UTC-4) is 02:00 UTC on the 11th.
    evening = 1_773_194_400.0
    daily = rule(1, limit=1, unit="day")
    send(limiter, 1, "a", rule_set(daily, now_ms=ms(evening), zone="America/New_York"), evening)
    later = evening + HOUR
    refused = send(
        limiter, 1, "b", rule_set(daily, now_ms=ms(later), zone="America/New_York"), later
    )
    assert refused.reason == "daily_cap"
    assert refused.retry_after == pytest.approx(HOUR)  # midnight in New York
    # The same sends for a user in Tokyo: its day (11:00 to 12:00 on the 11th) is the same day.
    tokyo = rule_set(daily, now_ms=ms(later), zone="Asia/Tokyo")
    assert send(limiter, 1, "c", tokyo, later).reason == "daily_cap"
    after = evening + 2 * HOUR + 1
    assert (
        send(
            limiter, 1, "d", rule_set(daily, now_ms=ms(after), zone="America/New_York"), after
        ).reason
        == "allowed"
    )


def test_a_reserve_keeps_the_last_slots_for_important_sends(limiter: Limiter) -> None:
    daily = rule(1, limit=3, seconds=DAY_S, reserve=(7, 1))
    low = rule_set(daily, priority=5)
    high = rule_set(daily, priority=8)
    assert send(limiter, 1, "a", low, NOW, priority=5).reason == "allowed"
    assert send(limiter, 1, "b", low, NOW + 1, priority=5).reason == "allowed"
    refused = send(limiter, 1, "c", low, NOW + 2, priority=5)
    assert (refused.reason, refused.reserved) == ("daily_cap", 1)
    assert refused.rule is not None and refused.rule["limit"] == 3 and refused.rule["used"] == 2
    assert send(limiter, 1, "d", high, NOW + 3, priority=8).reason == "allowed"
    full = send(limiter, 1, "e", high, NOW + 4, priority=8)
    assert (full.reason, full.reserved) == ("daily_cap", None)


def test_a_reserve_as_large_as_the_limit_shuts_lower_priorities_out(limiter: Limiter) -> None:
    rules = rule_set(rule(1, limit=2, seconds=DAY_S, reserve=(5, 2)), priority=1)
    refused = send(limiter, 1, "a", rules, NOW, priority=1)
    assert (refused.reason, refused.reserved, refused.retry_after) == ("daily_cap", 2, None)


def test_retry_after_waits_for_every_refusing_rule(limiter: Limiter) -> None:
    rules = rule_set(rule(1, limit=2, seconds=3 * 3600), rule(2, limit=1, seconds=3600))
    send(limiter, 1, "a", rule_set(), NOW)
    send(limiter, 1, "b", rule_set(), NOW + 1800)
    refused = send(limiter, 1, "c", rules, NOW + 1900)
    # Rule 1 frees when "a" is 3 h old, rule 2 when "b" is 1 h old: the later one decides.
    assert refused.rule is not None and refused.rule["id"] == 1
    assert refused.retry_after == pytest.approx(3 * HOUR - 1900)


def test_sends_on_both_channels_are_counted_apart_and_together(limiter: Limiter) -> None:
    per_channel = caps(daily=2, all_daily=3)
    push = caps(daily=2, all_daily=3, channel="push")
    for i in range(4):
        channel = "email" if i % 2 == 0 else "push"
        rules = per_channel if channel == "email" else push
        assert send(limiter, 1, f"m{i}", rules, NOW + i, channel=channel).allowed == (i < 3)
    counts = {e.channel for e in limiter.entries(1)}
    assert counts == {"email", "push"}
    assert send(limiter, 1, "x", per_channel, NOW + 10).counts == {"daily": 2, "weekly": 2}


def test_a_clock_that_stepped_back_frees_no_slot_early(limiter: Limiter) -> None:
    rules = caps(daily=1)
    send(limiter, 1, "a", rules, NOW + HOUR)
    refused = send(limiter, 1, "b", rules, NOW)
    assert refused.reason == "daily_cap"
    assert refused.retry_after == pytest.approx(DAY + HOUR)
    # An entry recorded at an earlier time goes in time order.
    send(limiter, 1, "c", rule_set(), NOW - HOUR)
    assert [e.at_ms for e in limiter.entries(1)] == [
        (NOW - HOUR) * 1000,
        (NOW + HOUR) * 1000,
    ]


def test_counting_any_recent_interval(limiter: Limiter) -> None:
    for i in range(5):
        send(limiter, 1, f"m{i}", rule_set(), NOW - i * HOUR)
    figures = limiter.usage(
        1, [("email", rule_set(rule(0, limit=99, seconds=int(2.5 * 3600))))], now_ms=ms(NOW)
    )
    assert figures is not None and figures[0].used == 3


def test_restored_sends_are_the_sends_that_were_recorded(limiter: Limiter) -> None:
    """rebuild_logs's half in Redis: logs emptied (Redis lost its data) and put back from the
    ledger's view of each send are the same bytes, on one node and across a cluster's nodes."""
    from limits.engine.limiter import Restored

    users = list(range(0, 300 * 131, 131))  # buckets on every node of a cluster
    sent: list[Restored] = []
    for k, (campaign, tags, priority) in enumerate(
        [("spring", ("promo", "shoes"), 7), ("", (), 5), ("news", ("news",), 2)]
    ):
        at = NOW - 3600 * (3 - k)
        decided = limiter.acquire(
            "email" if k != 1 else "push",
            [(u, f"m{k}:{u}") for u in users],
            rule_set(),
            campaign=campaign,
            tags=tags,
            priority=priority,
            now_ms=ms(at),
        )
        assert all(d.allowed for d in decided)
        sent += [
            Restored(u, "email" if k != 1 else "push", round(at * 1000), f"m{k}:{u}", campaign,
                     priority, tags)
            for u in users
        ]  # fmt: skip

    def logs() -> dict[int, list]:  # sections may come in another order: the same sends
        return {u: sorted(limiter.entries(u), key=lambda e: (e.channel, e.at_ms)) for u in users}

    before = logs()
    for u in users:
        limiter.reset(u)
    assert limiter.restore(
        list(reversed(sent)), retention_ms=8 * 86_400_000, now_ms=ms(NOW)
    ) == len(sent)
    assert logs() == before
    # Idempotent, and what the retention no longer holds is not put back.
    assert limiter.restore(sent, retention_ms=8 * 86_400_000, now_ms=ms(NOW)) == 0
    limiter.reset(users[0])
    assert limiter.restore(sent[:1], retention_ms=3600 * 1000, now_ms=ms(NOW)) == 0


def test_the_previous_versions_import_call_still_adds_its_entries(limiter: Limiter) -> None:
    """gk_import, the interface of the version that converted the two-sorted-set logs."""
    limiter.acquire("email", [(7, "warm")], rule_set(), now_ms=ms(NOW))  # loads the library
    key, field = log.bucket_key(limiter.prefix, 7), log.bucket_field(7)
    at = round((NOW - 60) * 1000)
    args = [round(NOW * 1000), 8 * 86_400_000, field, "email", at, log.message_hash("old")]
    gk_import = limiter.transport.library.function("gk_import")
    assert limiter.client.fcall(gk_import, 1, key, *args) == 1
    assert limiter.client.fcall(gk_import, 1, key, *args) == 0  # idempotent
    entry = next(e for e in limiter.entries(7) if e.message == log.stored_message_hash("old"))
    assert (entry.channel, entry.at_ms, entry.campaign, entry.priority, entry.tags) == (
        "email",
        at,
        log.NO_HASH,
        5,
        (),
    )
