"""The gate: segments + rules + limiter, one decision per request.

`gate_check` is what the REST API, the send worker and the admin's what-if all call. Per batch it
resolves every user's segment in memory (one bitmap operation), takes the rules from the
in-process cache and runs the stages in order (STAGES; worker/stages/): the suppression list,
the person's preferences, the snapshot (no snapshot: `unavailable`), the control group and the
experiments' arms, quiet hours (decided in Python: they cost Redis nothing), then the rules,
resolved per segment and time zone (a calendar window in the user's own zone), the person's own
frequency and the reservations' holds among them, asked of the limiter in one round trip per
Redis node. A transactional send passes them all (`exempt`). Every
decision is counted and kept in the ledger (not dry runs).
"""

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, cast

from django.core.exceptions import ValidationError

from gatekeeper.lib.instants import instant_ms, ms_or_now
from limits.channels import validate_channel
from limits.engine.limiter import Decider, Decision, Limiter, get_limiter
from limits.engine.log import holder_of
from limits.engine.reservations import Holds, holds_cache
from limits.engine.table import DEFAULT_PRIORITY, NO_RULES, PolicyTable
from limits.engine.topics import topic_problem
from limits.ledger.stream import ledger_append, ledger_enabled, ledger_outcomes
from limits.people.preferences import PreferenceCache, preference_cache
from limits.people.suppression import SuppressionCache, suppression_cache
from limits.policy.selectors import PolicyCache, policy_cache
from limits.reasons import Category, Outcome, Reason, validate_category
from segments.index import get_index
from worker import latency, stats
from worker.stages import holdout, preferences, quiet_hours, rules, snapshot, suppressed
from worker.stages.base import Batch, Stage

logger = logging.getLogger(__name__)

# The checks, in the order DESIGN.md gives (Gate): each decides some of the requests still
# pending and passes the rest on; the rules ask the limiter about all that is left.
STAGES: tuple[Stage, ...] = (
    suppressed.STAGE,
    preferences.STAGE,
    snapshot.STAGE,
    holdout.STAGE,
    quiet_hours.STAGE,
    rules.STAGE,
)


class SegmentResolver(Protocol):
    version: str

    def resolve_many(self, ids: Sequence[int]) -> list[str]: ...


class GateError(ValidationError):
    """A request the gate cannot decide at all (unknown channel or category), naming the field
    (the REST API's base answers it as that field's 400)."""


def _checked(channel: str, category: str = Category.MARKETING) -> None:
    try:
        validate_channel(channel, field="channel")
        validate_category(category, field="category")
    except ValidationError as exc:
        raise GateError(exc.message_dict) from None


