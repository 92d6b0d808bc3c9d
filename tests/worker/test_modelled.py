"""A send job's recipients decided at once (worker.modelled.job_decided, what the plan asks) are
decided exactly as the gate decides them (Gate.check, its stages in the order of STAGES):
each recipient's reason, the rule that refused it (or, for the control group, that would have)
and that rule's count, when the send may go, and the reserved job that held its slot; and
afterwards the users' logs hold the same sends.

Random policies are made in the database: suppression lists (a channel's and `all`'s) and
erased people; people's switches, pauses and own frequency; topics; the global control group;
experiments whose arms replace or add rules; quiet hours per segment; rules of every window,
match, channel, reserve and segment, classic caps among them. Reservations' holds are encoded as
the plan stores them, earlier sends are written by the real gate, recipients name their own
zones or take their segment's, user ids run to 63 bits, and the clocks run across DST changes
(New York, London, Lord Howe; Kathmandu's quarter hour). Each job is then decided three ways:
by the gate over the decision model, by job_decided over its own copy of the same logs, and by
the gate over the real limiter in Redis, each with its own reading of the policy and its own
copy of the holds. No difference is allowed. A designed job meets every reason the stages give,
and lists never read and a missing snapshot are `unavailable` alike.
"""

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from gatekeeper.lib.instants import instant_ms
from limits.engine import log
from limits.engine.assignment import in_share
from limits.engine.limiter import Decision, Limiter, get_limiter
from limits.engine.model import ModelLimiter, ModelLogs, message_int
from limits.engine.quiet import QuietFields, user_offset
from limits.engine.reservations import HeldJob, Holds, holds_decode, holds_encode
from limits.engine.table import PolicyTable
from limits.engine.topics import TopicFields
from limits.people.preferences import PreferenceCache, preference_cache
from limits.people.suppression import SuppressionCache, erased_add, suppression_cache
from limits.people.suppression import suppress as suppress_now
from limits.policy.holdout import HoldoutFields, holdout_set
from limits.policy.selectors import PolicyCache, policy_cache, policy_read
from limits.policy.services import QUIET_HOURS, TOPICS
from limits.reasons import Reason
from limits.studies.experiments import ArmFields, ExperimentFields, experiment_create
from segments.index import get_index
from segments.models import Segment
from tests.support.sends import make_rule
from tests.worker.test_preferences_gate import said
from worker.gate import Gate, SegmentResolver, gate_check
from worker.modelled import REASONS, JobDecisions, job_decided, segment_codes

