"""Rounds: competing send jobs decided by value per user, not by who asks first.

Jobs join a round until it closes and wait as scheduled jobs (their start is the round's
`send_at`). When it closes, each user gets, among the round's candidate sends for them, the set
of highest total value that fits every rule given their log at `send_at`; the rest are refused
as `outranked`, naming the job that won the slot and what its send was worth to them. The chosen
sends go through the gate as usual when the jobs start: the gate keeps the final word, and a
chosen send it refuses is counted as a difference on the round.

How a user's best set is found, by the decision model (limits/engine/model.py) over the logs
as they are (the plan's: worker/plan.py):

1. **Alone.** Each job is decided over its recipients on its own, as the gate would decide it
   at `send_at` with nothing else sent: a send refused alone (suppressed, a preference, the
   control group, quiet hours, a rule with no room) is no candidate. It goes through the gate
   as usual and gets the gate's reason; the round does not outrank it.
2. **Sets that fit.** A set of sends fits a user when the gate admits every one of them in
   whatever order they reach it. That order matters only through a rule's reserve (a lower
   priority may use less of the limit), and the worst order for every rule at once is the
   highest priority first: so a set fits when the model, deciding its jobs highest priority
   first, admits them all. Fitting is closed under taking sends away, so sets are tried by
   size, a set only for the users every one of its smaller sets fitted (a cap of one a day stops
   the search at sets of one).
3. **The best set.** The fitting set of highest total value (values compared to a millionth);
   ties go to the set holding the better-ranked job where they differ (higher priority, then
   the job made first), so a set with a send of value 0 more beats the set without it.
4. **Outranked by.** A candidate not chosen is outranked by the chosen job worth most to that
   user (ties: the better ranked).

What it is compared with: first come, first served over the same candidates, the jobs decided
one after the other in the order they start (worker.plan.start_order), each admitted send
recorded before the next job is decided.

Deciding is one run under the round's lease: it reads, chooses, and writes each job's
`RoundEntry` and the round's report in one transaction. A run that dies before that commit
leaves nothing (the next takes the lease once it runs out and chooses from the logs as they are
then); after it, the round is decided and nothing chooses again. The outranked sends are
recorded when the job runs (worker/chunks.py): in the ledger with `outranked_by`, and in the
job's counts as refused.
"""

import functools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gatekeeper.lib.leases import RowLease, lease_free
from limits.engine.limiter import Limiter, get_limiter
from limits.engine.model import ModelLogs, ascending_distinct
from limits.engine.reservations import Holds, holds_cache
from limits.engine.table import PolicyTable
from limits.policy.quota import Unavailable
from limits.policy.selectors import policy_read
from limits.reasons import Reason
from worker.gate import SegmentResolver
from worker.modelled import CODES
from worker.models import ROUND_JOBS_MAX, Round, RoundEntry, SendJob
from worker.plan import (
    JobRecipients,
    _job_decided,
    _model_gate,
    job_audiences,
    plan_logs,
    start_order,
)
from worker.round_entries import MICROS, Decided, micros, units

logger = logging.getLogger(__name__)

LEASE = timedelta(minutes=10)  # a deciding run holds its round this long (renewed as it runs)
_ALLOWED = CODES[Reason.ALLOWED]
_U64 = np.uint64


def rank_order(job: SendJob) -> tuple[Any, ...]:
    """How a round ranks its jobs on a tie of value: the higher priority, then the job made
    first."""
    return (-job.priority, job.created_at, job.pk)


@dataclass
class Entrant:
    """One job of a round as the choice takes it: its recipients (each user once: a user the
    job lists twice is its candidate by the first row) and each one's value in millionths."""

    job: SendJob
    recipients: JobRecipients
    values: np.ndarray  # int64, aligned with recipients.users

    @functools.cached_property
    def _by_user(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.recipients.users, kind="stable")
        return order, self.recipients.users[order]

    def only(self, users: np.ndarray) -> JobRecipients:
        """Its recipients among `users` (each one of its recipients), in its own order."""
        order, ascending = self._by_user
        picked = np.zeros(self.recipients.users.size, dtype=bool)
        picked[order[np.searchsorted(ascending, users)]] = True
        return self.recipients.only(picked)