class Gate:
    def __init__(
        self,
        *,
        limiter: Limiter | None = None,
        policy: PolicyCache | None = None,
        index: SegmentResolver | None = None,
        suppressions: SuppressionCache | None = None,
        preferences: PreferenceCache | None = None,
        record_stats: bool = True,
        record_latency: bool | None = None,
        record_ledger: bool | None = None,
        holds: Holds | None = None,
        decider: Decider | None = None,
    ) -> None:
        """`record_stats`: count the decisions (worker/stats.py); `record_latency`: time the
        calls (worker/latency.py; None: as `record_stats`), each for /metrics, never for dry runs.
        `record_ledger`: keep decisions in the send ledger (None: as GATEKEEPER_LEDGER says).
        `holds`: the reservations' holds to apply (None: those the plan wrote,
        limits.engine.reservations). `decider`: what decides the requests under their rules
        (None: the limiter; the plan's gate gives the decision model, limits.engine.model)."""
        self._holds = holds
        self._decider = decider
        self._limiter = limiter
        self._policy = policy
        self._index = index
        self._suppressions = suppressions
        self._preferences = preferences
        self.record_stats = record_stats
        self.record_latency = record_stats if record_latency is None else record_latency
        self.record_ledger = record_ledger

    @property
    def limiter(self) -> Limiter:
        return self._limiter or get_limiter()

    @property
    def decider(self) -> Decider:
        return self._decider or self.limiter

    @property
    def policy(self) -> PolicyCache:
        return self._policy or policy_cache()

    @property
    def holds(self) -> Holds:
        if self._holds is not None:
            return self._holds
        limiter = self.limiter
        return holds_cache().get(limiter.client, limiter.prefix)

    @property
    def suppressions(self) -> SuppressionCache:
        return self._suppressions or suppression_cache()

    @property
    def preferences(self) -> PreferenceCache:
        return self._preferences or preference_cache()

    def index(self) -> SegmentResolver | None:
        return self._index if self._index is not None else get_index()

    def check(
        self,
        *,
        channel: str,
        requests: Sequence[tuple[int, str]],
        campaign: str = "",
        category: str = Category.MARKETING,
        tags: tuple[str, ...] = (),
        priority: int = DEFAULT_PRIORITY,
        time_zones: Sequence[str | None] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        table: PolicyTable | None = None,
        job: int | None = None,
        topic: str = "",
        topic_gone: Literal["refuse", "ignore"] = "refuse",
    ) -> list[Decision]:
        """`now`: the instant the requests are decided at (tests, replays, the plan); None: Redis's
        clock for the limiter, this process's for what Python decides.
        `topic`: what the sends are about (a topic's slug; "" for none), kept in the ledger;
        GateError naming `topic` for one that does not exist or is not sent on `channel`, or
        with `topic_gone="ignore"` (a send job's, checked when it was made) the sends go as of
        no topic, and a warning says so.
        `time_zones`: per request, the user's zone (None: the segment's, else the setting's),
        kept in the ledger as named; ValueError when not one per request.
        `table`: decide by these rules instead of the live ones (the what-if). `job`: the send
        job whose run asks (worker/claims.py): its admitted sends, transactional ones too, are
        recorded for it, and a duplicate names the job that recorded it (`holder`)."""
        started = time.perf_counter()
        _checked(channel, category)
        # Once, here: below the gate counts time as the engine does (epoch milliseconds).
        now_ms = None if now is None else instant_ms(now)
        policy = table
        if topic:
            policy = policy or self.policy.table()
            problem = topic_problem(policy.topics, topic, channel)
            if problem is not None and topic_gone == "ignore":
                logger.warning("Sends go without their topic: %s", problem)
                topic = ""
            elif problem is not None:
                raise GateError({"topic": [problem]})
        if not requests:
            return []
        if time_zones is not None and len(time_zones) != len(requests):
            raise ValueError(f"{len(time_zones)} time zones for {len(requests)} requests")
        index = self.index()
        segments = None if index is None else index.resolve_many([u for u, _ in requests])
        if category == Category.TRANSACTIONAL and job is not None and not dry_run:
            # Never refused, never counted: recorded uncounted, so the message id is claimed.
            decisions = self._claimed_exempt(channel, requests, job=job, now_ms=now_ms)
            for k, decision in enumerate(decisions):
                decision.segment = segments[k] if segments is not None else None
        elif category == Category.TRANSACTIONAL:
            # Receipts and one-time codes: never refused, never counted.
            decisions = [
                Decision(
                    user_id=u,
                    message_id=m,
                    allowed=True,
                    reason=Reason.EXEMPT,
                    counts={},
                    limits={},
                    retry_after=None,
                    segment=segments[k] if segments is not None else None,
                )
                for k, (u, m) in enumerate(requests)
            ]
        else:
            batch = Batch(
                channel=channel,
                campaign=campaign,
                tags=tags,
                priority=priority,
                dry_run=dry_run,
                now_ms=now_ms,
                clock_ms=ms_or_now(now_ms),
                requests=requests,
                segments=segments,
                time_zones=time_zones,
                table=policy or self.policy.table(),
                holder=holder_of(job or 0),
                topic=policy.topics.get(topic) if policy is not None and topic else None,
            )
            for stage in STAGES:
                stage.run(batch, self)
                if not batch.pending and not batch.dry:
                    break
            batch.mark_arms()
            decisions = cast(list[Decision], batch.decisions)  # the last stage decides the rest
        if not dry_run:
            if self.record_stats:
                stats.record(channel=channel, decisions=decisions)
            if self._ledger_on():
                # An erased person's decision is not named; the zones stay aligned with the rest.
                kept = [k for k, d in enumerate(decisions) if not d.erased]
                ledger_append(
                    at_ms=ms_or_now(now_ms),
                    channel=channel,
                    campaign=campaign,
                    tags=tags,
                    priority=priority,
                    category=category,
                    snapshot_version=index.version if index is not None else "",
                    decisions=[decisions[k] for k in kept],
                    topic=topic,
                    time_zones=None if time_zones is None else [time_zones[k] for k in kept],
                )
            if self.record_latency:
                latency.observe(channel, len(requests), time.perf_counter() - started)
        return decisions

    def _unruled(
        self, channel: str, requests: Sequence[tuple[int, str]], **options: Any
    ) -> list[Decision]:
        """The limiter's answers under no rule: what the users' logs hold of these sends."""
        return self.limiter.acquire(
            channel, requests, NO_RULES, retention_ms=self.policy.table().retention_ms, **options
        )

    def _claimed_exempt(
        self, channel: str, requests: Sequence[tuple[int, str]], *, job: int, now_ms: int | None
    ) -> list[Decision]:
        decisions = self._unruled(
            channel,
            requests,
            now_ms=now_ms,
            holder=holder_of(job),
            uncounted=True,
        )
        for decision in decisions:
            if decision.reason == Reason.ALLOWED:
                decision.reason, decision.counts = Reason.EXEMPT, {}
            elif decision.reason == Reason.DUPLICATE:
                decision.counts = {}
        return decisions

    def holders(self, *, channel: str, requests: Sequence[tuple[int, str]]) -> list[int | None]:
        """Per (user id, message id), the holder of its entry in the user's logs (0: none
        named), None when there is none; nothing recorded. Redis errors are raised."""
        if not requests:
            return []
        decisions = self._unruled(channel, requests, dry_run=True)
        if any(d.reason == Reason.UNAVAILABLE for d in decisions):
            raise ConnectionError("the logs could not be read")
        return [d.holder if d.reason == Reason.DUPLICATE else None for d in decisions]

    def release(
        self,
        *,
        channel: str,
        requests: Sequence[tuple[int, str]],
        job: int = 0,
        category: str = Category.MARKETING,
    ) -> list[bool]:
        """Take recorded sends back out of their logs (with `job`: only that job's entries;
        a transactional category: the job's uncounted claims)."""
        _checked(channel, category)
        removed = self.limiter.release(
            channel, requests, holder=holder_of(job), uncounted=category == Category.TRANSACTIONAL
        )
        released = [
            (user_id, message_id, Outcome.RELEASED)
            for (user_id, message_id), done in zip(requests, removed, strict=True)
            if done
        ]
        if released and self._ledger_on():
            # On the ledger's rows too, so that a rebuild of the logs leaves them out; a
            # send older than the longest window has no entry to give back.
            since_ms = ms_or_now(None) - self.policy.table().retention_ms
            ledger_outcomes(channel=channel, since_ms=since_ms, outcomes=released)
        return removed

    def outcomes(
        self, *, channel: str, since: datetime, outcomes: Sequence[tuple[int, str, str]]
    ) -> None:
        """Keep what became of admitted sends in the ledger: (user id, message id, outcome),
        an Outcome (limits.reasons); `since`: no earlier than their decision."""
        since_ms = instant_ms(since)
        if self._ledger_on():
            ledger_outcomes(channel=channel, since_ms=since_ms, outcomes=outcomes)

    def _ledger_on(self) -> bool:
        return self.record_ledger if self.record_ledger is not None else ledger_enabled()


