"""The forward plan: for every scheduled send job, per recipient, what the gate will decide when
the job starts, given each user's log now, every rule, quiet hours, preferences, suppression and
the control group, and every job that starts before it (its admitted sends counted as if made).

How: the decision model (limits/engine/model.py). The logs of every user a scheduled job reaches
are read from Redis in bulk into memory, then each job, in the order the jobs start, is put
through the gate's own stages at its `start_at` (the gate's explicit clock), its rules decided by
the model over those logs instead of the Lua function: the same rule records (calendar windows in
each user's zone, DST included, reserves, holds), the same answers (the tests allow no
difference), so that a prediction is the gate's own answer. An earlier job's admitted sends are
recorded in the model's logs, so the later jobs count them. Nothing is written to Redis, the
ledger or the decision counts.

What a prediction assumes (docs/worker.md, "The plan"): every send of a job is decided at its
`start_at`, and nothing else is sent in between (no other campaign, no send of a job that is
running now). Waiting sends a job defers are shown as held, with when they would be released;
what the gate decides then is not predicted.
"""

import functools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from hashlib import blake2b
from typing import Any

import msgspec
import numpy as np
from django.db.models import TextField
from django.db.models.functions import Cast

from gatekeeper.lib.leases import RedisLease
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.channels import ALL
from limits.engine.limiter import Decision, Limiter, get_limiter
from limits.engine.log import BUCKET_BITS, holder_of
from limits.engine.model import (
    NO_LIMIT,
    ModelLimiter,
    ModelLogs,
    ascending_distinct,
    sorted_distinct,
    users_buckets,
)
from limits.engine.reservations import (
    HeldJob,
    Holds,
    holds_cache,
    holds_decode,
    holds_encode,
    holds_store,
)
from limits.engine.table import PERSON, RULE, PolicyTable, RuleView, own_rule
from limits.engine.topics import topic_problem
from limits.policy.quota import Unavailable
from limits.policy.selectors import PolicyCache, policy_read
from limits.reasons import CAPPED, HELD, SENDING, Category, Reason
from segments.index import get_index
from worker.delivery.base import recipients_typed
from worker.gate import Gate, SegmentResolver, job_gate_check
from worker.modelled import (
    CODES,
    REASONS,
    JobDecisions,
    job_decided,
    segment_codes,
)
from worker.models import CompactJSONDecoder, SendChunk, SendJob
from worker.planned import Packed, chunks_packed, packed_of
from worker.round_entries import round_decided

logger = logging.getLogger(__name__)

LOST_SHOWN = 100  # users named per job among those who lose a send to an earlier job


@dataclass
class JobPlan:
    """One scheduled job's predicted decisions, counted."""

    job_id: int
    campaign: str
    channel: str
    priority: int
    start_at: datetime
    tags: tuple[str, ...] = ()
    recipients: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    # (rule id, rule name) -> sends that rule will refuse
    rules: Counter[tuple[int, str]] = field(default_factory=Counter)
    # job id -> this job's sends refused by a rule whose room that job takes (an earlier job),
    # or holds (a later reserved job)
    taken_by: Counter[int] = field(default_factory=Counter)
    lost_users: list[int] = field(default_factory=list)  # the first LOST_SHOWN of them
    held_from: float | None = None  # quiet hours: the first and last release, epoch seconds
    held_until: float | None = None
    # Sends predicted that one more send to the same user before the job starts, counted by the
    # rule with the least room, would have refused (None: not known, the job went through the
    # gate itself).
    one_slot_left: int | None = None
    # the users whose send it records (allowed; not a duplicate), sorted
    admitted: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    audience: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    _admits: Callable[[np.ndarray], np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )

    def admits(self, users: np.ndarray) -> np.ndarray:
        """Which of `users` it records a send for (`admitted` as a table, made once)."""
        if self._admits is None:
            self._admits = _membership(self.admitted)
        return self._admits(users)

    @property
    def sent(self) -> int:
        return sum(self.reasons[r] for r in SENDING)

    @property
    def held(self) -> int:
        return sum(self.reasons[r] for r in HELD)


def start_order(job: SendJob) -> tuple[Any, ...]:
    """The order a plan takes jobs in: as they start; ties, the higher priority first, then the
    older."""
    return (job.start_at, -job.priority, job.pk)


def scheduled_jobs() -> list[SendJob]:
    """The jobs a plan covers, every `scheduled` one (its recipients are read), in start_order."""
    jobs = SendJob.objects.filter(status=SendJob.Status.SCHEDULED, cancelled_at__isnull=True)
    return sorted(jobs, key=start_order)


def plan_compute(
    jobs: Sequence[SendJob] | None = None,
    *,
    limiter: Limiter | None = None,
    index: SegmentResolver | None = None,
    holds: Holds | None = None,
    audiences: dict[int, "JobRecipients"] | None = None,
    table: PolicyTable | None = None,
    steps: dict[str, float] | None = None,
    logs: ModelLogs | None = None,
    decided: dict[int, JobDecisions | None] | None = None,
) -> list[JobPlan]:
    """Every job's predicted decisions (`jobs` in the order they start; default
    scheduled_jobs()), by the process's gate (`index`: resolve segments with this one instead of
    the loaded snapshot) with the decision model over the logs of `limiter` (default: the live
    one) as they are now,
    with the reservations' `holds` (default: those in force). `audiences`: each job's users, as
    job_audiences read them (default: read here). `table`: the policy, as policy_read() gives
    it (default: read now; never the process's cached copy, which may be older than a rule
    the plan is made for). `logs`: the users' logs as plan_logs read them (default: read
    here; a plan records its jobs' sends in its own fork of them). `decided`: gets each job's
    decisions (None for a job put through the gate itself), for a remake after an edit
    (plan_remade). Raises Unavailable when Redis does not answer."""
    jobs = scheduled_jobs() if jobs is None else list(jobs)
    live = limiter or get_limiter()
    if holds is None:
        holds = holds_cache().get(live.client, live.prefix)
    table = policy_read() if table is None else table
    started = time.monotonic()
    took = steps if steps is not None else {}
    plans: list[JobPlan] = []
    if audiences is None:
        audiences = job_audiences(jobs)
    took["recipients"] = time.monotonic() - started
    logs = (plan_logs(jobs, audiences, live) if logs is None else logs).fork()
    took["logs"] = time.monotonic() - started - took["recipients"]
    replay = _model_gate(logs, table, holds, index=index)
    for job in jobs:
        found = _job_decided(job, audiences[job.pk], replay, logs, table=table)
        if found is None:  # a user listed twice, transactional sends: as the gate runs it
            plan = _job_planned(job, replay, earlier=plans)
        else:
            plan = _counted(job, found, plans)
        if decided is not None:
            decided[job.pk] = found
        plan = _round_counted(plan, audiences[job.pk])
        plan.audience = audiences[job.pk].audience
        plans.append(plan)
    took["decisions"] = time.monotonic() - started - took["recipients"] - took["logs"]
    logger.info(
        "Planned %d jobs (%d recipients) in %.1f s: %s",
        len(jobs),
        sum(p.recipients for p in plans),
        time.monotonic() - started,
        ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items()),
    )
    return plans


