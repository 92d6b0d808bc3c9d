"""The decision model (limits/engine/model.py) against the real limiter: its Lua, on one Redis
node and on a Redis Cluster.

Random histories are written by the real function (some of them by the release before's
limiter, which keeps logs in buckets; uncounted sends, holders, clocks stepping back); the model
then reads every log in bulk, and each later call (random rules in random zones across DST days,
reserves, tags, campaigns, every channel, mixed dry runs, a user asked twice in one call, repeated
message ids, transactional sends) is answered by both: no difference in any decision is allowed,
and afterwards the logs the model holds are those Redis holds.
"""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

from limits.engine import log
from limits.engine.limiter import Limiter
from limits.engine.model import Entries, ModelLimiter, ModelLogs, hash_int
from limits.engine.table import NO_RULES, PolicyTable, RuleSet, RuleView
from limits.engine.windows import CLOCK_SLACK_MS, period_starts
from tests.conftest import examples
from tests.limits.test_model import HOLDERS, SEGMENT, STARTS_MS, ZONES, rule_views

# Users in several groups of one bucket, and in other buckets.
USERS = (0, 1, 17, 255, 300, 65_791)
CHANNELS = ("email", "push", "sms")
RETENTIONS = (7 * 86_400_000, 8 * 86_400_000, 91 * 86_400_000)
UNITS = ("day", "week", "month")
MESSAGES = 12  # message ids drawn from a small pool: duplicates happen
STEPS = st.one_of(
    st.integers(0, 5_000),
    st.integers(0, 2 * 86_400_000),
    st.sampled_from([3_600_000, 86_400_000, 604_800_000]).flatmap(
        lambda span: st.sampled_from([span - 1, span, span + 1])
    ),
    st.integers(-3 * 3_600_000, 0),  # the clock stepped back
    # An entry made now then sits exactly on the retention's cutoff of a later call.
    st.sampled_from(RETENTIONS).flatmap(lambda span: st.sampled_from([span - 1, span, span + 1])),
    # To a calendar period's start in a zone, or a millisecond either side.
    st.tuples(st.sampled_from(ZONES), st.sampled_from(UNITS), st.integers(-1, 1)),
)


@st.composite
def rule_lists(draw: st.DrawFn) -> tuple[RuleView, ...]:
    return tuple(draw(rule_views(k + 1)) for k in range(draw(st.integers(0, 5))))


@st.composite
def calls(draw: st.DrawFn, *, ruled: bool = True) -> dict:
    """One limiter call: its requests, per request a rule set (from one of two rule lists, in
    one of the zones), dry runs for all, none or some."""
    size = draw(st.integers(1, 8))
    users = draw(st.lists(st.sampled_from(USERS), min_size=size, max_size=size))
    messages = draw(st.lists(st.integers(0, MESSAGES), min_size=size, max_size=size))
    uncounted = draw(st.sampled_from([False, False, False, True]))
    lists = [draw(rule_lists()), draw(rule_lists())] if ruled and not uncounted else [(), ()]
    return {
        "step": draw(STEPS),
        "channel": draw(st.sampled_from(CHANNELS)),
        "requests": [(u, f"m{m}") for u, m in zip(users, messages, strict=True)],
        "lists": [lists[draw(st.integers(0, 1))] for _ in range(size)],
        "zones": [draw(st.sampled_from(ZONES)) for _ in range(size)],
        "campaign": draw(st.sampled_from(["", "c1", "c2"])),
        "tags": draw(st.sampled_from([(), ("promo",), ("news",), ("promo", "news")])),
        "priority": draw(st.integers(0, 9)),
        "dry": draw(
            st.one_of(st.booleans(), st.lists(st.booleans(), min_size=size, max_size=size))
        ),
        "holder": draw(HOLDERS),
        "uncounted": uncounted,
        "retention": draw(st.sampled_from(RETENTIONS)),
        "buckets": draw(st.booleans()),
    }


def _stepped(now: int, step: int | tuple[str, str, int]) -> int:
    if isinstance(step, int):
        return now + step
    zone, unit, off = step
    return period_starts(zone, unit, now + CLOCK_SLACK_MS)[1] + off