_default_gate = Gate()


def gate_check(
    *,
    channel: str,
    requests: Sequence[tuple[int, str]],
    campaign: str = "",
    category: str = Category.MARKETING,
    tags: tuple[str, ...] = (),
    priority: int = DEFAULT_PRIORITY,
    time_zones: Sequence[str | None] | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
    table: PolicyTable | None = None,
    job: int | None = None,
    topic: str = "",
    topic_gone: Literal["refuse", "ignore"] = "refuse",
) -> list[Decision]:
    """One decision per request, in request order. Raises GateError for an unknown channel or
    topic."""
    return _default_gate.check(
        channel=channel,
        requests=requests,
        campaign=campaign,
        category=category,
        tags=tags,
        priority=priority,
        time_zones=time_zones,
        dry_run=dry_run,
        now=now,
        table=table,
        job=job,
        topic=topic,
        topic_gone=topic_gone,
    )


def job_gate_check(
    job: Any, recipients: Sequence[Any], *, now: datetime | None, gate: Gate | None = None
) -> list[Decision]:
    """A send job's recipients (typed: user_id, message_id, time_zone) as its run puts them
    through the gate (`gate`: the process's), at `now` (None: the gate's clock). The one place
    that says how a job's fields become a gate call: the run and the plan (worker/plan.py) ask
    the same question."""
    return (gate or _default_gate).check(
        channel=job.channel,
        requests=[(r.user_id, r.message_id) for r in recipients],
        campaign=job.campaign,
        category=job.category,
        tags=tuple(job.tags),
        priority=job.priority,
        time_zones=[r.time_zone for r in recipients],
        now=now,
        job=job.pk,
        topic=job.topic,
        topic_gone="ignore",  # checked when the job was made; deleted since: no topic
    )