@dataclass
class JobChoice:
    """What the choice made of one job: per recipient (its entrant's order) whether it fitted
    alone, was chosen, or was outranked, and by which job (0: none) worth how much (millionths).
    The same job's first come, first served admissions beside them."""

    job_id: int
    eligible: np.ndarray
    chosen: np.ndarray
    outranked: np.ndarray
    by: np.ndarray
    by_value: np.ndarray
    first_come: np.ndarray

    def decided(self, entrant: "Entrant") -> Decided:
        """As the job's RoundEntry keeps it."""
        users = entrant.recipients.users
        lost = self.outranked
        return Decided.of(users[self.chosen], users[lost], self.by[lost], self.by_value[lost])

    @property
    def outranked_by(self) -> Counter[int]:
        jobs, counts = np.unique(self.by[self.outranked], return_counts=True)
        return Counter(dict(zip(jobs.tolist(), counts.tolist(), strict=True)))


@dataclass
class Choice:
    jobs: list[JobChoice]
    users: int  # users with a candidate that fits alone
    contested: int  # of them, with two or more
    sets_tried: int = 0
    steps: dict[str, float] = field(default_factory=dict)


def round_choice(
    entrants: Sequence[Entrant],
    *,
    logs: ModelLogs,
    table: PolicyTable,
    holds: Holds,
    index: SegmentResolver | None = None,
) -> Choice:
    """The round's choice over `entrants` (ranked: rank_order) from `logs` (never changed: each
    question is asked of a fork), under `table`, with the reservations' `holds`. Every job's
    `start_at` is the round's send time."""
    if len(entrants) > ROUND_JOBS_MAX:
        raise ValueError(f"A round decides at most {ROUND_JOBS_MAX} jobs; it has {len(entrants)}.")
    took: dict[str, float] = {}
    clock = time.monotonic()

    def lap(step: str) -> None:
        nonlocal clock
        took[step] = took.get(step, 0.0) + time.monotonic() - clock
        clock = time.monotonic()

    gate = _model_gate(logs, table, holds, index=index)

    def decided(entrant: Entrant, recipients: JobRecipients, on: ModelLogs) -> np.ndarray:
        found = _job_decided(entrant.job, recipients, gate, on, table=table)
        if found is None:  # transactional: never gated by value
            return np.zeros(recipients.users.size, dtype=bool)
        return found.reason == _ALLOWED

    # First come, first served beside it: the jobs one after the other as they start. The first
    # to start meets the logs as they are, so its decisions are also its decisions alone.
    first_come = _first_come(entrants, decided, logs)
    lap("first come")
    starts_first = min(range(len(entrants)), key=lambda j: start_order(entrants[j].job), default=-1)
    # 1. Each job alone.
    alone = [
        first_come[j] if j == starts_first else decided(e, e.recipients, logs.fork())
        for j, e in enumerate(entrants)
    ]
    lap("alone")
    # The users with a candidate that fits alone, and which jobs' (a bit per job, by rank).
    everyone = ascending_distinct(
        np.concatenate([e.recipients.users[ok] for e, ok in zip(entrants, alone, strict=True)])
        if entrants
        else np.empty(0, dtype=_U64)
    )
    n, k = everyone.size, len(entrants)
    masks = np.zeros(n, dtype=np.int64)
    values = np.zeros((n, k), dtype=np.int64)
    places = []
    for j, (e, ok) in enumerate(zip(entrants, alone, strict=True)):
        at = np.searchsorted(everyone, e.recipients.users[ok])
        masks[at] |= 1 << j
        values[at, j] = e.values[ok]
        places.append(at)
    counts = np.bitwise_count(masks)
    contested = np.flatnonzero(counts >= 2)
    best = masks.copy()  # one candidate or none: it is the choice
    tried = 0
    if contested.size:
        best[contested], tried = _best_sets(
            entrants, everyone, contested, masks, values, decided, logs
        )
    lap("sets")
    # 4. Who outranked whom: the chosen job worth most to the user (ties: the better ranked).
    chosen_value = np.where(_bits(best, k), values, -1)
    winner = np.argmax(chosen_value, axis=1) if k else np.zeros(n, dtype=np.int64)
    jobs: list[JobChoice] = []
    for j, (e, ok, at) in enumerate(zip(entrants, alone, places, strict=True)):
        size = e.recipients.users.size
        chosen = np.zeros(size, dtype=bool)
        outranked = np.zeros(size, dtype=bool)
        by = np.zeros(size, dtype=np.int64)
        by_value = np.zeros(size, dtype=np.int64)
        rows = np.flatnonzero(ok)
        won = (best[at] >> j) & 1 == 1
        chosen[rows[won]] = True
        lost = rows[~won]
        outranked[lost] = True
        lost_at = at[~won]
        by[lost] = [entrants[w].job.pk for w in winner[lost_at].tolist()]
        by_value[lost] = values[lost_at, winner[lost_at]]
        jobs.append(
            JobChoice(
                job_id=e.job.pk,
                eligible=ok,
                chosen=chosen,
                outranked=outranked,
                by=by,
                by_value=by_value,
                first_come=first_come[j],
            )
        )
    lap("outranked by")
    return Choice(jobs=jobs, users=n, contested=int(contested.size), sets_tried=tried, steps=took)


