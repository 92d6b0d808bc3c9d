"""A hypothesis state machine: the real Redis function against a plain-Python model.

Random rules (rolling and calendar windows in several time zones, across DST days; tags,
campaigns, every channel; priorities with reserves), clock steps forward and back, repeated
message ids, dry runs and releases; users in an experiment's arm whose rules replace the
segment's own or add to them (which rules apply, the model chooses itself); sends claimed for send jobs (holders) and uncounted ones
(a job's transactional sends), releases limited to a holder; every decision, and the holder a
duplicate names, must match the model's exactly. A second machine runs chunk records (how far
each send of a chunk got) for runs that take them over from each other. The model
finds calendar periods its own way (a search over minutes), not with the code under test.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from limits.engine import log
from limits.engine.limiter import Limiter
from limits.engine.table import ArmView, ExperimentView, PolicyTable, RuleView
from tests.conftest import TEST_REDIS_URL, examples
from worker.claims import (
    NOT_SENT,
    SENDING_STATE,
    SENT_STATE,
    ChunkRecord,
    RunLost,
    made_ms,
    record_key,
    record_read,
)

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
CHANNELS = ("email", "push")
ZONES = ("UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu")
# A few hours before DST changes: New York and London spring forward and fall back, Lord
# Howe moves by 30 minutes, and an ordinary day.
STARTS_MS = [
    int(datetime(2026, 3, 8, 3, 0, tzinfo=UTC).timestamp() * 1000),  # NY: 2026-03-08 07:00Z
    int(datetime(2026, 10, 31, 22, 0, tzinfo=UTC).timestamp() * 1000),  # NY: 2026-11-01 06:00Z
    int(datetime(2026, 3, 28, 20, 0, tzinfo=UTC).timestamp() * 1000),  # London: 03-29 01:00Z
    int(datetime(2026, 4, 4, 10, 0, tzinfo=UTC).timestamp() * 1000),  # Lord Howe: 04-04 15:00Z
    int(datetime(2026, 10, 3, 10, 0, tzinfo=UTC).timestamp() * 1000),  # Lord Howe: 10-03 15:30Z
    1_763_800_000_000,
]


@dataclass
class Sent:
    channel: str
    at: int
    message: str
    campaign: str
    tags: tuple[str, ...]
    holder: int = 0


def _local_date(ms: int, zone: str) -> datetime:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(zone))


def period_start(zone: str, unit: str, now: int) -> tuple[int, int]:
    """(start, end) of the calendar period holding `now`: searched over whole minutes (every
    transition of these zones falls on one), without zoneinfo's arithmetic on wall times."""
    local = _local_date(now, zone).date()
    if unit == "week":
        first = local - timedelta(days=local.weekday())
        after = first + timedelta(days=7)
    elif unit == "month":
        first = local.replace(day=1)
        after = (first.replace(day=28) + timedelta(days=4)).replace(day=1)
    else:
        first, after = local, local + timedelta(days=1)

    def first_instant(day: object) -> int:
        # The first whole minute whose local date is `day` or later.
        lo, hi = (now - 40 * DAY_MS) // 60_000, (now + 40 * DAY_MS) // 60_000
        while lo < hi:
            mid = (lo + hi) // 2
            if _local_date(mid * 60_000, zone).date() >= day:  # type: ignore[operator]
                hi = mid
            else:
                lo = mid + 1
        return lo * 60_000

    return first_instant(first), first_instant(after)