def _rule_sets(call: dict, now: int) -> list[RuleSet]:
    """Per request, its rules as the gate encodes them at `now` in the request's zone."""
    out = []
    for rules, zone in zip(call["lists"], call["zones"], strict=True):
        if call["uncounted"]:
            out.append(NO_RULES)
            continue
        table = PolicyTable(rules=rules, classic={}, zones={})
        out.append(
            table.rule_set(
                segment=SEGMENT,
                channel=call["channel"],
                campaign=call["campaign"],
                tags=call["tags"],
                priority=call["priority"],
                zone=zone,
                now_ms=now,
            )
        )
    return out


def _asked(limiter: Limiter | ModelLimiter, call: dict, now: int) -> list:
    return limiter.acquire(
        call["channel"],
        call["requests"],
        _rule_sets(call, now),
        campaign=call["campaign"],
        tags=call["tags"],
        priority=call["priority"],
        retention_ms=call["retention"],
        now_ms=now,
        dry_run=call["dry"],
        holder=call["holder"],
        uncounted=call["uncounted"],
    )


def _stored(limiter: Limiter) -> list[tuple]:
    """Every entry Redis holds of USERS, as the model compares them."""
    out = []
    for user in USERS:
        for uncounted in (False, True):
            for e in limiter.entries(user, uncounted=uncounted):
                out.append(
                    (
                        user,
                        uncounted,
                        e.channel,
                        e.at_ms,
                        int.from_bytes(e.message, "big"),
                        hash_int(e.campaign),
                        (e.priority << log.HOLDER_BITS) | e.holder,
                        tuple(sorted(hash_int(t) for t in e.tags)),
                    )
                )
    return sorted(out)


def _modelled(logs: ModelLogs) -> list[tuple]:
    e = logs.entries()
    return sorted(
        (
            int(e.user[k]),
            bool(e.uncounted[k]),
            logs.channels[int(e.channel[k])],
            int(e.at[k]),
            int(e.message[k]),
            int(e.campaign[k]),
            int(e.held[k]),
            tuple(sorted(int(t) for t in e.tags[k] if t)),
        )
        for k in range(len(e))
    )


def _compared(client, data: st.DataObject) -> None:
    start = data.draw(st.sampled_from(STARTS_MS))
    now = start
    limiters = {
        False: Limiter(client, prefix="dm:"),
        True: Limiter(client, prefix="dm:", groups=False),
    }
    for call in data.draw(st.lists(calls(), min_size=0, max_size=12), label="history"):
        now = _stepped(now, call["step"])
        _asked(limiters[call["buckets"]], call, now)
    real = limiters[False]
    logs = ModelLogs.read(real, np.asarray(USERS, dtype=np.uint64))
    assert _modelled(logs) == _stored(real)
    if data.draw(st.booleans(), label="a fork within its users"):  # as a plan's remake forks
        logs = logs.fork(within=np.asarray(sorted(USERS), dtype=np.uint64))
    model = ModelLimiter(logs)
    for call in data.draw(st.lists(calls(), min_size=1, max_size=12), label="compared"):
        now = _stepped(now, call["step"])
        decided = _asked(real, call, now)
        assert _asked(model, call, now) == decided, call
        for d in decided:
            event(f"{d.reason} by {d.rule['kind'] if d.rule else None}")
    assert _modelled(logs) == _stored(real)


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_model_decides_as_the_function_on_one_node(redis_client, data) -> None:
    redis_client.flushdb()
    _compared(redis_client, data)


@pytest.mark.cluster
@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_model_decides_as_the_function_on_a_cluster(cluster_client, data) -> None:
    from redis.cluster import RedisCluster

    cluster_client.flushall(target_nodes=RedisCluster.PRIMARIES)
    _compared(cluster_client, data)