pytestmark = pytest.mark.django_db

ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]
# A day and a half from each of these crosses a DST change of a zone above (Kathmandu has
# none: a quarter-hour offset all year).
CHANGES = [
    datetime(2027, 3, 13, 12, tzinfo=UTC),  # New York springs forward at 07:00 UTC on the 14th
    datetime(2027, 11, 6, 12, tzinfo=UTC),  # New York falls back at 06:00 UTC on the 7th
    datetime(2027, 3, 27, 12, tzinfo=UTC),  # London springs forward at 01:00 UTC on the 28th
    datetime(2027, 10, 30, 12, tzinfo=UTC),  # London falls back at 01:00 UTC on the 31st
    datetime(2027, 4, 3, 0, tzinfo=UTC),  # Lord Howe goes half an hour back at 15:00 UTC
    datetime(2027, 10, 2, 0, tzinfo=UTC),  # Lord Howe goes half an hour forward at 15:30 UTC
]
# Ids of several Redis buckets and groups, some of them past 32 bits (a snapshot of 64-bit ids),
# past a double's 53 bits, up to the database's largest.
WIDE = [255, 256, 300, 4_000, 65_791, 2**32 + 7, 2**40 + 3, 2**53 + 1, 2**62 + 5, 2**63 - 2]
USERS = [*range(1, 101), *WIDE]
_MIXED = random.Random(0).sample(USERS, len(USERS))
# The segments' users (the rest: the default segment).
VIP, DORMANT, WEEKLY = sorted(_MIXED[:28]), sorted(_MIXED[28:34]), sorted(_MIXED[34:48])
SEGMENTS = ["vip", "dormant", "weekly", "default"]
CHANNELS = ["email", "push"]
CAMPAIGNS = ["spring", "launch", "old"]
TAGS: list[tuple[str, ...]] = [(), (), ("promo",), ("news",), ("promo", "news"), ("receipt",)]
TOPIC_DEFINITIONS = [
    ("news", "subscribed", []),
    ("offers", "unsubscribed", []),
    ("terms", "required", []),
    ("alerts", "subscribed", ["push"]),
]
# The topics a job on each channel may name ("": none); `alerts` is sent on push only.
TOPIC_SLUGS = {
    "email": ["", "", "", "news", "news", "offers", "terms"],
    "push": ["", "", "news", "offers", "terms", "alerts", "alerts"],
}
WINDOWS: list[dict[str, Any]] = [
    {"kind": "rolling", "seconds": 3600},
    {"kind": "rolling", "seconds": 4 * 3600},
    {"kind": "rolling", "seconds": 86_400},
    {"kind": "rolling", "seconds": 604_800},
    {"kind": "calendar", "unit": "day"},
    {"kind": "calendar", "unit": "week"},
    {"kind": "calendar", "unit": "month"},
]
# Every reason the stages give a marketing send, but `unavailable` (asked for on its own).
STAGE_REASONS = {
    "suppressed", "preference", "paused", "holdout", "quiet_hours", "daily_cap", "weekly_cap",
    "cap", "blocked", "reserved", "duplicate", "allowed",
}  # fmt: skip
# The experiments of a case: none, one on every segment, or one or two on segments of their own.
EXPERIMENTS: list[list[str | None]] = [[], [None], ["vip"], ["weekly"], ["vip", "weekly"]]
# What a decision shows that job_decided answers too: reason, rule (id, name, used), retry
# after, the reserved job.
Shown = tuple[str, tuple[int, str, int] | None, float | None, int | None]


@dataclass(frozen=True)
class Job:
    """A job's gate call: its fields, its recipients (the zone each names, None: none) and when."""

    channel: str
    campaign: str
    tags: tuple[str, ...]
    priority: int
    topic: str
    job_id: int | None
    users: list[int]
    messages: list[str]
    zones: list[str | None] | None
    now: datetime
    snapshot: bool = True  # False: the process has no segment snapshot


class NoSnapshot(Gate):
    """A gate in a process with no segment snapshot loaded."""

    def index(self) -> SegmentResolver | None:
        return None


def shown(decision: Decision) -> Shown:
    rule = decision.rule
    named = None if rule is None else (rule["id"], rule["name"], rule["used"])
    return (str(decision.reason), named, decision.retry_after, decision.reserved_for)


def shown_modelled(decided: JobDecisions, k: int) -> Shown:
    at = int(decided.rule[k])
    named = None
    if at >= 0:
        view = decided.rules[at]
        named = (view.id, view.name, int(decided.used[k]))
    wait = float(decided.retry_after[k])
    return (
        str(REASONS[int(decided.reason[k])]),
        named,
        None if math.isnan(wait) else wait,
        int(decided.reserved_for[k]) or None,
    )


def rows(logs: ModelLogs) -> list[tuple[Any, ...]]:
    """Every entry the logs hold, comparable between two ModelLogs (channels by name, tags as
    a set)."""
    e = logs.entries()
    tags = [tuple(sorted(t for t in row if t)) for row in e.tags.tolist()]
    return sorted(
        zip(
            e.user.tolist(),
            [logs.channels[c] for c in e.channel.tolist()],
            e.at.tolist(),
            e.message.tolist(),
            e.campaign.tolist(),
            e.held.tolist(),
            e.uncounted.tolist(),
            tags,
            strict=True,
        )
    )