@dataclass
class Model:
    """The specification, written as plainly as possible."""

    # (user, uncounted) -> the log: counted, or the uncounted one (claimed, never counted)
    logs: dict[tuple[int, bool], list[Sent]] = field(default_factory=dict)

    def acquire(
        self,
        user: int,
        channel: str,
        message: str,
        campaign: str,
        tags: tuple[str, ...],
        priority: int,
        rules: tuple[RuleView, ...],
        zone: str,
        retention: int,
        now: int,
        dry: bool,
        holder: int = 0,
        uncounted: bool = False,
    ) -> tuple:
        log = self.logs.setdefault((user, uncounted), [])
        other = self.logs.get((user, not uncounted), [])
        mine = [s for s in log if s.channel == channel]
        day = sum(1 for s in mine if s.at > now - DAY_MS)
        week = sum(1 for s in mine if s.at > now - WEEK_MS)
        for s in [*log, *other]:
            if s.channel == channel and s.message == message:
                return ("duplicate", None, None, None, None, day, week, s.holder)
        refusals = []  # (wait or None for never, position, rule, used, limit)
        for position, r in enumerate(rules):
            if r.window_kind == "calendar":
                start, end = period_start(zone, r.window_unit, now)
                inside = [s for s in log if s.at >= start]
            else:
                end = None
                inside = [s for s in log if s.at > now - r.window_seconds * 1000]  # type: ignore[operator]
            if r.channel != "all":
                inside = [s for s in inside if s.channel == channel]
            if r.match == "tag":
                inside = [s for s in inside if r.tag in s.tags]
            if r.match == "campaign":
                inside = [s for s in inside if s.campaign == campaign]
            limit = r.limit
            if r.reserve_below_priority is not None and priority < r.reserve_below_priority:
                limit = max(0, r.limit - (r.reserve_slots or 0))
            used = len(inside)
            if used < limit:
                continue
            if limit == 0:
                wait = None
            elif end is not None:
                wait = end - now
            else:
                times = sorted(s.at for s in inside)
                wait = times[used - limit] + r.window_seconds * 1000 - now  # type: ignore[operator]
            refusals.append((wait, position, r, used, limit))
        if refusals:
            never = [f for f in refusals if f[0] is None]
            if never:
                wait, _, r, used, limit = never[0]
            else:
                wait, _, r, used, limit = max(refusals, key=lambda f: (f[0], -f[1]))
            if r.limit == 0:
                reason = "blocked"
            elif r.window_seconds == 86_400 or r.window_unit == "day":
                reason = "daily_cap"
            elif r.window_seconds == 604_800 or r.window_unit == "week":
                reason = "weekly_cap"
            else:
                reason = "cap"
            reserved = r.reserve_slots if limit < r.limit and used < r.limit else None
            return (reason, r.id, used, wait, reserved, day, week, None)
        if not dry:
            log[:] = [s for s in log if s.at > now - retention]
            log.append(Sent(channel, now, message, campaign, tags, holder))
        return ("allowed", None, None, None, None, day + 1, week + 1, None)

    def release(
        self, user: int, channel: str, message: str, holder: int = 0, uncounted: bool = False
    ) -> bool:
        log = self.logs.get((user, uncounted), [])
        for k, s in enumerate(log):
            if s.channel == channel and s.message == message:
                if holder and s.holder != holder:
                    return False  # another job's send
                del log[k]
                return True
        return False


windows = st.one_of(
    st.tuples(
        st.just("rolling"),
        st.sampled_from([60, 3_600, 4 * 3_600, 86_400, 3 * 86_400, 604_800, 7_776_000]),
    ),
    st.tuples(st.just("calendar"), st.sampled_from(["day", "week", "month"])),
)


# Send jobs' runs (holder_of numbers them), and the REST gate's (0).
SEGMENT = "vip"  # the users' segment: rules are theirs or every segment's
HOLDERS = st.sampled_from([0, 0, 5, 7, (1 << 28) - 1])