def _model_gate(
    logs: ModelLogs, table: PolicyTable, holds: Holds, *, index: SegmentResolver | None = None
) -> Gate:
    """The gate a plan decides with: the decision model over `logs` for the limiter, `table`
    for the policy, nothing recorded."""
    return Gate(
        decider=ModelLimiter(logs),
        index=index,
        holds=holds,
        policy=PolicyCache.holding(table),
        record_stats=False,
        record_ledger=False,
    )


def plan_logs(
    jobs: Sequence[SendJob], audiences: dict[int, "JobRecipients"], limiter: Limiter
) -> ModelLogs:
    """The logs of every user the jobs reach, read from Redis in bulk (Unavailable when it
    does not answer)."""
    buckets = sorted_distinct(
        np.concatenate([audiences[job.pk].buckets for job in jobs] or [_NONE])
    )
    try:
        return ModelLogs.read(limiter, buckets=buckets)
    except REDIS_DOWN as exc:
        raise Unavailable(f"Redis is not answering; the plan cannot be made: {exc}") from exc


def _chunks(job: SendJob) -> Iterator[list[Any]]:
    """A scheduled job's recipients, chunk by chunk as its run will gate them."""
    chunks = SendChunk.objects.filter(job=job, status=SendChunk.Status.STAGED).order_by("pk")
    for recipients in chunks.values_list("recipients", flat=True).iterator(chunk_size=20):
        yield recipients_typed(recipients)


_NONE = np.empty(0, dtype=np.uint64)


class _Addressed(msgspec.Struct):
    """What a plan reads of a recipient (the other fields are skipped)."""

    user_id: int
    message_id: str
    time_zone: str | None = None
    value: float | None = None


_ADDRESSED = msgspec.json.Decoder(list[_Addressed])


@dataclass(frozen=True)
class JobRecipients:
    """A scheduled job's recipients as a plan reads them: in the order its run gates them,
    each one's user, message id (limits.engine.model.message_int of its hash) and the zone it
    names (`zones` None: none names one)."""

    users: np.ndarray
    messages: np.ndarray
    zones: list[str | None] | None
    # Left out: the recipients a decided round outranked (refused before the gate when the job
    # runs; worker/round_entries.py).
    outranked: int = 0
    # Each one's own value in a round (float64, NaN: the job's), None when none carries one.
    values: np.ndarray | None = None

    @functools.cached_property
    def audience(self) -> np.ndarray:
        """Its users, sorted, once each."""
        return ascending_distinct(self.users)

    @functools.cached_property
    def buckets(self) -> np.ndarray:
        """Its users' log buckets (limits.engine.model.users_buckets)."""
        return users_buckets(self.audience, ordered=True)

    def only(self, picked: np.ndarray) -> "JobRecipients":
        """Those of its recipients where `picked` (a mask), in the same order."""
        zones = None
        if self.zones is not None:
            zones = [self.zones[k] for k in np.flatnonzero(picked).tolist()]
        values = None if self.values is None else self.values[picked]
        return JobRecipients(
            users=self.users[picked], messages=self.messages[picked], zones=zones, values=values
        )


# (job, created_at, total) -> its recipients: read once. An edit never changes a job's
# recipients (none of worker.services.EDITABLE is theirs), so a job keeps them whatever else is
# edited.
_READ: dict[tuple[int, str, int], JobRecipients] = {}


def job_audiences(jobs: Sequence[SendJob]) -> dict[int, JobRecipients]:
    """Each job's recipients, read once for a plan and its rounds (and kept in this process
    while the job is scheduled: a plan made again reads only the jobs new to it)."""
    wanted = {(job.pk, job.created_at.isoformat(), job.total): job for job in jobs}
    for key in [key for key in _READ if key not in wanted]:
        del _READ[key]
    out = {}
    for key, job in wanted.items():
        found = _READ.get(key)
        if found is None:
            found = _READ[key] = _recipients_read(job)
        out[job.pk] = _round_left(job, found)
    return out


def _round_left(job: SendJob, recipients: JobRecipients) -> JobRecipients:
    """A job's recipients without those its decided round outranked."""
    decided = round_decided(job)
    if decided is None or not decided.outranked.size:
        return recipients
    kept = decided.outranked_at(recipients.users) < 0
    return replace(recipients.only(kept), outranked=int((~kept).sum()))


def _round_counted(plan: JobPlan, recipients: JobRecipients) -> JobPlan:
    """A plan counting the recipients its job's round outranked, as the job's run will."""
    if recipients.outranked:
        plan.recipients += recipients.outranked
        plan.reasons[Reason.OUTRANKED] += recipients.outranked
    return plan