@dataclass
class Deciders:
    """The three deciders of a case's jobs, each with what it keeps from one job to the next:
    its own reading of the policy (policy_read) and its own copy of the holds (decoded from the
    bytes the plan stores); the gate over the model and job_decided each their own copy of the
    users' logs, read from Redis; the gate over the real limiter, Redis itself."""

    users: np.ndarray  # whose logs are compared
    live: Limiter
    tables: list[PolicyTable]  # the reference's, job_decided's, the real gate's
    holds: list[Holds]
    reference_logs: ModelLogs
    modelled_logs: ModelLogs

    @classmethod
    def read(cls, users: list[int], holds: bytes) -> "Deciders":
        live = get_limiter()
        ids = np.array(sorted(users), dtype=np.uint64)
        return cls(
            users=ids,
            live=live,
            tables=[policy_read() for _ in range(3)],
            holds=[holds_decode(holds) for _ in range(3)],
            reference_logs=ModelLogs.read(live, ids),
            modelled_logs=ModelLogs.read(live, ids),
        )

    def decide(
        self,
        job: Job,
        *,
        suppressions: SuppressionCache | None = None,
        preferences: PreferenceCache | None = None,
    ) -> list[Shown]:
        """`job` decided by each: every recipient's decision the same three times, and every
        log the same after. The reference's decisions, as job_decided answers them.
        `suppressions`, `preferences`: the lists every decider reads (None: the process's)."""
        made = Gate if job.snapshot else NoSnapshot

        def gate(side: int, **parts: Any) -> Gate:
            return made(
                policy=PolicyCache.holding(self.tables[side]),
                holds=self.holds[side],
                suppressions=suppressions,
                preferences=preferences,
                record_stats=False,
                record_ledger=False,
                **parts,
            )

        options: dict[str, Any] = {
            "channel": job.channel,
            "requests": list(zip(job.users, job.messages, strict=True)),
            "campaign": job.campaign,
            "tags": job.tags,
            "priority": job.priority,
            "time_zones": job.zones,
            "now": job.now,
            "job": job.job_id,
            "topic": job.topic,
        }
        expected = gate(0, decider=ModelLimiter(self.reference_logs)).check(**options)
        parts = gate(1)
        index = get_index()
        assert index is not None
        users = np.array(job.users, dtype=np.uint64)
        decided = job_decided(
            channel=job.channel,
            campaign=job.campaign,
            tags=job.tags,
            priority=job.priority,
            topic=self.tables[1].topics[job.topic] if job.topic else None,
            holder=log.holder_of(job.job_id or 0),
            users=users,
            messages=np.array(
                [message_int(log.message_hash(m)) for m in job.messages], dtype=np.uint64
            ),
            zones=job.zones,
            now_ms=instant_ms(job.now),
            table=self.tables[1],
            segments=segment_codes(index, users) if job.snapshot else None,  # as the plan asks
            suppressions=parts.suppressions,
            preferences=parts.preferences,
            holds=self.holds[1],
            logs=self.modelled_logs,
        )
        assert decided is not None
        assert decided.users.tolist() == job.users
        wanted = [shown(d) for d in expected]
        got = [shown_modelled(decided, k) for k in range(len(job.users))]
        wrong = [
            (user, want, have)
            for user, want, have in zip(job.users, wanted, got, strict=True)
            if want != have
        ]
        assert wrong == [], f"(user, the gate's, job_decided's) at {job.now.isoformat()}: {wrong}"
        assert rows(self.modelled_logs) == rows(self.reference_logs)
        # The real limiter (its Lua, on Redis) decides alike and keeps the same logs.
        assert gate(2, limiter=self.live).check(**options) == expected
        assert rows(ModelLogs.read(self.live, self.users)) == rows(self.reference_logs)
        return wanted


# --- random cases ---------------------------------------------------------------------------