@st.composite
def rule_views(draw: st.DrawFn, rule_id: int, kind_of: str = "rule") -> RuleView:
    kind, size = draw(windows)
    limit = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4]))
    match = draw(st.sampled_from(["any", "any", "tag", "campaign"]))
    reserve = draw(st.one_of(st.none(), st.tuples(st.integers(1, 9), st.integers(1, 4))))
    if reserve is not None and reserve[1] > limit:
        reserve = None
    return RuleView(
        id=rule_id,
        name=f"r{rule_id}",
        segment=draw(st.sampled_from([None, SEGMENT])),
        channel=draw(st.sampled_from(["email", "push", "all"])),
        match=match,
        tag=draw(st.sampled_from(["promo", "news"])) if match == "tag" else "",
        window_kind=kind,
        window_seconds=size if kind == "rolling" else None,  # type: ignore[arg-type]
        window_unit=size if kind == "calendar" else "",  # type: ignore[arg-type]
        limit=limit,
        reserve_below_priority=reserve[0] if reserve else None,
        reserve_slots=reserve[1] if reserve else None,
        classic=draw(st.sampled_from([False, False, True])) if kind_of == "rule" else False,
        kind=kind_of,
    )


@st.composite
def rule_lists(draw: st.DrawFn) -> tuple[RuleView, ...]:
    count = draw(st.integers(0, 4))
    return tuple(draw(rule_views(k + 1)) for k in range(count))


@st.composite
def arms(draw: st.DrawFn) -> ExperimentView | None:
    """None (no experiment), or one on SEGMENT or every segment whose one arm every user is
    in: its rules (1 to 3, kind arm) replacing the segment's own or added to them."""
    if not draw(st.booleans()):
        return None
    count = draw(st.integers(1, 3))
    rules = tuple(draw(rule_views(-(k + 1), kind_of="arm")) for k in range(count))
    return ExperimentView(
        id=1,
        segment=draw(st.sampled_from([None, SEGMENT])),
        salt="model",
        starts_ms=0,
        ends_ms=2**62,
        shares=(1.0,),
        arms=(ArmView(name="a", mode=draw(st.sampled_from(["replace", "add"])), rules=rules),),
    )


def applicable(
    rules: tuple[RuleView, ...],
    experiment: ExperimentView | None,
    channel: str,
    campaign: str,
    tags: tuple[str, ...],
) -> tuple[RuleView, ...]:
    """The rules a send of a user of SEGMENT must fit, said plainly: every rule (theirs and
    every segment's); in an arm that replaces, less the rules of the experiment's own segment
    (not a classic cap's) on a channel the arm names (any channel, for an arm rule on all);
    then the arm's rules; of those, the ones on the channel or all, matching the send."""
    chosen = list(rules)
    if experiment is not None:
        arm = experiment.arms[0]
        named = {r.channel for r in arm.rules}
        if arm.mode == "replace":
            chosen = [
                r
                for r in chosen
                if r.classic
                or r.segment != experiment.segment
                or not ("all" in named or r.channel in named)
            ]
        chosen += arm.rules
    return tuple(
        r
        for r in chosen
        if r.channel in (channel, "all")
        and (r.match == "any" or (r.match == "tag" and r.tag in tags)
             or (r.match == "campaign" and bool(campaign)))
    )  # fmt: skip