def gate_decided_before(job: Any, decisions: Sequence[Decision], *, now: datetime | None) -> None:
    """Decisions a send job's run made before the gate (`outranked`, by its round) counted and
    kept in the ledger as the gate's are (worker/stats.py; limits/ledger/), at `now` (None:
    this process's clock); each one's segment set as the gate sets it."""
    if not decisions:
        return
    index = _default_gate.index()
    if index is not None:
        for decision, segment in zip(
            decisions, index.resolve_many([d.user_id for d in decisions]), strict=True
        ):
            decision.segment = segment
    stats.record(channel=job.channel, decisions=decisions)
    if not ledger_enabled():
        return
    ledger_append(
        at_ms=ms_or_now(None if now is None else instant_ms(now)),
        channel=job.channel,
        campaign=job.campaign,
        tags=tuple(job.tags),
        priority=job.priority,
        category=job.category,
        snapshot_version=index.version if index is not None else "",
        decisions=decisions,
        topic=job.topic,
        outranked=[
            None if d.outranked_by is None else (d.outranked_by["job"], d.outranked_by["value"])
            for d in decisions
        ],
    )


def gate_release(
    *,
    channel: str,
    requests: Sequence[tuple[int, str]],
    job: int = 0,
    category: str = Category.MARKETING,
) -> list[bool]:
    """Take recorded sends back out (their dispatch failed for good): Gate.release."""
    return _default_gate.release(channel=channel, requests=requests, job=job, category=category)


def gate_holders(*, channel: str, requests: Sequence[tuple[int, str]]) -> list[int | None]:
    """Who holds each send in its user's logs (Gate.holders)."""
    return _default_gate.holders(channel=channel, requests=requests)


def gate_outcomes(
    *, channel: str, since: datetime, outcomes: Sequence[tuple[int, str, str]]
) -> None:
    """What became of admitted sends, for the ledger (Gate.outcomes)."""
    _default_gate.outcomes(channel=channel, since=since, outcomes=outcomes)