@pytest.fixture
def world(published, settings):
    """The segments (vip, dormant with caps of 0, weekly with a weekly email cap of 1 and 2
    pushes a day, and everyone else) of 64-bit ids, and the topics: news (sent unless said no),
    offers (only to those who ask), terms (required), alerts (push only)."""
    settings.GATEKEEPER_ID_WIDTH = 64
    published(
        vip=(10, VIP, {}),
        dormant=(20, DORMANT, {"email": (0, 0), "push": (0, 0)}),
        weekly=(30, WEEKLY, {"email": (None, 1), "push": (2, None)}),
    )
    for slug, default, channels in TOPIC_DEFINITIONS:
        TOPICS.create(
            fields=TopicFields(slug=slug, name=slug, default=default, channels=channels),
            via="command",
        )
    policy_cache().invalidate()


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _window_fields(window: dict[str, Any]) -> dict[str, Any]:
    calendar = window["kind"] == "calendar"
    return {
        "window_kind": window["kind"],
        "window_seconds": None if calendar else window["seconds"],
        "window_unit": window["unit"] if calendar else "",
    }


def _limit(rng: random.Random, *, blocking: bool = True) -> int:
    return rng.choice([0, 1, 1, 1, 2, 2, 3] if blocking else [1, 1, 2, 2, 3])


def random_rule(rng: random.Random, n: int) -> None:
    match = rng.choice(["any", "any", "tag", "campaign"])
    limit = _limit(rng, blocking=n > 0 and rng.random() < 0.5)
    reserve = limit > 0 and rng.random() < 0.3
    make_rule(
        f"rule {n}",
        segment=rng.choice([None, None, "vip", "weekly", "default"]),
        channel=rng.choice(["email", "push", "all"]),
        match=match,
        tag="promo" if match == "tag" else "",
        limit=limit,
        reserve_below_priority=rng.randint(1, 9) if reserve else None,
        reserve_slots=rng.randint(1, limit) if reserve else None,
        **_window_fields(rng.choice(WINDOWS)),
    )


def arm_rule(rng: random.Random, name: str) -> dict[str, Any]:
    match = rng.choice(["any", "any", "tag", "campaign"])
    limit = _limit(rng)
    rule: dict[str, Any] = {
        "name": name,
        "channel": rng.choice(["email", "push", "all"]),
        "match": match,
        "tag": "promo" if match == "tag" else "",
        "window": rng.choice(WINDOWS),
        "limit": limit,
    }
    if limit and rng.random() < 0.3:
        rule["reserve"] = {"below_priority": rng.randint(1, 9), "slots": rng.randint(1, limit)}
    return rule


def earlier_sends(rng: random.Random, base: datetime) -> None:
    """Sends of the six days before `base`, by the real gate (before any rule: all recorded),
    some of them under message ids the jobs send again."""
    for n in range(rng.randint(3, 8)):
        channel = rng.choice(CHANNELS)
        users = rng.sample(USERS, rng.randint(5, 60))
        gate_check(
            channel=channel,
            requests=[
                (u, f"job-{channel}-{u}" if rng.random() < 0.2 else f"earlier-{n}-{u}")
                for u in users
            ],
            campaign=rng.choice(CAMPAIGNS),
            tags=rng.choice(TAGS),
            priority=rng.randint(0, 9),
            now=base - timedelta(minutes=rng.randint(1, 6 * 24 * 60)),
            job=rng.choice([None, None, 3, 4]),
        )


def what_people_said(rng: random.Random, base: datetime) -> None:
    """A quarter of the users said something: a channel or a topic switched off, a topic they
    must ask for asked for, a pause (of all marketing or of a channel, some over before the
    jobs), their own frequency on a channel."""
    for user in rng.sample(USERS, 30):
        fields: dict[str, Any] = {}
        for _ in range(rng.randint(1, 2)):
            kind = rng.choice(["channel", "topic", "offers", "pause", "pause_channel", "own"])
            channel = rng.choice(CHANNELS)
            until = base + timedelta(hours=rng.uniform(-12, 48))
            if kind == "channel":
                fields["channels"] = {channel: False}
            elif kind == "topic":
                slug = "alerts" if channel == "push" and rng.random() < 0.5 else "news"
                fields["topics"] = {slug: {channel: False}}
            elif kind == "offers":
                fields["topics"] = {"offers": {channel: True}}
            elif kind == "pause":
                fields["paused_until"] = until
            elif kind == "pause_channel":
                fields["paused_channels"] = {channel: until}
            else:
                window = rng.choice(WINDOWS[:-1])  # at most a week
                fields["frequency"] = [
                    {"channel": channel, "window": window, "limit": rng.randint(1, 3)}
                ]
        said(user, **fields)