class LimiterMachine(RuleBasedStateMachine):
    @initialize(start=st.sampled_from(STARTS_MS))
    def setup(self, start: int) -> None:
        self.client = redis.Redis.from_url(TEST_REDIS_URL)
        self.client.flushdb()
        # The release before's limiter (its users' logs at home in their buckets), and this
        # release's (at home in their groups) beside it: each step is taken by either, as while
        # both releases run.
        self.limiters = {
            False: Limiter(self.client, prefix="model:", groups=False),
            True: Limiter(self.client, prefix="model:"),
        }
        self.limiter = self.limiters[False]
        self.model = Model()
        self.now = start
        self.sent: list[tuple[int, str, str]] = []
        self.counter = 0
        self.moved = False  # group_logs has run: the release before runs no more

    def teardown(self) -> None:
        if hasattr(self, "client"):
            self.client.flushdb()
            self.client.close()

    @rule(
        ms=st.one_of(
            st.integers(0, 5000),
            st.integers(0, 2 * DAY_MS),
            # Exactly a window's length (an entry then sits on a window's start), or just off it.
            st.sampled_from(
                [60_000, 3_600_000, 4 * 3_600_000, DAY_MS, 3 * DAY_MS, WEEK_MS]
            ).flatmap(lambda span: st.sampled_from([span, span - 1, span + 1])),
            st.sampled_from([1, 30 * 60_000]),
            st.integers(-3 * 3_600_000, 0),  # the clock stepped back
        )
    )
    def step_clock(self, ms: int) -> None:
        self.now += ms

    @rule(
        user=st.sampled_from([0, 1, 300]),
        channel=st.sampled_from(CHANNELS),
        repeat=st.booleans(),
        dry=st.booleans(),
        rules=rule_lists(),
        campaign=st.sampled_from(["", "c1", "c2"]),
        tags=st.sampled_from([(), ("promo",), ("news",), ("promo", "news")]),
        priority=st.integers(0, 9),
        zone=st.sampled_from(ZONES),
        holder=HOLDERS,
        uncounted=st.sampled_from([False, False, False, True]),
        experiment=arms(),
        groups=st.booleans(),
    )
    def send(
        self,
        user: int,
        channel: str,
        repeat: bool,
        dry: bool,
        rules: tuple[RuleView, ...],
        campaign: str,
        tags: tuple[str, ...],
        priority: int,
        zone: str,
        holder: int,
        uncounted: bool,
        experiment: ExperimentView | None,
        groups: bool,
    ) -> None:
        if repeat and self.sent:
            user, channel, mid = self.sent[self.counter % len(self.sent)]
        else:
            self.counter += 1
            mid = f"m{self.counter}"
        if uncounted:
            rules, experiment = (), None  # a job's transactional sends: claimed, no rule applies
        experiments = (experiment,) if experiment is not None else ()
        table = PolicyTable(rules=rules, classic={}, zones={}, experiments=experiments)
        (arm,) = table.arms([user], [SEGMENT], now_ms=self.now) or [None]
        assert (arm is None) == (experiment is None)
        rule_set = table.rule_set(
            arm=arm,
            segment=SEGMENT,
            channel=channel,
            campaign=campaign,
            tags=tags,
            priority=priority,
            zone=zone,
            now_ms=self.now,
        )
        real = self.limiters[groups or self.moved].acquire(
            channel,
            [(user, mid)],
            rule_set,
            campaign=campaign,
            tags=tags,
            priority=priority,
            retention_ms=table.retention_ms,
            now_ms=self.now,
            dry_run=dry,
            holder=holder,
            uncounted=uncounted,
        )[0]
        expected = self.model.acquire(
            user,
            channel,
            mid,
            campaign,
            tags,
            priority,
            applicable(rules, experiment, channel, campaign, tags),
            zone,
            table.retention_ms,
            self.now,
            dry,
            holder,
            uncounted,
        )
        retry = None if real.retry_after is None else round(real.retry_after * 1000)
        got = (
            real.reason,
            real.rule["id"] if real.rule else None,
            real.rule["used"] if real.rule else None,
            retry,
            real.reserved,
            real.counts["daily"],
            real.counts["weekly"],
            real.holder,
        )
        assert got == expected
        if real.reason == "allowed" and not dry:
            self.sent.append((user, channel, mid))

    @precondition(lambda self: bool(getattr(self, "sent", None)))
    @rule(pick=st.integers(0, 1000), holder=HOLDERS, uncounted=st.booleans(), groups=st.booleans())
    def release(self, pick: int, holder: int, uncounted: bool, groups: bool) -> None:
        user, channel, mid = self.sent[pick % len(self.sent)]
        released = self.limiters[groups or self.moved].release(
            channel, [(user, mid)], holder=holder, uncounted=uncounted
        )
        assert released == [self.model.release(user, channel, mid, holder, uncounted)]

    @precondition(lambda self: not getattr(self, "moved", True))
    @rule()
    def move_to_groups(self) -> None:
        """manage.py group_logs: every bucket's users into their groups; this release's
        limiter then reads groups alone."""
        buckets = {log.bucket_key("model:", user) for user in (0, 1, 300)}
        self.limiters[True].group_buckets(sorted(buckets), retention_ms=WEEK_MS, now_ms=self.now)
        self.client.set(log.grouped_key("model:"), self.now)
        self.limiters[True] = Limiter(self.client, prefix="model:")
        assert self.limiters[True].grouped()
        self.moved = True
        for user in (0, 1, 300):
            bucket = log.bucket_key("model:", user)
            fields = (log.bucket_field(user), log.uncounted_field(user))
            assert not any(self.client.hexists(bucket, f) for f in fields)

    @invariant()
    def logs_match(self) -> None:
        if not hasattr(self, "limiter"):
            return
        for user in (0, 1, 300):
            for uncounted in (False, True):
                entries = self.limiter.entries(user, uncounted=uncounted)
                stored = sorted((e.channel, e.at_ms, e.holder) for e in entries)
                modelled = sorted(
                    (s.channel, s.at, s.holder) for s in self.model.logs.get((user, uncounted), [])
                )
                assert stored == modelled
            # A user's logs are in its bucket or in its group, never in both.
            bucket, group = log.user_keys("model:", user)
            fields = (log.bucket_field(user), log.uncounted_field(user))
            in_bucket = any(self.client.hexists(bucket, f) for f in fields)
            assert not (in_bucket and any(self.client.hexists(group, f) for f in fields))


