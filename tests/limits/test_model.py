"""A hypothesis state machine: the real Redis function against a plain-Python model.

Random sends (several users, two channels, random caps), clock steps, repeated message ids,
dry runs and releases; every decision must match the model's exactly.
"""

from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from limits.limiter import Limiter, Limits, Policy
from tests.conftest import TEST_REDIS_URL

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
START_MS = 1_763_800_000_000
CHANNELS = ("email", "push")


@dataclass
class Model:
    """The specification, written as plainly as possible."""

    logs: dict[tuple[int, str], dict[str, int]] = field(default_factory=dict)

    def log(self, user: int, scope: str) -> dict[str, int]:
        return self.logs.setdefault((user, scope), {})

    @staticmethod
    def in_window(log: dict[str, int], now: int, span: int) -> list[int]:
        return sorted(t for t in log.values() if t > now - span)

    def acquire(
        self, user: int, channel: str, mid: str, policy: Policy, now: int, dry: bool
    ) -> tuple:
        ch, al = self.log(user, channel), self.log(user, "all")
        if mid in ch and ch[mid] > now - WEEK_MS:
            return (
                "duplicate",
                channel,
                len(self.in_window(ch, now, DAY_MS)),
                len(self.in_window(ch, now, WEEK_MS)),
                None,
            )
        checks = [
            (policy.channel.daily, ch, DAY_MS, "daily_cap", channel),
            (policy.channel.weekly, ch, WEEK_MS, "weekly_cap", channel),
            (policy.all.daily, al, DAY_MS, "daily_cap", "all"),
            (policy.all.weekly, al, WEEK_MS, "weekly_cap", "all"),
        ]
        for cap, _, _, _, scope in checks:
            if cap == 0:
                log = ch if scope == channel else al
                return (
                    "blocked",
                    scope,
                    len(self.in_window(log, now, DAY_MS)),
                    len(self.in_window(log, now, WEEK_MS)),
                    None,
                )
        best = None
        for cap, log, span, reason, scope in checks:
            times = self.in_window(log, now, span)
            if cap is not None and len(times) >= cap:
                retry = times[len(times) - cap] + span - now
                if best is None or retry > best[0]:
                    best = (retry, reason, scope, log)
        if best is not None:
            retry, reason, scope, log = best
            return (
                reason,
                scope,
                len(self.in_window(log, now, DAY_MS)),
                len(self.in_window(log, now, WEEK_MS)),
                retry,
            )
        if not dry:
            # Logs are trimmed when written: entries a week old go when a send is recorded.
            for log in (ch, al):
                for member in [m for m, t in log.items() if t <= now - WEEK_MS]:
                    del log[member]
            ch[mid] = now
            al[f"{channel}:{mid}"] = now
        d, w = len(self.in_window(ch, now, DAY_MS)), len(self.in_window(ch, now, WEEK_MS))
        return (
            "allowed",
            channel,
            d if dry is False else d + 1,
            w if dry is False else w + 1,
            None,
        )

    def release(self, user: int, channel: str, mid: str) -> bool:
        removed = self.log(user, channel).pop(mid, None) is not None
        self.log(user, "all").pop(f"{channel}:{mid}", None)
        return removed


caps_st = st.one_of(st.none(), st.integers(min_value=0, max_value=4))


class LimiterMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.client = redis.Redis.from_url(TEST_REDIS_URL)
        self.client.flushdb()
        self.limiter = Limiter(self.client, prefix="model:")
        self.model = Model()
        self.now = START_MS
        self.sent: list[tuple[int, str, str]] = []
        self.counter = 0

    def teardown(self) -> None:
        self.client.flushdb()
        self.client.close()

    @rule(
        ms=st.one_of(
            st.integers(0, 5000), st.integers(0, 2 * DAY_MS), st.sampled_from([DAY_MS, WEEK_MS, 1])
        )
    )
    def step_clock(self, ms: int) -> None:
        self.now += ms

    @rule(
        user=st.integers(0, 2),
        channel=st.sampled_from(CHANNELS),
        repeat=st.booleans(),
        dry=st.booleans(),
        limits=st.tuples(caps_st, caps_st, caps_st, caps_st),
    )
    def send(self, user: int, channel: str, repeat: bool, dry: bool, limits: tuple) -> None:
        if repeat and self.sent:
            user, channel, mid = self.sent[self.counter % len(self.sent)]
        else:
            self.counter += 1
            mid = f"m{self.counter}"
        policy = Policy(channel=Limits(limits[0], limits[1]), all=Limits(limits[2], limits[3]))
        real = self.limiter.acquire(
            channel, [(user, mid)], policy, now=self.now / 1000, dry_run=dry
        )[0]
        expected = self.model.acquire(user, channel, mid, policy, self.now, dry)
        retry = None if real.retry_after is None else round(real.retry_after * 1000)
        assert (
            real.reason,
            real.scope,
            real.counts["daily"],
            real.counts["weekly"],
            retry,
        ) == expected
        if real.reason == "allowed" and not dry:
            self.sent.append((user, channel, mid))

    @rule(pick=st.integers(0, 1000))
    def release(self, pick: int) -> None:
        if not self.sent:
            return
        user, channel, mid = self.sent[pick % len(self.sent)]
        assert self.limiter.release(channel, [(user, mid)]) == [
            self.model.release(user, channel, mid)
        ]

    @invariant()
    def usage_matches(self) -> None:
        if not hasattr(self, "limiter"):
            return
        policy = Policy(channel=Limits(), all=Limits())
        for user in range(3):
            usage = self.limiter.peek("email", user, policy, now=self.now / 1000)
            assert usage is not None
            ch, al = self.model.log(user, "email"), self.model.log(user, "all")
            assert usage[0].weekly_used == len(Model.in_window(ch, self.now, WEEK_MS))
            assert usage[1].daily_used == len(Model.in_window(al, self.now, DAY_MS))


TestLimiterMatchesModel = LimiterMachine.TestCase
TestLimiterMatchesModel.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(autouse=True)
def _machine_uses_its_own_redis_db(redis_client: redis.Redis) -> None:
    """Flushes the test database before the machine starts (redis_client does it)."""
