"""Reservations: a reserved scheduled job's predicted sends hold their slots until it starts. An
earlier send of a lower priority that would take one is refused as `reserved`, naming the job;
a send of its priority or higher is not; the hold ends when the job starts or is cancelled."""

import itertools
import random
from datetime import timedelta

import pytest
from django.test import TestCase
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from limits.engine import log
from limits.engine.limiter import get_limiter
from limits.engine.reservations import holds_cache, holds_decode, holds_encode
from limits.policy.selectors import policy_cache
from tests.support.sends import make_rule, recipients
from worker.chunks import send_chunk_run
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.plan import plan_latest, plan_refresh
from worker.scheduling import jobs_start_due
from worker.services import send_job_cancel, send_job_create, send_job_edit

pytestmark = pytest.mark.django_db


@pytest.fixture
def promo_a_day(published, settings):
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    published(vip=(10, [1, 2], {}))
    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()


def scheduled(users, *, hours: float, priority: int, reserve: bool = False, channel="email"):
    rows = recipients(*users)
    if channel == "push":
        rows = [{"user_id": u, "address": f"token-{u}"} for u in users]
    return send_job_create(
        channel=channel,
        campaign=f"c-{channel}-{priority}-{hours}",
        template="welcome",
        tags=["promo"],
        priority=priority,
        recipients=rows,
        start_at=timezone.now() + timedelta(hours=hours),
        reserve=reserve,
        queue=False,
    )


def run(job: SendJob) -> SendJob:
    assert job.start_at is not None
    jobs_start_due(now=job.start_at)
    for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
        send_chunk_run(chunk_id=chunk.pk, now=job.start_at)
    job.refresh_from_db()
    return job


def ask(users, *, priority: int, at=None):
    return gate_check(
        channel="email",
        requests=[(u, f"ad-hoc:{u}") for u in users],
        campaign="ad-hoc",
        tags=("promo",),
        priority=priority,
        dry_run=True,
        now=at or timezone.now(),
    )


def test_an_earlier_lower_priority_send_is_refused_as_reserved_naming_the_job(promo_a_day):
    launch = scheduled([1, 2], hours=20, priority=9, reserve=True, channel="push")
    promo = scheduled([1, 2, 3], hours=2, priority=5)
    assert plan_refresh(force=True)
    holds_cache().clear()
    latest = plan_latest()
    assert latest is not None
    plan = {j["job"]: j for j in latest["jobs"]}
    assert (plan[promo.pk]["sent"], plan[promo.pk]["refused"]) == (1, {"reserved": 2})
    assert (plan[launch.pk]["sent"], plan[launch.pk]["reserve"]) == (2, True)

    low = ask([1, 3], priority=5)
    assert [d.reason for d in low] == ["reserved", "allowed"]
    held = low[0]
    assert (held.reserved_for, held.reserved, held.rule["name"]) == (launch.pk, 1, "1 promo a day")
    until = launch.start_at.timestamp() - timezone.now().timestamp()
    assert held.retry_after == pytest.approx(until, abs=2)
    assert [d.reason for d in ask([1], priority=9)] == ["allowed"]  # as important: not held

    promo = run(promo)
    assert (promo.sent, promo.reasons) == (1, {"allowed": 1, "reserved": 2})
    launch = run(launch)
    assert launch.sent == 2
    # Started: its hold is gone, and the rule alone decides.
    assert [d.reason for d in ask([1, 3], priority=5, at=launch.start_at)] == ["daily_cap"] * 2


def test_a_cancelled_or_changed_reserved_job_holds_nothing_from_then_on(
    promo_a_day, django_capture_on_commit_callbacks
):
    launch = scheduled([1, 2], hours=20, priority=9, reserve=True)
    other = scheduled([3], hours=22, priority=8, reserve=True)
    plan_refresh(force=True)
    holds_cache().clear()
    assert [d.reason for d in ask([1, 2, 3], priority=5)] == ["reserved"] * 3
    with django_capture_on_commit_callbacks(execute=True):
        send_job_cancel(job=launch)
    holds_cache().clear()
    assert [d.reason for d in ask([1, 2, 3], priority=5)] == ["allowed", "allowed", "reserved"]
    with django_capture_on_commit_callbacks(execute=True):
        send_job_edit(job=other, changes={"reserve": False})
    holds_cache().clear()
    assert [d.reason for d in ask([1, 2, 3], priority=5)] == ["allowed"] * 3
    plan_refresh(force=True)  # made again: no reserved job is left
    holds_cache().clear()
    assert [d.reason for d in ask([1, 2, 3], priority=5)] == ["allowed"] * 3


def test_reserve_needs_a_start(promo_a_day):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="Only a scheduled job holds slots"):
        send_job_create(
            channel="email",
            campaign="now",
            template="welcome",
            recipients=recipients(1),
            reserve=True,
            queue=False,
        )


def test_holds_take_4_bytes_a_reserved_send_and_read_back_the_same():
    from limits.engine.reservations import HeldJob

    rng = random.Random(1)
    for top, width in ((10**9, 4), (2**63, 8)):  # ids of a 32-bit snapshot, and wider ones
        jobs = [
            (
                HeldJob(n, 9, 1_800_000_000_000 + n, "email", f"c{n}", ("promo", "news")),
                np_sorted(rng.sample(range(1, top), 1000)),
            )
            for n in range(3)
        ]
        blob = holds_encode(jobs)
        header = len(holds_encode([(job, np_sorted([])) for job, _ in jobs]))
        assert len(blob) - header == width * 3000
        back = holds_decode(blob)
        assert [(j, list(u)) for j, u in back.by_job()] == [(j, list(u)) for j, u in jobs]