def random_policy(rng: random.Random, seed: int, base: datetime) -> None:
    """Quiet hours, rules, the control group, experiments and the lists (after the people's
    own frequency: a person may ask for no fewer sends than a rule allows everyone)."""
    for _ in range(rng.choice([0, 1, 1, 2])):
        start = rng.randrange(0, 24 * 60, 30)
        end = (start + rng.randrange(30, 23 * 60, 30)) % (24 * 60)
        open_minutes = (start - end) % (24 * 60)
        spread = rng.choice([0, 30, 90])
        QUIET_HOURS.create(
            fields=QuietFields(
                segment=rng.choice([None, "vip", "weekly", "default"]),
                channel=rng.choice(["email", "push", "all"]),
                start=_hhmm(start),
                end=_hhmm(end),
                spread_minutes=spread if spread < open_minutes else 0,
            ),
            via="command",
        )
    for n in range(rng.randint(1, 4)):
        random_rule(rng, n)
    if rng.random() < 0.6:
        holdout_set(
            HoldoutFields(
                share=rng.choice([0.05, 0.2]),
                salt=f"control-{seed}",
                exclude_segments=rng.choice([[], ["vip"]]),
                exclude_tags=rng.choice([[], ["receipt"]]),
            ),
            segments=SEGMENTS,
            via="api",
        )
    for n, segment in enumerate(rng.choice(EXPERIMENTS)):
        shares = rng.choice([[0.5, 0.5], [0.3, 0.3, 0.3], [0.2, 0.4]])
        starts = base + timedelta(hours=rng.choice([-48, -48, 12]))
        arms = [
            ArmFields(
                name=f"arm {k}",
                share=share,
                mode=rng.choice(["replace", "add"]),
                rules=[arm_rule(rng, f"arm {k} rule {j}") for j in range(rng.randint(1, 2))],
            )
            for k, share in enumerate(shares)
        ]
        experiment_create(
            ExperimentFields(
                name=f"experiment {n}",
                segment=segment,
                arms=arms,
                starts_at=starts,
                ends_at=starts + timedelta(days=20),
                salt=f"experiment-{seed}-{n}",
            ),
            via="command",
            now=starts,
        )
    for scope in ("email", "push", "all"):
        listed = rng.sample(USERS, 3)
        suppress_now(channel=scope, user_ids=listed, reason="unsubscribed", source="test")
    erased_add(rng.sample(USERS, 2))


def random_holds(rng: random.Random, base: datetime) -> bytes:
    """Up to two reserved jobs' holds, as the plan stores them."""
    jobs = []
    for n in range(rng.choice([0, 1, 2, 2])):
        job = HeldJob(
            id=900 + n,
            priority=rng.randint(4, 9),
            start_ms=instant_ms(base + timedelta(minutes=rng.randint(60, 40 * 60))),
            channel=rng.choice(CHANNELS),
            campaign=rng.choice(CAMPAIGNS),
            tags=rng.choice(TAGS),
        )
        users = np.array(sorted(rng.sample(USERS, rng.randint(10, 60))), dtype=np.uint64)
        jobs.append((job, users))
    return holds_encode(jobs)


def random_job(rng: random.Random, n: int, base: datetime) -> Job:
    channel = rng.choice(CHANNELS)
    users = rng.sample(USERS, rng.randint(15, len(USERS)))
    zones = None
    if rng.random() < 0.7:
        zones = [rng.choice([*ZONES, ""]) if rng.random() < 0.4 else None for _ in users]
    return Job(
        channel=channel,
        campaign=rng.choice(CAMPAIGNS),
        tags=rng.choice(TAGS),
        priority=rng.randint(0, 9),
        topic=rng.choice(TOPIC_SLUGS[channel]),
        job_id=rng.choice([None, 3, 4, 5]),
        users=users,
        messages=[f"job-{channel}-{u}" if rng.random() < 0.5 else f"m{n}-{u}" for u in users],
        zones=zones,
        now=base + timedelta(minutes=rng.randint(0, 36 * 60), milliseconds=rng.randint(0, 59_999)),
        snapshot=rng.random() > 0.08,
    )