def _best_sets(
    entrants: Sequence[Entrant],
    everyone: np.ndarray,
    contested: np.ndarray,
    masks: np.ndarray,
    values: np.ndarray,
    decided: Any,
    logs: ModelLogs,
) -> tuple[np.ndarray, int]:
    """2 and 3: for each contested user (`contested`: places in `everyone`), the best fitting
    set as a bit mask; and how many sets were put to the model."""
    k = len(entrants)
    weight = [1 << (k - 1 - j) for j in range(k)]  # a set's tie key: the better ranked first
    users = everyone[contested]
    their = masks[contested]
    worth = values[contested]
    best_value = np.zeros(users.size, dtype=np.int64)  # the empty set
    best_key = np.zeros(users.size, dtype=np.int64)
    best = np.zeros(users.size, dtype=np.int64)

    def consider(mask: int, places: np.ndarray) -> None:
        members = [j for j in range(k) if mask >> j & 1]
        total = worth[places][:, np.asarray(members)].sum(axis=1)
        key = sum(weight[j] for j in members)
        better = (total > best_value[places]) | (
            (total == best_value[places]) & (key > best_key[places])
        )
        won = places[better]
        best_value[won], best_key[won], best[won] = total[better], key, mask

    # Sets of one: every candidate fits alone.
    fitted: dict[int, np.ndarray] = {}
    for j in range(k):
        places = np.flatnonzero(their >> j & 1)
        if places.size:
            fitted[1 << j] = places
            consider(1 << j, places)
    tried = 0
    by_priority = sorted(range(k), key=lambda j: -entrants[j].job.priority)
    size = 1
    while fitted:
        size += 1
        grown: dict[int, np.ndarray] = {}
        for mask, places in fitted.items():
            top = mask.bit_length()  # add only jobs ranked after the set's last: each set once
            for j in range(top, k):
                bigger = mask | 1 << j
                if bigger in grown:
                    continue
                these = places[their[places] >> j & 1 == 1]
                for b in range(top):  # every smaller set must have fitted these users
                    if these.size and mask >> b & 1:
                        smaller = fitted.get(bigger & ~(1 << b))
                        these = (
                            these[np.isin(these, smaller, assume_unique=True)]
                            if smaller is not None
                            else these[:0]
                        )
                if not these.size:
                    continue
                tried += 1
                ok = _fits(
                    entrants,
                    [j2 for j2 in by_priority if bigger >> j2 & 1],
                    users[these],
                    decided,
                    logs,
                )
                if ok.any():
                    grown[bigger] = these[ok]
                    consider(bigger, these[ok])
        fitted = grown
    return best, tried


def _fits(
    entrants: Sequence[Entrant],
    order: list[int],
    users: np.ndarray,
    decided: Any,
    logs: ModelLogs,
) -> np.ndarray:
    """Whether each of `users` (ascending) is admitted every send of the jobs `order` (their
    places, the highest priority first), decided one after the other on a fork of the logs."""
    fork = logs.fork(within=users)
    ok = np.ones(users.size, dtype=bool)
    for j in order:
        part = entrants[j].only(users)
        admitted = decided(entrants[j], part, fork)
        missing = np.ones(users.size, dtype=bool)
        missing[np.searchsorted(users, part.users[admitted])] = False
        ok &= ~missing
    return ok


def _first_come(entrants: Sequence[Entrant], decided: Any, logs: ModelLogs) -> list[np.ndarray]:
    """First come, first served over the same candidates: per job (in `entrants`' order), which
    recipients the gate would admit were the jobs run one after the other as they start."""
    fork = logs.fork()
    out: dict[int, np.ndarray] = {}
    for j in sorted(range(len(entrants)), key=lambda j: start_order(entrants[j].job)):
        out[j] = decided(entrants[j], entrants[j].recipients, fork)
    return [out[j] for j in range(len(entrants))]