def _fixed(client, calls_at: list[tuple[int, dict]]) -> list:
    """Each (now, call) asked of the real limiter and of a model that read the logs before
    the first one: both decisions equal, and the logs after."""
    real = Limiter(client, prefix="dm:")
    model = ModelLimiter(ModelLogs.read(real, np.asarray(USERS, dtype=np.uint64)))
    decided = []
    for now, call in calls_at:
        decisions = _asked(real, call, now)
        assert _asked(model, call, now) == decisions
        decided.append(decisions)
    assert _modelled(model.logs) == _stored(real)
    return decided


def _call(message: str, *, rules: tuple[RuleView, ...] = (), zone: str = "UTC", **options) -> dict:
    return {
        "channel": "email",
        "requests": [(0, message)],
        "lists": [rules],
        "zones": [zone],
        "campaign": "",
        "tags": (),
        "priority": 5,
        "dry": False,
        "holder": 0,
        "uncounted": False,
        "retention": 7 * 86_400_000,
        **options,
    }


def test_a_write_drops_the_entries_on_the_retention_cutoff_and_no_later_ones(redis_client) -> None:
    redis_client.flushdb()
    t0, week = STARTS_MS[-1], 7 * 86_400_000
    decided = _fixed(
        redis_client,
        [
            (t0, _call("a")),
            (t0 + 1, _call("b")),
            (t0 + week, _call("c")),  # "a" sits on the cutoff: dropped; "b" stays
            (t0 + week, _call("b")),  # still a duplicate
            (t0 + week, _call("a")),  # no longer one
        ],
    )
    assert [d[0].reason for d in decided] == ["allowed"] * 3 + ["duplicate", "allowed"]


@pytest.mark.parametrize("zone", ["America/New_York", "Australia/Lord_Howe"])
def test_a_calendar_day_counts_a_send_made_at_its_first_instant(redis_client, zone) -> None:
    redis_client.flushdb()
    rule = RuleView(
        id=1, name="r1", segment=None, channel="email", match="any", tag="", window_kind="calendar",
        window_seconds=None, window_unit="day", limit=1, reserve_below_priority=None,
        reserve_slots=None,
    )  # fmt: skip
    day_start = period_starts(zone, "day", STARTS_MS[0] + CLOCK_SLACK_MS)[1]
    decided = _fixed(
        redis_client,
        [
            (day_start - 1, _call("a")),  # the day before
            (day_start, _call("b")),  # the day's first instant
            # In the day's first minute the rule's record holds the day before and this one (the
            # clock's slack), after it this day and the next: both ways it counts "b" alone.
            (day_start + 30_000, _call("c", rules=(rule,), zone=zone)),
            (day_start + 3_600_000, _call("d", rules=(rule,), zone=zone)),
        ],
    )
    assert [d[0].reason for d in decided] == ["allowed", "allowed", "daily_cap", "daily_cap"]


def test_a_large_run_finds_each_users_entries_by_index_as_by_search() -> None:
    """Runs of many entries over dense ids look users up by index, not by binary search: the
    same entries either way, ids outside the run's range included."""
    rng = np.random.default_rng(4)
    users = np.sort(rng.choice(400_000, 300_000, replace=False)).astype(np.uint64) + 1_000
    users = np.repeat(users, rng.integers(1, 3, users.size))  # some users hold two entries
    n = users.size
    entries = Entries(
        user=users,
        channel=np.zeros(n, dtype=np.int32),
        at=np.arange(n, dtype=np.int64),
        message=np.arange(n, dtype=np.uint64),
        campaign=np.zeros(n, dtype=np.uint32),
        held=np.zeros(n, dtype=np.uint32),
        uncounted=np.zeros(n, dtype=bool),
        tags=np.zeros((n, 0), dtype=np.uint32),
    )
    logs = ModelLogs(entries, channels=["email"])
    asked = np.unique(rng.integers(0, 402_000, 50_000).astype(np.uint64))
    found, owner, _ = logs.gathered(asked)
    assert logs._runs[0].starts is not None  # looked up by index
    expected = np.flatnonzero(np.isin(users, asked))
    assert np.array_equal(np.sort(found.message), expected.astype(np.uint64))
    assert np.array_equal(asked[owner], found.user)