@pytest.mark.parametrize("seed", range(100))
def test_job_decided_decides_every_recipient_as_the_gate_does(world, seed):
    """A random policy, holds and history around a DST change; three jobs at random times of
    the next day and a half, each decided the three ways (Deciders.decide) with no difference,
    the logs carried from one job to the next."""
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    for slug in ("vip", "weekly", "default"):
        Segment.objects.filter(slug=slug).update(time_zone=rng.choice([*ZONES, ""]))
    earlier_sends(rng, base)
    what_people_said(rng, base)
    random_policy(rng, seed, base)
    suppression_cache().read_now()  # as their commits would: the test's transaction never commits
    preference_cache().read_now()
    deciders = Deciders.read(USERS, random_holds(rng, base))
    assert rows(deciders.reference_logs) == rows(deciders.modelled_logs) != []
    reasons: set[str] = set()
    for job in sorted((random_job(rng, n, base) for n in range(3)), key=lambda j: j.now):
        reasons.update(reason for reason, *_ in deciders.decide(job))
    # Not a case where one thing happens to everyone.
    assert len(reasons) >= 2, reasons


# --- every reason, by design ----------------------------------------------------------------

# Sunday 14 March 2027, 07:30 UTC: 03:30 in New York (its clocks sprang forward half an hour
# before), 13:15 in Kathmandu.
NOW = datetime(2027, 3, 14, 7, 30, 0, 250_000, tzinfo=UTC)
NIGHT_ZONE, DAY_ZONE = "America/New_York", "Asia/Kathmandu"
SALT, SHARE = "modelled-control", 0.2
LAUNCH = HeldJob(id=77, priority=9, start_ms=instant_ms(NOW + timedelta(hours=2)),
                 channel="email", campaign="launch", tags=("promo",))  # fmt: skip
# The vip experiment's arms: one replaces vip's own email rules, one adds a calendar week.
THREE_PROMOS = {"name": "3 promos a day", "channel": "email", "match": "tag", "tag": "promo",
                "window": WINDOWS[2], "limit": 3}  # fmt: skip
THREE_A_WEEK = {"name": "3 a week", "channel": "all", "window": WINDOWS[5], "limit": 3}
# The designed users, by what each meets.
TRAITS = (
    "suppressed", "suppressed_all", "erased", "channel_off", "news_off", "paused",
    "paused_email", "holdout", "holdout_capped", "quiet", "capped", "weekly", "own", "dormant",
    "reserved", "duplicate", "plain", "plain_vip", "holdout_vip",
)  # fmt: skip
# The reason the gate gives each (the vip ones: allowed, the control group excludes vip).
EXPECTED = {
    "suppressed": "suppressed", "suppressed_all": "suppressed", "erased": "suppressed",
    "channel_off": "preference", "news_off": "preference", "paused": "paused",
    "paused_email": "paused", "holdout": "holdout", "holdout_capped": "holdout",
    "quiet": "quiet_hours", "capped": "daily_cap", "weekly": "weekly_cap", "own": "cap",
    "dormant": "blocked", "reserved": "reserved", "duplicate": "duplicate", "plain": "allowed",
    "plain_vip": "allowed", "holdout_vip": "allowed",
}  # fmt: skip