def _recipients_read(job: SendJob) -> JobRecipients:
    """A scheduled job's staged recipients, chunk by chunk in the order its run gates them: the
    arrays stored when they were staged (worker/planned.py), or, for a chunk without readable
    ones (staged by an older release), its JSON decoded and each message id hashed."""
    chunks = SendChunk.objects.filter(job=job, status=SendChunk.Status.STAGED).order_by("pk")
    parts = chunks_packed(chunks)
    unread = [pk for pk, part in parts if part is None]
    decoded: dict[int, Packed] = {}
    for first in range(0, len(unread), 1000):
        texts = chunks.filter(pk__in=unread[first : first + 1000]).annotate(
            text=Cast("recipients", TextField())
        )
        for pk, text in texts.values_list("pk", "text").iterator(chunk_size=20):
            decoded[pk] = _json_read(text)
    read = [part or decoded[pk] for pk, part in parts]
    if not read:
        return JobRecipients(users=_NONE, messages=_NONE, zones=None)
    zones: list[str | None] = []
    if any(part.codes is not None for part in read):
        zones = [zone for part in read for zone in part.zones()]
    values = None
    if any(part.values is not None for part in read):
        values = np.concatenate(
            [
                np.full(part.users.size, np.nan) if part.values is None else part.values
                for part in read
            ]
        ).astype(np.float64, copy=False)
    return JobRecipients(
        users=np.concatenate([part.users for part in read]).astype(np.uint64, copy=False),
        messages=np.concatenate([part.messages for part in read]).astype(np.uint64, copy=False),
        zones=zones if any(zones) else None,
        values=values,
    )


def _json_read(text: str) -> Packed:
    """A chunk's recipients from its JSON, as packed_read gives them."""
    try:
        part = _ADDRESSED.decode(text)
    except msgspec.DecodeError:  # NaN, from older rows
        part = msgspec.convert(CompactJSONDecoder().decode(text), list[_Addressed])
    return packed_of(
        [r.user_id for r in part],
        [r.message_id for r in part],
        [r.time_zone for r in part],
        [r.value for r in part],
    )


def _job_decided(
    job: SendJob, recipients: JobRecipients, gate: Gate, logs: ModelLogs, *, table: PolicyTable
) -> JobDecisions | None:
    """A job's recipients decided at once (worker/modelled.py), as the gate decides them at
    its start; None for a job that must go through the gate itself (a user listed twice, a
    transactional job)."""
    assert job.start_at is not None
    if job.category != Category.MARKETING:
        return None
    topic = None
    if job.topic and topic_problem(table.topics, job.topic, job.channel) is None:
        topic = table.topics.get(job.topic)
    index = gate.index()
    decided = job_decided(
        channel=job.channel,
        campaign=job.campaign,
        tags=tuple(job.tags),
        priority=job.priority,
        topic=topic,
        holder=holder_of(job.pk),
        users=recipients.users,
        messages=recipients.messages,
        zones=recipients.zones,
        now_ms=round(job.start_at.timestamp() * 1000),
        table=table,
        segments=None if index is None else segment_codes(index, recipients.users),
        suppressions=gate.suppressions,
        preferences=gate.preferences,
        holds=gate.holds,
        logs=logs,
    )
    if decided is not None and (decided.reason == CODES[Reason.UNAVAILABLE]).any():
        raise Unavailable("Redis or the segment snapshot is not available; no plan.")
    return decided


def _reason_table(reasons: Sequence[Reason]) -> np.ndarray:
    """Per reason code (worker.modelled.REASONS), whether it is among `reasons`."""
    table = np.zeros(len(REASONS), dtype=bool)
    table[[CODES[r] for r in reasons]] = True
    return table


_IS_HELD = _reason_table(HELD)
_IS_CAPPED = _reason_table(CAPPED)


def _counted(job: SendJob, decided: JobDecisions, earlier: list[JobPlan]) -> JobPlan:
    """A job's decisions counted as its plan shows them."""
    assert job.start_at is not None
    plan = JobPlan(
        job_id=job.pk,
        campaign=job.campaign,
        channel=job.channel,
        priority=job.priority,
        start_at=job.start_at,
        tags=tuple(job.tags),
        recipients=int(decided.users.size),
    )
    counts = np.bincount(decided.reason, minlength=len(REASONS))
    for code in np.flatnonzero(counts).tolist():
        plan.reasons[REASONS[code]] += int(counts[code])
    ruled = decided.rule >= 0
    if ruled.any():
        by_rule = np.bincount(decided.rule[ruled], minlength=len(decided.rules))
        for k in np.flatnonzero(by_rule).tolist():
            rule = decided.rules[k]
            plan.rules[(int(rule.id), str(rule.name))] += int(by_rule[k])
    reserved = decided.reserved_for != 0
    lost = reserved.copy()
    if reserved.any():
        jobs, counts_of = np.unique(decided.reserved_for[reserved], return_counts=True)
        for held_for, n in zip(jobs.tolist(), counts_of.tolist(), strict=True):
            plan.taken_by[held_for] += n
    held = _IS_HELD[decided.reason] & ~np.isnan(decided.retry_after)
    if held.any():
        at = job.start_at.timestamp()
        plan.held_from = at + float(decided.retry_after[held].min())
        plan.held_until = at + float(decided.retry_after[held].max())
    admitted = decided.users[decided.reason == CODES[Reason.ALLOWED]]
    plan.admitted = ascending_distinct(admitted)
    plan.one_slot_left = int((decided.room[decided.reason == CODES[Reason.ALLOWED]] == 1).sum())
    capped = _IS_CAPPED[decided.reason] & ruled
    if capped.any() and earlier:
        lost |= _taken_by_earlier(plan, job, decided, capped, earlier)
    plan.lost_users = [int(u) for u in decided.users[lost][:LOST_SHOWN]]
    return plan