def test_room_is_what_the_fullest_rule_had_left_before_the_send() -> None:
    """`room` (not part of the function's reply): the fewest sends any rule of a request had
    room for before it; 1 means one more send counted by that rule first would have refused it."""
    from limits.engine.model import NO_LIMIT, decide, message_int
    from tests.limits.rulesets import rule, rule_set

    now = STARTS_MS[-1]
    two_a_day = rule(1, limit=2, seconds=86_400)
    five_a_week = rule(2, limit=5, seconds=604_800)
    sets = [rule_set(two_a_day, five_a_week, now_ms=now).records, b""]
    logs = ModelLogs(channels=["email"])
    rooms, outcomes = [], []
    for k in range(3):
        answers = decide(
            logs,
            channel="email",
            users=np.array([7, 8], dtype=np.uint64),
            messages=np.array(
                [message_int(log.message_hash(f"m{k}:{u}")) for u in (7, 8)], dtype=np.uint64
            ),
            sets=np.array([0, 1]),  # user 8: no rule
            records=sets,
            now_ms=now + k,
        )
        rooms.append(answers.room.tolist())
        outcomes.append(answers.outcome.tolist())
    assert outcomes == [[1, 1], [1, 1], [3, 1]]
    assert rooms == [[2, NO_LIMIT], [1, NO_LIMIT], [0, NO_LIMIT]]


@pytest.mark.parametrize("high", [50, 1 << 30])  # counted, then sorted
def test_grouped_answers_as_unique_does(high: int) -> None:
    from limits.engine.model import grouped, present

    values = np.random.default_rng(high).integers(0, high, 5_000)
    group, first = grouped(values)
    _, expected_first, expected_group = np.unique(values, return_index=True, return_inverse=True)
    assert np.array_equal(group, expected_group.ravel())
    assert np.array_equal(first, expected_first)
    assert np.array_equal(present(values), np.unique(values))


def test_a_fork_changes_on_its_own(redis_client) -> None:
    """A plan's rounds decide over forks of the logs read once: what one fork records and
    drops (the retention's trim) the logs it came from do not."""
    redis_client.flushdb()
    t0, week = STARTS_MS[-1], 7 * 86_400_000
    real = Limiter(redis_client, prefix="dm:")
    _asked(real, _call("a"), t0)
    logs = ModelLogs.read(real, np.asarray(USERS, dtype=np.uint64))
    before = _modelled(logs)
    fork = logs.fork()
    assert _asked(ModelLimiter(fork), _call("b"), t0 + week)[0].reason == "allowed"  # drops "a"
    assert _modelled(logs) == before and len(before) == 1
    assert [e[4] for e in _modelled(fork)] == [int.from_bytes(log.stored_message_hash("b"), "big")]


@pytest.mark.parametrize("far", [False, True])  # places by a table; by a binary search
def test_a_fork_within_some_users_finds_their_entries_as_any_fork_does(far: bool) -> None:
    """The runs a fork within some users adds find a user's entries by the user's place among
    them: the same entries as a plain fork's binary search, for users among them or not."""
    top = (1 << 40) if far else 70_000
    users = np.asarray([3, 7, 500, top], dtype=np.uint64)
    rng = np.random.default_rng(int(far))

    def entries(n: int) -> Entries:
        return Entries(
            user=rng.choice(users, n), channel=np.zeros(n, dtype=np.int32),
            at=rng.integers(0, 10**6, n), message=rng.integers(1, 10**9, n).astype(np.uint64),
            campaign=np.zeros(n, dtype=np.uint32), held=np.zeros(n, dtype=np.uint32),
            uncounted=np.zeros(n, dtype=bool), tags=np.zeros((n, 0), dtype=np.uint32),
        )  # fmt: skip

    logs = ModelLogs(entries(40), channels=["email"])
    plain, within = logs.fork(), logs.fork(within=users)
    for _ in range(3):
        added = entries(12)
        plain.record(added)
        within.record(added)
    asked = np.asarray([7, 8, top, 3], dtype=np.uint64)
    (a, a_owner, _), (b, b_owner, _) = plain.gathered(asked), within.gathered(asked)
    assert np.array_equal(a_owner, b_owner) and len(a) == len(b) > 0
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("user", "at", "message"))