@pytest.fixture
def designed(published) -> tuple[dict[str, int], bytes]:
    """One user per trait; the policy, lists, preferences and holds that give each its reason:
    a promo a day for everyone (on every channel), the weekly segment's weekly email cap of 1,
    the dormant segment's caps of 0, quiet hours at night (every segment in Kathmandu by day,
    the quiet user naming New York), the control group (not vip's), an experiment on vip, a
    person's own calendar week of 1, LAUNCH holding a promo slot. The users, and the holds."""
    candidates = np.arange(200, 200 + 20 * len(TRAITS), dtype=np.uint64)
    held = dict(zip(candidates.tolist(), in_share(candidates, SALT, SHARE).tolist(), strict=True))
    free = iter(candidates.tolist())
    users = {
        trait: next(u for u in free if held[u] == trait.startswith("holdout")) for trait in TRAITS
    }
    published(
        vip=(10, [users["plain_vip"], users["holdout_vip"]], {}),
        dormant=(20, [users["dormant"]], {"email": (0, 0)}),
        weekly=(30, [users["weekly"]], {"email": (None, 1)}),
    )
    Segment.objects.update(time_zone=DAY_ZONE)
    TOPICS.create(fields=TopicFields(slug="news", name="news"), via="command")
    said(users["own"], frequency=[{"channel": "email", "window": WINDOWS[5], "limit": 1}])
    preference_cache().read_now()
    policy_cache().invalidate()
    # An hour before: a promo push, a plain email (the weekly segment's and the own
    # frequency's one), and the very message the job sends again.
    hour_before = NOW - timedelta(hours=1)
    promos = [(users[t], f"promo-{t}") for t in ("capped", "holdout_capped")]
    gate_check(channel="push", requests=promos, tags=("promo",), now=hour_before)
    plain = [(users[t], f"plain-{t}") for t in ("weekly", "own")]
    gate_check(channel="email", requests=plain, now=hour_before)
    gate_check(channel="email", requests=[(users["duplicate"], "the-job")], now=hour_before)
    # The policy.
    make_rule("a promo a day", channel="all", match="tag", tag="promo")
    night = QuietFields(
        segment=None, channel="email", start="21:00", end="08:00", spread_minutes=30
    )
    QUIET_HOURS.create(fields=night, via="command")
    control = HoldoutFields(share=SHARE, salt=SALT, exclude_segments=["vip"])
    holdout_set(control, segments=SEGMENTS, via="api")
    experiment_create(
        ExperimentFields(
            name="vip promos",
            segment="vip",
            arms=[
                ArmFields("three", 0.5, [THREE_PROMOS]),
                ArmFields("weekly", 0.5, [THREE_A_WEEK], mode="add"),
            ],
            starts_at=NOW - timedelta(days=1),
            ends_at=NOW + timedelta(days=13),
            salt="vip-promos",
        ),
        via="command",
        now=NOW - timedelta(days=1),
    )
    for scope, trait in (("email", "suppressed"), ("all", "suppressed_all")):
        suppress_now(channel=scope, user_ids=[users[trait]], reason="bounced", source="test")
    erased_add([users["erased"]])
    suppression_cache().read_now()
    until = NOW + timedelta(hours=5)
    said(users["channel_off"], channels={"email": False})
    said(users["news_off"], topics={"news": {"email": False}})
    said(users["paused"], paused_until=until)
    said(users["paused_email"], paused_channels={"email": until})
    preference_cache().read_now()
    return users, holds_encode([(LAUNCH, np.array([users["reserved"]], dtype=np.uint64))])


def designed_job(users: dict[str, int]) -> Job:
    """A promo email about news to every designed user, each sent the message `the-job`."""
    order = sorted(users.values())
    quiet = users["quiet"]
    return Job(
        channel="email",
        campaign="spring",
        tags=("promo",),
        priority=5,
        topic="news",
        job_id=12,
        users=order,
        messages=["the-job"] * len(order),
        zones=[NIGHT_ZONE if u == quiet else None for u in order],
        now=NOW,
    )