def _taken_by_earlier(
    plan: JobPlan,
    job: SendJob,
    decided: JobDecisions,
    capped: np.ndarray,
    earlier: list[JobPlan],
) -> np.ndarray:
    """Name, for each send a rule refuses, the earlier jobs whose admitted send to that user
    the rule counts (same channel or the rule's `all`; its tag or campaign): they took the
    room. A send refused by a rule that no earlier job touched lost to the user's log alone.
    Returns which recipients lost one so."""
    lost = np.zeros(decided.users.size, dtype=bool)
    at = np.flatnonzero(capped)
    users = decided.users[at]
    rule_of = decided.rule[at]
    for before in earlier:
        if not before.admitted.size:
            continue
        hit = before.admits(users)
        if not hit.any():
            continue
        counts = np.array(
            [_counts(None if rule.kind != RULE else rule, before, job) for rule in decided.rules],
            dtype=bool,
        )
        counted = hit & counts[rule_of]
        if counted.any():
            plan.taken_by[before.job_id] += int(counted.sum())
            lost[at[counted]] = True
    return lost


def _job_planned(job: SendJob, gate: Gate, *, earlier: list[JobPlan]) -> JobPlan:
    """A job's plan from the gate itself, chunk by chunk as its run will gate it, counted as
    every plan is (`_counted`); what it cannot tell (`one_slot_left`) is left unknown."""
    assert job.start_at is not None
    decisions: list[Decision] = []
    for part in _chunks(job):
        decisions += job_gate_check(job, part, now=job.start_at, gate=gate)
        if any(d.reason == Reason.UNAVAILABLE for d in decisions):
            raise Unavailable("Redis or the segment snapshot is not available; no plan.")
    plan = _counted(job, _as_arrays(decisions, gate.policy.table(), job), earlier)
    plan.one_slot_left = None
    return plan


def _as_arrays(decisions: Sequence[Decision], table: PolicyTable, job: SendJob) -> JobDecisions:
    """The gate's decisions as job_decided gives them (each rule named found as a view: the
    table's, an experiment arm's, or the person's own frequency on the job's channel)."""
    views = {rule.id: rule for rule in table.rules}
    views.update((rule.id, rule) for e in table.experiments for arm in e.arms for rule in arm.rules)
    rules: dict[tuple[int, str], int] = {}
    listed: list[RuleView] = []

    def index(named: dict[str, Any]) -> int:
        key = (int(named["id"]), str(named["name"]))
        if key not in rules:
            rules[key] = len(listed)
            found = views.get(key[0]) if named["kind"] != PERSON else None
            listed.append(
                found or own_rule(channel=job.channel, window=named["window"], limit=named["limit"])
            )
        return rules[key]

    n = len(decisions)
    return JobDecisions(
        users=np.fromiter((d.user_id for d in decisions), np.uint64, n),
        reason=np.fromiter((CODES[Reason(d.reason)] for d in decisions), np.int64, n),
        rule=np.fromiter((-1 if d.rule is None else index(d.rule) for d in decisions), np.int64, n),
        used=np.fromiter((0 if d.rule is None else d.rule["used"] for d in decisions), np.int64, n),
        retry_after=np.fromiter(
            (np.nan if d.retry_after is None else d.retry_after for d in decisions), float, n
        ),
        reserved_for=np.fromiter((d.reserved_for or 0 for d in decisions), np.int64, n),
        rules=listed,
        room=np.full(n, NO_LIMIT, dtype=np.int64),
    )


def _counts(rule: Any, before: JobPlan, job: SendJob) -> bool:
    """Whether `rule` (a rule view; None: a person's own or an arm's rule, on the channel)
    counts a send of the earlier job `before` when it decides one of `job`."""
    if rule is None:
        return before.channel == job.channel
    return bool(
        rule.counts(
            channel=before.channel, tags=before.tags, campaign=before.campaign, asked=job.campaign
        )
    )


# --- the plan kept: computed in the background, read by the API and the admin ---------------

PLAN_KEY = "plan-result"  # under the limiter's prefix: the latest plan, as JSON
PLAN_LOCK = "plan-computing"  # held while one process computes (one at a time)
PLAN_LOCK_SECONDS = 1800
PLAN_MAX_AGE = 900  # seconds: a plan is made again at least this often while jobs wait
# A reserved job's holds change what earlier jobs get, which may change what it gets: the plan
# is made again with the holds it made until they stop changing (two rounds, as a rule).
HOLDS_ROUNDS = 4


def plan_inputs(jobs: Sequence[SendJob] | None = None, *, table: PolicyTable | None = None) -> str:
    """What a plan depends on, hashed: the scheduled jobs as they are (each edit changes its
    `updated_at`), every rule, quiet hours, topic, holdout and experiment as the gate reads
    them (`table`, default: read now), and the snapshot this process resolves segments with.
    People's own changes (preferences, suppression) are not in it: the plan is made again every
    PLAN_MAX_AGE."""
    jobs = scheduled_jobs() if jobs is None else jobs
    index = get_index()
    parts = [
        repr([(j.pk, j.updated_at.isoformat(), j.total) for j in jobs]),
        repr(policy_read() if table is None else table),
        index.version if index is not None else "",
    ]
    return blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