def _bits(masks: np.ndarray, k: int) -> np.ndarray:
    """Each mask's bits as a boolean row of `k`."""
    return (masks[:, None] >> np.arange(k, dtype=np.int64)) & 1 == 1


# --- reading a round's jobs ------------------------------------------------------------------


def round_jobs(round_: Round) -> list[SendJob]:
    """The round's jobs the choice decides (scheduled, not cancelled), ranked."""
    jobs = SendJob.objects.filter(
        round=round_, status=SendJob.Status.SCHEDULED, cancelled_at__isnull=True
    )
    return sorted(jobs, key=rank_order)


def entrants_read(round_: Round, jobs: Sequence[SendJob]) -> list[Entrant]:
    """The jobs' recipients as the choice takes them (each user once, by the first row), their
    start the round's send time, and each recipient's value (its row's, else the job's)."""
    audiences = job_audiences(jobs)
    out = []
    for job in jobs:
        job.start_at = round_.send_at
        recipients = audiences[job.pk]
        if recipients.audience.size != recipients.users.size:  # a user listed twice
            _, first = np.unique(recipients.users, return_index=True)
            picked = np.zeros(recipients.users.size, dtype=bool)
            picked[first] = True
            recipients = recipients.only(picked)
        values = np.full(recipients.users.size, micros(job.value or 0.0), dtype=np.int64)
        if recipients.values is not None:  # its rows' own, where they carry one
            own = ~np.isnan(recipients.values)
            values[own] = np.round(recipients.values[own] * MICROS).astype(np.int64)
        out.append(Entrant(job=job, recipients=recipients, values=values))
    return out


# --- deciding a round that closed ------------------------------------------------------------


def rounds_close_due(*, now: datetime | None = None, limiter: Limiter | None = None) -> list[int]:
    """Decide every round whose closing time has come (and one a dead run left deciding, once
    its lease ran out); returns the rounds decided."""
    now = now or timezone.now()
    due = Round.objects.filter(
        Q(status=Round.Status.OPEN, closes_at__lte=now) | Q(status=Round.Status.DECIDING)
    ).filter(lease_free(now))
    return [
        pk for pk in due.values_list("pk", flat=True) if round_decide(pk, now=now, limiter=limiter)
    ]


def round_decide(
    round_id: int,
    *,
    now: datetime | None = None,
    limiter: Limiter | None = None,
    index: SegmentResolver | None = None,
) -> bool:
    """Decide a round whose closing time has come, under its lease; False when another run
    holds it, it is not due, or it was decided or cancelled meanwhile. Raises Unavailable
    (worker.plan) when Redis or the snapshot cannot answer: the round stays to decide, and the
    next run tries again once the lease runs out."""
    now = now or timezone.now()
    lease = RowLease(Round.objects.filter(pk=round_id), LEASE)
    due = Q(status__in=[Round.Status.OPEN, Round.Status.DECIDING], closes_at__lte=now)
    if not lease.take(now, where=due, status=Round.Status.DECIDING):
        return False
    round_ = Round.objects.get(pk=round_id)
    started = timezone.now()
    try:
        choice, entrants = round_projected(round_, limiter=limiter, index=index)
    except Unavailable:
        lease.give_back()  # tried again by the next run, not once the lease runs out
        raise
    report = round_report(round_, entrants, choice)
    report["decided_at"] = timezone.now().isoformat()
    report["seconds"] = round((timezone.now() - started).total_seconds(), 3)
    # In order ([step, seconds] pairs: PostgreSQL's jsonb keeps no key order).
    report["steps"] = [[step, round(seconds, 3)] for step, seconds in choice.steps.items()]
    with transaction.atomic():
        locked = Round.objects.select_for_update().get(pk=round_id)
        if locked.status != Round.Status.DECIDING or locked.lease_until != lease.until:
            return False  # the lease ran out and another run took it
        RoundEntry.objects.bulk_create(
            RoundEntry(
                round=locked,
                job=e.job,
                chosen=packed[0],
                outranked=packed[1],
            )
            for e, c in zip(entrants, choice.jobs, strict=True)
            for packed in [c.decided(e).packed()]
        )
        # A job whose file was still being read when the round closed is not in it: it waits
        # for its start as any scheduled job.
        SendJob.objects.filter(round=locked).exclude(pk__in=[e.job.pk for e in entrants]).filter(
            cancelled_at__isnull=True, status=SendJob.Status.PREPARING
        ).update(round=None)
        # Its jobs changed for the plan (worker/plan.py), which leaves the outranked out.
        SendJob.objects.filter(pk__in=[e.job.pk for e in entrants]).update(
            updated_at=timezone.now()
        )
        locked.status = Round.Status.DECIDED
        locked.decided_at = timezone.now()
        locked.lease_until = None
        locked.report = report
        locked.save(update_fields=["status", "decided_at", "lease_until", "report", "updated_at"])
    logger.info(
        "Round %s decided in %.1f s: %d users, %d contested, value %.2f against %.2f first come",
        round_id,
        report["seconds"],
        choice.users,
        choice.contested,
        report["value_won"],
        report["first_come_value"],
    )
    return True