def test_every_reason_of_the_stages_comes_out_of_job_decided_as_out_of_the_gate(designed):
    """One job meets every stage: each designed user gets the reason of their trait, from the
    gate and from job_decided alike; held-out users show the rule that would have refused them
    (or none), the quiet one its release, the reserved one its job, the paused one the pause's
    end. The same job again: every admitted send a duplicate. Without a snapshot, all but the
    lists' and the preferences' refusals are `unavailable`, alike too."""
    users, holds = designed
    job = designed_job(users)
    deciders = Deciders.read(job.users, holds)
    decided = dict(zip(job.users, deciders.decide(job), strict=True))
    assert {trait: decided[u][0] for trait, u in users.items()} == EXPECTED
    assert {reason for reason, *_ in decided.values()} == STAGE_REASONS
    # What each says beyond its reason.
    assert decided[users["holdout"]][1] is None  # it would have been sent
    named = decided[users["holdout_capped"]][1]
    assert named is not None and named[1:] == ("a promo a day", 1)
    release = datetime(2027, 3, 14, 12, 0, tzinfo=UTC).timestamp()  # 08:00 in New York
    wait = release + user_offset(users["quiet"], 1800) - NOW.timestamp()
    assert decided[users["quiet"]][2] == pytest.approx(wait, abs=0.002)
    assert decided[users["reserved"]][2:] == (7200.0, 77)  # until LAUNCH starts
    assert decided[users["paused"]][2] == pytest.approx(5 * 3600 - 0.25, abs=0.002)
    # A second later, the same job: what was sent is a duplicate.
    again = deciders.decide(replace(job, now=NOW + timedelta(seconds=1)))
    sent = [k for k, u in enumerate(job.users) if decided[u][0] == "allowed"]
    assert {again[k][0] for k in sent} == {"duplicate"}
    # No snapshot: the lists and the preferences still refuse; everyone else is unavailable.
    blind = deciders.decide(replace(job, now=NOW + timedelta(seconds=2), snapshot=False))
    before = {"suppressed", "preference", "paused"}
    assert [reason for reason, *_ in blind] == [
        decided[u][0] if decided[u][0] in before else Reason.UNAVAILABLE for u in job.users
    ]


def test_lists_never_read_refuse_as_unavailable_alike(designed, django_db_blocker):
    """A process that never read the suppression list (the database away) refuses every
    recipient as `unavailable`; one that read it but never the preferences refuses the
    suppressed and makes the rest `unavailable`: job_decided as the gate."""
    users, holds = designed
    job = designed_job(users)
    deciders = Deciders.read(job.users, holds)
    assert suppression_cache().count("email") == 1  # the process's list, read now
    with django_db_blocker.block():
        none_read = deciders.decide(
            job, suppressions=SuppressionCache(ttl=60), preferences=PreferenceCache(ttl=60)
        )
        unread = deciders.decide(job, preferences=PreferenceCache(ttl=60))
    assert {reason for reason, *_ in none_read} == {"unavailable"}
    suppressed = {users[t] for t in ("suppressed", "suppressed_all", "erased")}
    assert [reason for reason, *_ in unread] == [
        "suppressed" if u in suppressed else "unavailable" for u in job.users
    ]


def test_a_user_listed_twice_is_left_to_the_gate_and_no_recipient_is_no_decision(designed):
    """job_decided decides distinct users only: a job listing one twice is answered None (its
    plan then asks the gate itself); a job of nobody decides nobody."""
    users, holds = designed
    table = policy_read()
    options: dict[str, Any] = {
        "channel": "email", "campaign": "spring", "tags": (), "priority": 5, "topic": None,
        "holder": 0, "zones": None, "now_ms": instant_ms(NOW), "table": table,
        "suppressions": suppression_cache(), "preferences": preference_cache(),
        "holds": holds_decode(holds), "logs": ModelLogs(),
    }  # fmt: skip
    twice = np.array([users["plain"], users["capped"], users["plain"]], dtype=np.uint64)
    messages = np.arange(3, dtype=np.uint64)
    listed: tuple[np.ndarray, list[str | None]] = (np.zeros(3, dtype=np.int64), ["default"])
    assert job_decided(users=twice, messages=messages, segments=listed, **options) is None
    none = np.array([], dtype=np.uint64)
    default: list[str | None] = ["default"]
    nobody = job_decided(users=none, messages=none, segments=(none, default), **options)
    assert nobody is not None and nobody.reason.size == 0