def plan_shape(plans: Sequence[JobPlan], jobs: Sequence[SendJob]) -> list[dict[str, Any]]:
    """The plan as JSON, one object per job (the API's and the admin's shape)."""
    by_id = {job.pk: job for job in jobs}
    out = []
    for plan in plans:
        refused = {
            str(reason): n
            for reason, n in sorted(plan.reasons.items())
            if reason not in (*SENDING, *HELD) and n
        }
        out.append(
            {
                "job": plan.job_id,
                "campaign": plan.campaign,
                "channel": plan.channel,
                "priority": plan.priority,
                "reserve": bool(by_id[plan.job_id].reserve) if plan.job_id in by_id else False,
                "start_at": plan.start_at.isoformat(),
                "recipients": plan.recipients,
                "sent": plan.sent,
                "held": plan.held,
                "held_from": _iso(plan.held_from),
                "held_until": _iso(plan.held_until),
                "one_slot_left": plan.one_slot_left,
                "refused": refused,
                "rules": [
                    {"id": rule_id, "name": name, "refused": n}
                    for (rule_id, name), n in plan.rules.most_common()
                ],
                "taken_by": [
                    {
                        "job": job_id,
                        "campaign": by_id[job_id].campaign if job_id in by_id else "",
                        "sends": n,
                    }
                    for job_id, n in plan.taken_by.most_common()
                ],
                "lost_users": plan.lost_users,
            }
        )
    return out


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def plan_refresh(*, force: bool = False, limiter: Limiter | None = None) -> bool:
    """Make the plan again when its inputs changed or it is older than PLAN_MAX_AGE (`force`:
    whatever), unless another process is making it. True when this call made one."""
    live = limiter or get_limiter()
    latest = plan_latest(limiter=live)
    jobs = scheduled_jobs()
    # One read of the policy for the plan and the hash it is kept under: a plan made with an
    # older table than its hash says would pass for fresh until PLAN_MAX_AGE.
    table = policy_read()
    inputs = plan_inputs(jobs, table=table)
    fresh = (
        latest is not None
        and latest["inputs"] == inputs
        and time.time() - latest["computed_epoch"] < PLAN_MAX_AGE
    )
    if fresh and not force:
        return False
    # Given back only while it is this call's: a plan made for longer than PLAN_LOCK_SECONDS
    # leaves the lock another process took since as it is.
    lock = RedisLease(f"{live.prefix}{PLAN_LOCK}", PLAN_LOCK_SECONDS, client=live.client)
    if not lock.take():
        return False
    try:
        started = time.time()
        remade = None if force else plan_remade(jobs, table=table)
        if remade is not None:
            plans, blob, users = remade
        else:
            decided: dict[int, JobDecisions | None] = {}
            read: list[ModelLogs] = []
            plans, blob = plan_with_holds(
                jobs, limiter=live, table=table, decided=decided, read=read
            )
            _kept_after(jobs, table, decided, full_at=started, logs=read[0] if read else None)
            users = None
        result = {
            "inputs": inputs,
            "computed_epoch": started,
            "computed_at": datetime.fromtimestamp(started, tz=UTC).isoformat(),
            "seconds": round(time.time() - started, 3),
            # Made again for only these users (an edit of some jobs), the others' predictions
            # kept from the plan made whole at `whole_at`; None: made whole.
            "remade_users": users,
            "whole_at": datetime.fromtimestamp(
                _KEPT.whole_at if _KEPT is not None else started, tz=UTC
            ).isoformat(),
            "jobs": plan_shape(plans, jobs),
            "overlaps": _overlaps(plans, jobs),
        }
        live.client.set(f"{live.prefix}{PLAN_KEY}", json.dumps(result))
        holds_store(live.client, live.prefix, blob, version=f"{inputs}:{started}")
    finally:
        lock.release()
    return True


# --- made again after an edit: only the users it reaches -------------------------------------
# Users are independent: an edit changes the predictions of the users it reaches only, in every
# job they are in. The plan is then made again for those users alone (every job decided over
# them in order, from the logs the plan made whole read) and their decisions put in place of
# the ones kept from the plan made before; the others' are kept. Whom an edit reaches:
# - of some jobs (made, rescheduled, its fields changed, cancelled or started): their users;
# - of a rule, a quiet-hours entry, a classic cap or a segment's zone (_policy_reach): the
#   users of its segment (every segment's for one of every segment) among the recipients of
#   the jobs whose sends it decides (a rule: those it counts, its channel, tag or campaign);
# - of the snapshot (a segment's list or priority): the users it resolves to another segment.
# The plan is made whole instead when an edit may reach anyone (a topic, the control group, an
# experiment, a person's own frequency), when the users reached are more than REMAKE_SHARE of
# the jobs' users, when a job is reserved (a hold reaches other jobs' users through its rounds)
# or was put through the gate itself, and at least every PLAN_MAX_AGE (people's own changes and
# sends made since reach every user).

REMAKE_SHARE = 0.5  # beyond this share of the jobs' users reached, the plan is made whole


@dataclass
class _Kept:
    """The plan this process made last: what it was made from and each job's decisions."""

    table: PolicyTable  # the policy it was made under
    index: Any  # the snapshot it resolved segments with (None: none loaded)
    jobs: dict[int, tuple[str, int]]  # job -> (updated_at, total) as planned
    decided: dict[int, JobDecisions]
    whole_at: float  # when the plan was last made whole (epoch seconds)
    # The users' logs as the plan made whole read them (never changed: a remake decides over a
    # fork), so that a remake predicts from the same moment as the decisions it keeps.
    logs: ModelLogs
    buckets: np.ndarray  # the log buckets those logs were read from (sorted)
    everyone: np.ndarray  # every user of the jobs planned since it was made whole (sorted)
    # everyone's segments under `index` (segment_codes), once a policy edit asks for them
    segments: tuple[np.ndarray, list[str | None]] | None = None

    def segments_of(self) -> tuple[np.ndarray, list[str | None]]:
        if self.segments is None:
            self.segments = _segments(self.index, self.everyone)
        return self.segments


# The overlaps of the jobs' audiences as last counted: counted again only when an audience
# changed (a job moved or edited keeps its recipients).
_OVERLAPS: tuple[tuple[tuple[int, str, int], ...], list[dict[str, Any]]] | None = None


def _overlaps(plans: Sequence[JobPlan], jobs: Sequence[SendJob]) -> list[dict[str, Any]]:
    """plan_overlaps, counted again only when a job's recipients (or the jobs) changed: an edit
    never changes them, nor a job's campaign and channel."""
    global _OVERLAPS
    key = tuple(sorted((job.pk, job.created_at.isoformat(), job.total) for job in jobs))
    if _OVERLAPS is None or _OVERLAPS[0] != key:
        _OVERLAPS = (key, plan_overlaps(plans))
    order = {p.job_id: k for k, p in enumerate(plans)}
    # In the plans' order (the pairs' order follows the jobs').
    return sorted(_OVERLAPS[1], key=lambda pair: (order[pair["jobs"][0]], order[pair["jobs"][1]]))


_KEPT: _Kept | None = None