TestLimiterMatchesModel = LimiterMachine.TestCase
TestLimiterMatchesModel.settings = settings(
    max_examples=examples(300),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(autouse=True)
def _machine_uses_its_own_redis_db(redis_client: redis.Redis) -> None:
    """Flushes the test database before the machine starts (redis_client does it)."""


class RecordMachine(RuleBasedStateMachine):
    """Chunk records (worker/claims.py): runs take a chunk's record over from each other and
    mark how far its sends got; a run that no longer holds it writes nothing."""

    RUNS = ("a" * 16, "b" * 16, "c" * 16)

    @initialize()
    def setup(self) -> None:
        from gatekeeper.lib.redis_client import get_redis

        get_redis().delete(record_key(CHUNK.pk, made_ms(CHUNK)))
        self.holder: str | None = None
        self.states: dict[int, int] = {}

    @rule(run=st.sampled_from(RUNS))
    def take(self, run: str) -> None:
        before = ChunkRecord(CHUNK, run).take()
        assert before == self.expected()
        self.holder = run

    @rule(
        run=st.sampled_from(RUNS),
        marks=st.lists(
            st.tuples(st.integers(0, 40), st.sampled_from([NOT_SENT, SENDING_STATE, SENT_STATE])),
            max_size=12,
            unique_by=lambda mark: mark[0],
        ),
    )
    def mark(self, run: str, marks: list[tuple[int, int]]) -> None:
        if not marks:
            return
        if run != self.holder:
            with pytest.raises(RunLost):
                ChunkRecord(CHUNK, run).mark(marks)
            return
        ChunkRecord(CHUNK, run).mark(marks)
        self.states.update(marks)

    def expected(self) -> bytes:
        if self.holder is None:
            return b""
        size = max(self.states, default=-1) + 1
        return bytes(self.states.get(p, NOT_SENT) for p in range(size))

    @invariant()
    def record_matches(self) -> None:
        if hasattr(self, "states"):
            assert record_read(CHUNK) == self.expected()


CHUNK = SimpleNamespace(pk=7_000_001, created_at=datetime(2026, 11, 27, tzinfo=UTC))
TestChunkRecordsMatchModel = RecordMachine.TestCase
TestChunkRecordsMatchModel.settings = settings(
    max_examples=examples(100), stateful_step_count=30, deadline=None
)