def promo_times(limiter, user: int) -> list[int]:
    """When the user's logged sends carrying `promo` were recorded (ms), in order."""
    raw = limiter.client.hget(log.bucket_key(limiter.prefix, user), log.bucket_field(user))
    promo = log.short_hash("promo")
    return sorted(e.at_ms for e in log.decode(raw) if promo in e.tags)


def np_sorted(values):
    import numpy as np

    return np.sort(np.asarray(values, dtype=np.uint64))


USERS = tuple(range(1, 7))


class Reservations(RuleBasedStateMachine):
    """Reserved and plain jobs scheduled, the plan made, ad-hoc sends of any priority, time
    passing (each job run at its start), cancels, in any order. After every step no user holds
    more promos in a day than the rule allows (never over-admitted), and a send is refused as
    `reserved` only for a reserved job of a higher priority that has not started and was not
    cancelled (no slot stranded after its job)."""

    seen = 0  # sends refused as reserved, over every example: the holds were exercised

    def __init__(self) -> None:
        super().__init__()
        SendJob.objects.all().delete()
        get_limiter().client.flushdb()
        holds_cache().clear()
        self.clock = timezone.now() + timedelta(days=2)
        self.sent = 0

    def live_reserved(self) -> dict[int, SendJob]:
        return {
            job.pk: job
            for job in SendJob.objects.filter(status="scheduled", reserve=True)
            if job.start_at is not None and job.start_at > self.clock
        }

    @rule(
        users=st.sets(st.sampled_from(USERS), min_size=1, max_size=6),
        hours=st.integers(1, 20),
        priority=st.integers(0, 9),
        reserve=st.booleans(),
        channel=st.sampled_from(["email", "push"]),
    )
    def schedule(self, users, hours, priority, reserve, channel):
        job = scheduled(
            sorted(users), hours=24, priority=priority, reserve=reserve, channel=channel
        )
        start = self.clock + timedelta(hours=hours, minutes=len(users))
        SendJob.objects.filter(pk=job.pk).update(
            start_at=start, expires_at=start + timedelta(days=1)
        )
        self.plan()  # as beat does within seconds

    @rule()
    def plan(self):
        plan_refresh(force=True)
        holds_cache().clear()

    @rule(users=st.sets(st.sampled_from(USERS), min_size=1), priority=st.integers(0, 9))
    def ad_hoc(self, users, priority):
        self.sent += 1
        decisions = gate_check(
            channel="email",
            requests=[(u, f"ad-hoc-{self.sent}:{u}") for u in sorted(users)],
            campaign="ad-hoc",
            tags=("promo",),
            priority=priority,
            now=self.clock,
        )
        live = self.live_reserved()
        for d in decisions:
            if d.reason == "reserved":
                Reservations.seen += 1
                assert d.reserved_for in live, (d, sorted(live))
                assert live[d.reserved_for].priority > priority

    @precondition(lambda self: bool(self.live_reserved()))
    @rule(data=st.data())
    def ad_hoc_to_a_reserved_jobs_users(self, data):
        """A send to users a reserved job will reach, below its priority (the case it is for)."""
        job = data.draw(st.sampled_from(sorted(self.live_reserved().values(), key=lambda j: j.pk)))
        users = {r["user_id"] for chunk in job.chunks.all() for r in chunk.recipients}
        self.ad_hoc(users, data.draw(st.integers(0, max(0, job.priority - 1))))

    @rule(minutes=st.integers(1, 3000))
    def time_passes(self, minutes):
        until = self.clock + timedelta(minutes=minutes)
        due = SendJob.objects.filter(status="scheduled", start_at__lte=until)
        for job in due.order_by("start_at", "-priority", "pk"):
            assert job.start_at is not None
            self.clock = max(self.clock, job.start_at)
            run(job)
        self.clock = until
        holds_cache().clear()  # as the processes' copies lapse

    @rule(data=st.data())
    def cancel(self, data):
        waiting = list(SendJob.objects.filter(status="scheduled").order_by("pk"))
        if waiting:
            job = data.draw(st.sampled_from(waiting))
            with TestCase.captureOnCommitCallbacks(execute=True):
                send_job_cancel(job=job)
            holds_cache().clear()

    @invariant()
    def never_over_admitted(self):
        limiter = get_limiter()
        for user in USERS:
            times = promo_times(limiter, user)
            assert all(b - a >= 86_400_000 for a, b in itertools.pairwise(times)), (user, times)


def test_holds_never_over_admit_nor_strand_a_slot_after_their_job(promo_a_day):
    run_state_machine_as_test(
        Reservations,
        settings=settings(
            # All 40 under every profile: 7 of them reach a refusal as `reserved`, the tenth
            # `make check` would run none.
            max_examples=40,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            # The same examples every run: whether any of 40 random ones reaches a refusal as
            # `reserved` (the assert below) must not be left to chance (a CI run met none).
            derandomize=True,
        ),
    )
    assert Reservations.seen > 0