def _jobs_key(jobs: Sequence[SendJob]) -> dict[int, tuple[str, int]]:
    return {job.pk: (job.updated_at.isoformat(), job.total) for job in jobs}


def _segments(index: Any, users: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """The users' segments as a plan resolves them (everyone in none without a snapshot)."""
    if index is None:
        return np.zeros(users.size, dtype=np.int32), [None]
    codes, names = segment_codes(index, users)
    return codes.astype(np.int32, copy=False), names  # kept: 4 bytes a user


def _kept_after(
    jobs: Sequence[SendJob],
    table: PolicyTable,
    decided: dict[int, JobDecisions | None],
    *,
    full_at: float | None = None,
    logs: ModelLogs | None = None,
    everyone: np.ndarray | None = None,
) -> None:
    """Keep what a plan was made from, for a remake after the next edit (`full_at` and `logs`:
    it was made whole then, from these logs; `everyone`: the jobs' users, when a remake added
    some); none when one of its jobs went through the gate, or one is reserved: the next plan
    is made whole."""
    global _KEPT
    complete = {pk: d for pk, d in decided.items() if d is not None}
    before = _KEPT
    _KEPT = None
    if len(complete) != len(jobs) or any(job.reserve for job in jobs):
        return
    index = get_index()
    if full_at is not None and logs is not None:
        users = ascending_distinct(np.concatenate([d.users for d in complete.values()] or [_NONE]))
        _KEPT = _Kept(
            table=table, index=index, jobs=_jobs_key(jobs), decided=complete, whole_at=full_at,
            logs=logs, buckets=users_buckets(users, ordered=True), everyone=users,
        )  # fmt: skip
    elif before is not None:
        users = before.everyone if everyone is None else everyone
        same = users is before.everyone and index is before.index
        _KEPT = replace(
            before, table=table, index=index, jobs=_jobs_key(jobs), decided=complete,
            everyone=users, segments=before.segments if same else None,
        )  # fmt: skip


def _rule_decides(rule: RuleView, job: SendJob) -> bool:
    """Whether `rule` decides the sends of `job` (as PolicyTable.applicable picks a send's)."""
    return rule.counts(
        channel=job.channel, tags=tuple(job.tags), campaign=job.campaign, asked=job.campaign
    )


def _on_channel(channel: str) -> Callable[[SendJob], bool]:
    return lambda job: channel in (job.channel, ALL)


# A policy edit's reach: the segment of the users it reaches (None: every segment) and which
# jobs' sends it decides.
Reach = tuple[str | None, Callable[[SendJob], bool]]


def _policy_reach(before: PolicyTable, after: PolicyTable) -> list[Reach] | None:
    """Whom the edits from `before` to `after` reach, one Reach per rule, quiet-hours entry,
    classic cap or segment zone changed, added or deleted; None when they may reach anyone (a
    topic, the control group, an experiment, the longest own frequency): the plan is made
    whole. A segment "" (the users in none, in the table's keys) is taken as every segment."""
    if (before.topics, before.holdout, before.experiments, before.own_keeps_ms) != (
        after.topics, after.holdout, after.experiments, after.own_keeps_ms,
    ):  # fmt: skip
        return None
    reach: list[Reach] = []
    for rule in set(before.rules) ^ set(after.rules):
        reach.append((rule.segment, functools.partial(_rule_decides, rule)))
    for quiet in set(before.quiet) ^ set(after.quiet):
        reach.append((quiet.segment, _on_channel(quiet.channel)))
    for segment, channel in before.classic.keys() | after.classic.keys():
        if before.classic.get((segment, channel)) != after.classic.get((segment, channel)):
            reach.append((segment or None, _on_channel(channel)))
    for segment in before.zones.keys() | after.zones.keys():
        if before.zones.get(segment) != after.zones.get(segment):
            reach.append((segment or None, lambda job: True))
    return reach


def _another_snapshot(before: Any, after: Any) -> bool:
    if before is None or after is None:
        return before is not after
    return bool(before.version != after.version)


def _reached(
    kept: _Kept, reach: list[Reach], jobs: Sequence[SendJob], index: Any,
    audiences: dict[int, JobRecipients],
) -> np.ndarray:  # fmt: skip
    """The users of the plan a policy edit (`reach`) or a new snapshot (`index`) reaches
    (sorted, once each)."""
    found = []
    if _another_snapshot(kept.index, index):
        was, was_names = kept.segments_of()
        now, names = _segments(index, kept.everyone)
        # each old segment's place among the new ones (-1: gone)
        moved = np.asarray([names.index(s) if s in names else -1 for s in was_names] or [-1])
        found.append(kept.everyone[moved[was] != now])
        kept.segments = (now, names)
        kept.index = index
    asked: set[tuple[str | None, tuple[int, ...]]] = set()  # a rule changed: before and after
    for segment, decides in reach:
        picked = [job for job in jobs if decides(job)]
        key = (segment, tuple(job.pk for job in picked))
        if key in asked or not picked:
            continue
        asked.add(key)
        users = kept.everyone if segment is None else _segment_users(kept, segment)
        if len(picked) == len(jobs):
            found.append(users)
            continue
        member = _membership(users)
        for job in picked:
            audience = audiences[job.pk].audience
            found.append(audience[member(audience)])
    return _union(found)


def _union(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The values of sorted arrays of distinct values, sorted, once each (no sort for one)."""
    kept = [part for part in parts if part.size]
    if len(kept) == 1:
        return kept[0].astype(np.uint64, copy=False)
    return ascending_distinct(np.concatenate(kept or [_NONE]).astype(np.uint64, copy=False))


def _segment_users(kept: _Kept, segment: str) -> np.ndarray:
    """The users of the plan in `segment` (sorted): those its list holds that resolve to it,
    without resolving everyone's segment; else by everyone's segments."""
    index = kept.index
    bitmaps = getattr(index, "bitmaps", None)
    if kept.segments is None and bitmaps is not None and segment in bitmaps:
        listed = np.asarray(bitmaps[segment].to_array(), dtype=np.uint64)  # sorted, once each
        candidates = kept.everyone[_membership(listed)(kept.everyone)]
        codes, names = _segments(index, candidates)
        return candidates[codes == names.index(segment)] if segment in names else _NONE
    codes, names = kept.segments_of()
    return kept.everyone[codes == names.index(segment)] if segment in names else _NONE


def _spliced(kept: JobDecisions, picked: np.ndarray, new: JobDecisions) -> JobDecisions:
    """A job's kept decisions with those of its recipients at `picked` decided again (in place:
    the kept ones are let go during a remake)."""
    rules = list(kept.rules)
    places = {rule: k for k, rule in enumerate(rules)}
    remap = np.empty(len(new.rules) + 1, dtype=np.int64)
    for k, rule in enumerate(new.rules):
        if rule not in places:
            places[rule] = len(rules)
            rules.append(rule)
        remap[k] = places[rule]
    remap[-1] = -1  # no rule
    kept.rules = rules
    at = np.flatnonzero(picked)  # a few of many: placed by index, not by a mask over all
    kept.reason[at] = new.reason
    kept.rule[at] = remap[new.rule]
    kept.used[at] = new.used
    kept.retry_after[at] = new.retry_after
    kept.reserved_for[at] = new.reserved_for
    kept.room[at] = new.room
    return kept


MEMBERSHIP_IDS = 1 << 25  # users below this: found in a table of one byte an id (32 MB at most)


def _membership(users: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Which of some values are among `users` (sorted, once each): by a table of one byte per id
    when the ids are small, else by a binary search each."""
    top = int(users[-1]) if users.size else 0
    if users.size and top < MEMBERSHIP_IDS:
        table = np.zeros(top + 1, dtype=bool)
        table[users] = True

        def found(values: np.ndarray) -> np.ndarray:
            inside = values <= top
            return inside & table[np.where(inside, values, 0)]

        return found

    def searched(values: np.ndarray) -> np.ndarray:
        if not users.size:
            return np.zeros(values.size, dtype=bool)
        place = np.minimum(np.searchsorted(users, values), users.size - 1)
        return users[place] == values

    return searched


def plan_remade(
    jobs: Sequence[SendJob], *, table: PolicyTable
) -> tuple[list[JobPlan], bytes, int] | None:
    """The plan made again for the users the edits since the one this process made last reach
    (with the number of those users), the other users' decisions kept; None when it must be
    made whole (see above). `table`: the policy now, as policy_read() gives it."""
    global _KEPT
    kept = _KEPT
    if kept is None or time.time() - kept.whole_at >= PLAN_MAX_AGE or any(j.reserve for j in jobs):
        return None
    reach = _policy_reach(kept.table, table)
    if reach is None:
        return None
    now = _jobs_key(jobs)
    edited = [pk for pk, key in now.items() if kept.jobs.get(pk) != key]
    gone = [pk for pk in kept.jobs if pk not in now]
    audiences = job_audiences(jobs)
    touched = [audiences[pk].audience for pk in edited]
    touched += [
        ascending_distinct(kept.decided[pk].users) for pk in (*edited, *gone) if pk in kept.decided
    ]
    index = get_index()
    if not (edited or gone or reach or _another_snapshot(kept.index, index)):
        return None  # an edit it cannot place
    touched.append(_reached(kept, reach, jobs, index, audiences))
    users = _union(touched)
    if users.size > REMAKE_SHARE * max(1, kept.everyone.size):
        return None
    everyone = kept.everyone
    if edited:  # the users of a new job (or one planned since): everyone's now
        new = users[~_membership(everyone)(users)]
        if new.size:
            everyone = np.union1d(everyone, new)
    _KEPT = None  # its decisions are changed in place below: kept again once all are made
    # The logs as the plan made whole read them, but for the users of a new job whose logs
    # were not read then: theirs are read now.
    buckets = users >> np.uint64(BUCKET_BITS)  # each user's
    place = np.minimum(np.searchsorted(kept.buckets, buckets), max(kept.buckets.size - 1, 0))
    known = (kept.buckets[place] == buckets) if kept.buckets.size else np.zeros(users.size, bool)
    logs = kept.logs.fork(within=users)
    if not known.all():
        try:
            fresh = ModelLogs.read(
                get_limiter(), buckets=users_buckets(users[~known], ordered=True)
            )
        except REDIS_DOWN as exc:
            raise Unavailable(f"Redis is not answering; the plan cannot be made: {exc}") from exc
        entries = fresh.entries()
        new_users = np.isin(entries.user, users[~known])
        if new_users.any():
            taken = entries.take(np.flatnonzero(new_users))
            taken.channel = np.asarray(
                [logs.code(fresh.channels[c]) for c in taken.channel.tolist()], dtype=np.int32
            )
            logs.record(taken)
    member = _membership(users)
    gate = _model_gate(logs, table, Holds())
    plans: list[JobPlan] = []
    decided: dict[int, JobDecisions] = {}
    for job in jobs:
        recipients = audiences[job.pk]
        picked = member(recipients.users)
        new = _job_decided(job, recipients.only(picked), gate, logs, table=table)
        if new is None:
            return None
        found = new if job.pk in edited else _spliced(kept.decided[job.pk], picked, new)
        decided[job.pk] = found
        plan = _round_counted(_counted(job, found, plans), recipients)
        plan.audience = recipients.audience
        plans.append(plan)
    _KEPT = kept
    _kept_after(jobs, table, dict(decided), everyone=everyone)
    return plans, holds_encode([]), int(users.size)


def plan_with_holds(
    jobs: Sequence[SendJob],
    *,
    limiter: Limiter | None = None,
    table: PolicyTable | None = None,
    later_counted: bool = False,
    decided: dict[int, JobDecisions | None] | None = None,
    read: list[ModelLogs] | None = None,
) -> tuple[list[JobPlan], bytes]:
    """The plan of `jobs` with the holds of its reserved ones, and those holds (encoded), under
    the policy `table` (default: read now). `later_counted`: every job holds its sends as a
    reserved one does, so that each job counts the sends of the later jobs of higher priority
    that will take its users' slots (what the marketer asks for on the plan's page).

    First as if each reserved job got every recipient it names (so that no earlier send of a
    lower priority takes what it would get), then with what it is predicted to get, until the
    holds the plan is made with are those it makes (HOLDS_ROUNDS at most)."""
    table = policy_read() if table is None else table
    audiences = job_audiences(jobs)
    everyone = {pk: recipients.audience for pk, recipients in audiences.items()}
    holds = holds_decode(plan_holds([], jobs, everyone=everyone, every_job=later_counted))
    plans: list[JobPlan] = []
    blob = holds_encode([])
    logs = plan_logs(jobs, audiences, limiter or get_limiter())  # read once for every round
    if read is not None:
        read.append(logs)  # never changed: each round decides over its own fork
    for _ in range(HOLDS_ROUNDS):
        if decided is not None:
            decided.clear()  # the last round's
        plans = plan_compute(
            jobs,
            limiter=limiter,
            holds=holds,
            audiences=audiences,
            table=table,
            logs=logs,
            decided=decided,
        )
        blob = plan_holds(plans, jobs, every_job=later_counted)
        if blob == holds_encode(holds.by_job()):
            break
        holds = holds_decode(blob)
    return plans, blob


def plan_overlaps(plans: Sequence[JobPlan]) -> list[dict[str, Any]]:
    """Every pair of jobs that reach some users in common: how many, and on which channels.

    Each job's audience as bits over every job's users together (a bit a user: 1.25 MB for
    10M), so that a pair's users in common are the bits set in both, counted in C."""
    if len(plans) < 2:
        return []
    everyone = sorted_distinct(np.concatenate([p.audience for p in plans]))
    words = (everyone.size + 63) // 64
    bits = []
    for plan in plans:
        mask = np.zeros(words * 64, dtype=bool)
        mask[np.searchsorted(everyone, plan.audience)] = True
        bits.append(np.packbits(mask).view(np.uint64))
    out = []
    for i, a in enumerate(plans):
        for j in range(i + 1, len(plans)):
            b = plans[j]
            both = int(np.bitwise_count(bits[i] & bits[j]).sum())
            if both:
                out.append(
                    {
                        "jobs": [a.job_id, b.job_id],
                        "campaigns": [a.campaign, b.campaign],
                        "channels": [a.channel, b.channel],
                        "users": both,
                    }
                )
    return out


WHAT_IF_PLAN_LIMIT = 200_000  # recipients of every scheduled job: a what-if's bound


def plan_later_counted(*, limiter: Limiter | None = None) -> list[dict[str, Any]]:
    """The plan as plan_shape has it, each job counting the sends of the later jobs of higher
    priority that will take its users' slots (as if every job were reserved), made while the
    caller waits; ValueError (in words) for plans too large to make then."""
    jobs = scheduled_jobs()
    total = sum(job.total for job in jobs)
    if total > WHAT_IF_PLAN_LIMIT:
        raise ValueError(
            f"The scheduled jobs have {total:,} recipients; the plan with later jobs of higher "
            f"priority counted is made here up to {WHAT_IF_PLAN_LIMIT:,} (reserve the jobs that "
            "must keep their slots, and the plan made in the background counts them)."
        )
    return plan_shape(plan_with_holds(jobs, limiter=limiter, later_counted=True)[0], jobs)


def plan_what_if(
    job_id: int, start_at: datetime, *, limiter: Limiter | None = None
) -> dict[str, Any]:
    """What the plan would be if scheduled job `job_id` started at `start_at` instead (nothing
    saved, no hold changed): {"before", "after"} as plan_shape has them. ValueError (in words)
    for a job that is not scheduled, or plans too large to try while a page waits."""
    jobs = scheduled_jobs()
    moved = next((job for job in jobs if job.pk == job_id), None)
    if moved is None:
        raise ValueError(f"Send job {job_id} is not scheduled.")
    total = sum(job.total for job in jobs)
    if total > WHAT_IF_PLAN_LIMIT:
        raise ValueError(
            f"The scheduled jobs have {total:,} recipients; a what-if is tried here up to "
            f"{WHAT_IF_PLAN_LIMIT:,} (move the job, and the plan is made again in the "
            "background)."
        )
    before = plan_with_holds(jobs, limiter=limiter)[0]
    moved.start_at = start_at
    after_jobs = sorted(jobs, key=start_order)
    after = plan_with_holds(after_jobs, limiter=limiter)[0]
    return {"before": plan_shape(before, jobs), "after": plan_shape(after, after_jobs)}


def plan_holds(
    plans: Sequence[JobPlan],
    jobs: Sequence[SendJob],
    *,
    everyone: dict[int, np.ndarray] | None = None,
    every_job: bool = False,
) -> bytes:
    """The holds of the reserved jobs among `jobs` (`every_job`: of them all): each one's
    predicted recorded sends (in `plans`), or every user it names (`everyone`: the jobs'
    audiences)."""
    held_users = everyone if everyone is not None else {p.job_id: p.admitted for p in plans}
    held = []
    for job in jobs:
        users = held_users.get(job.pk)
        if not (job.reserve or every_job) or job.start_at is None or users is None:
            continue
        held.append(
            (
                HeldJob(
                    id=job.pk,
                    priority=job.priority,
                    start_ms=round(job.start_at.timestamp() * 1000),
                    channel=job.channel,
                    campaign=job.campaign,
                    tags=tuple(job.tags),
                ),
                users,
            )
        )
    return holds_encode(held)


def plan_latest(*, limiter: Limiter | None = None) -> dict[str, Any] | None:
    """The latest plan made (plan_refresh), or None."""
    live = limiter or get_limiter()
    raw = live.client.get(f"{live.prefix}{PLAN_KEY}")
    return None if raw is None else json.loads(raw)


def plan_computing(*, limiter: Limiter | None = None) -> bool:
    live = limiter or get_limiter()
    return bool(live.client.exists(f"{live.prefix}{PLAN_LOCK}"))