def round_projected(
    round_: Round,
    *,
    limiter: Limiter | None = None,
    index: SegmentResolver | None = None,
    values: dict[int, float] | None = None,
) -> tuple[Choice, list[Entrant]]:
    """What the round would choose now (its jobs as they are, the logs as they are; `values`:
    a job's value replaced, job id -> value, as if it were changed)."""
    live = limiter or get_limiter()
    began = time.monotonic()
    jobs = round_jobs(round_)
    for job in jobs:
        if values and job.pk in values:
            job.value = values[job.pk]
    entrants = entrants_read(round_, jobs)
    read = time.monotonic()
    if values:
        for e in entrants:
            if e.job.pk in values:
                e.values = np.full(e.values.size, micros(values[e.job.pk]), dtype=np.int64)
    audiences = {e.job.pk: e.recipients for e in entrants}
    logs = plan_logs(jobs, audiences, live) if jobs else ModelLogs()
    table = policy_read()
    holds = holds_cache().get(live.client, live.prefix)
    logged = time.monotonic()
    choice = round_choice(entrants, logs=logs, table=table, holds=holds, index=index)
    choice.steps = {"recipients": read - began, "logs": logged - read, **choice.steps}
    return choice, entrants


def round_report(round_: Round, entrants: Sequence[Entrant], choice: Choice) -> dict[str, Any]:
    """The round's report: per job, its candidates, those that fitted alone, won and outranked
    (by which jobs), the value won, and what first come, first served would have won; the
    round's totals beside."""
    rows: list[dict[str, Any]] = []
    won = first = 0  # millionths
    for e, c in zip(entrants, choice.jobs, strict=True):
        won += int(e.values[c.chosen].sum())
        first += int(e.values[c.first_come].sum())
        rows.append(
            {
                "job": e.job.pk,
                "campaign": e.job.campaign,
                "channel": e.job.channel,
                "priority": e.job.priority,
                "value": e.job.value,
                "candidates": int(e.recipients.users.size),
                "fit_alone": int(c.eligible.sum()),
                "won": int(c.chosen.sum()),
                "outranked": int(c.outranked.sum()),
                "outranked_by": [
                    {"job": job, "count": n} for job, n in sorted(c.outranked_by.items())
                ],
                "value_won": units(int(e.values[c.chosen].sum())),
                "first_come": {
                    "won": int(c.first_come.sum()),
                    "value": units(int(e.values[c.first_come].sum())),
                },
            }
        )
    return {
        "send_at": round_.send_at.isoformat(),
        "users": choice.users,
        "contested": choice.contested,
        "value_won": units(won),
        "first_come_value": units(first),
        "gain": units(won - first),
        "jobs": rows,
    }


def round_project(round_id: int, *, values: dict[int, float] | None = None) -> dict[str, Any]:
    """What an open round would choose if it closed now, with `values` (job id -> a job-wide
    value) tried instead of those jobs' own: its report, kept on the round as its projection
    ({at, values, report}) for the admin and the API. Nothing else is written."""
    round_ = Round.objects.get(pk=round_id)
    tried = {int(job): float(value) for job, value in (values or {}).items()}
    choice, entrants = round_projected(round_, values=tried)
    projection = {
        "at": timezone.now().isoformat(),
        "values": {str(job): value for job, value in tried.items()},
        "report": round_report(round_, entrants, choice),
    }
    Round.objects.filter(pk=round_id).update(projection=projection)
    return projection
