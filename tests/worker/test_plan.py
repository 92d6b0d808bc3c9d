"""The forward plan predicts, per recipient, what the gate decides when each scheduled job
starts: checked against the gate's own later decisions over random rules, quiet hours, jobs,
earlier sends and clocks around DST changes, when nothing else happens in between."""

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from limits import log
from limits.limiter import get_limiter
from limits.quiet import QuietFields
from limits.selectors import policy_cache
from limits.services import QUIET_HOURS
from segments.models import Segment
from tests.support.sends import make_rule, recipients
from worker.chunks import send_chunk_run
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.plan import plan_compute, scheduled_jobs
from worker.scheduling import jobs_start_due
from worker.services import send_job_create

pytestmark = pytest.mark.django_db

ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]
# Around a DST change of each zone above (and a plain week).
CHANGES = [
    datetime(2027, 3, 13, 12, tzinfo=UTC),  # New York springs forward on the 14th
    datetime(2027, 10, 30, 12, tzinfo=UTC),  # London falls back on the 31st
    datetime(2027, 4, 3, 6, tzinfo=UTC),  # Lord Howe's half hour back on the 4th
    datetime(2027, 6, 9, 0, tzinfo=UTC),
]
USERS = list(range(1, 41))


@pytest.fixture
def world(published, settings):
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 16
    published(vip=(10, USERS[:20], {}))


def random_rule(rng: random.Random, n: int) -> None:
    calendar = rng.random() < 0.4
    match = rng.choice(["any", "any", "tag", "campaign"])
    make_rule(
        f"rule {n}",
        segment=rng.choice([None, "vip"]),
        channel=rng.choice(["email", "push", "all"]),
        match=match,
        tag="promo" if match == "tag" else "",
        window_kind="calendar" if calendar else "rolling",
        window_seconds=None if calendar else rng.choice([3600, 4 * 3600, 86_400, 7 * 86_400]),
        window_unit=rng.choice(["day", "week", "month"]) if calendar else "",
        limit=rng.choice([0, 1, 1, 1, 2, 2, 3, 3, 3, 3]) if n else rng.choice([1, 2]),
    )


def random_job(rng: random.Random, n: int, start: datetime) -> SendJob:
    users = rng.sample(USERS, rng.randint(10, 40))
    rows = recipients(*users)
    for row in rows:
        if rng.random() < 0.3:
            row["time_zone"] = rng.choice(ZONES)
    channel = rng.choice(["email", "push"])
    if channel == "push":
        for row in rows:
            row["address"] = f"token-{row['user_id']}"
    job = send_job_create(
        channel=channel,
        campaign=rng.choice(["spring", "launch", f"c{n}"]),
        template="welcome",
        tags=rng.choice([[], ["promo"], ["news"], ["promo", "news"]]),
        priority=rng.randint(0, 9),
        recipients=rows,
        start_at=timezone.now() + timedelta(days=1),
        queue=False,
    )
    # The clock of the case (around a DST change, months ahead), set past the API's bounds.
    SendJob.objects.filter(pk=job.pk).update(start_at=start, expires_at=start + timedelta(days=1))
    job.refresh_from_db()
    return job


def in_logs(job: SendJob) -> set[int]:
    """The job's recipients whose logs hold its message id on its channel."""
    limiter = get_limiter()
    users = set()
    for chunk in SendChunk.objects.filter(job=job):
        for row in chunk.recipients:
            raw = limiter.client.hget(
                log.bucket_key(limiter.prefix, row["user_id"]), log.bucket_field(row["user_id"])
            )
            held = {e.message for e in log.decode(raw) if e.channel == job.channel}
            if log.stored_message_hash(row["message_id"]) in held:
                users.add(row["user_id"])
    return users


@pytest.mark.parametrize("seed", range(16))
def test_the_plan_is_what_the_gate_decides_when_each_job_starts(world, seed):
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    Segment.objects.filter(slug="vip").update(time_zone=rng.choice(ZONES))
    for n in range(rng.randint(1, 3)):
        random_rule(rng, n)
    if rng.random() < 0.3:
        QUIET_HOURS.create(
            fields=QuietFields(
                segment=rng.choice([None, "vip"]),
                channel=rng.choice(["email", "all"]),
                start=f"{rng.randint(0, 23):02d}:00",
                end=f"{rng.randint(0, 23):02d}:30",
                spread_minutes=rng.choice([0, 30]),
            ),
            via="command",
        )
    policy_cache().invalidate()
    # What the users' logs hold already: earlier sends over the two days before.
    for _ in range(rng.randint(0, 8)):
        users = rng.sample(USERS, rng.randint(1, 30))
        gate_check(
            channel=rng.choice(["email", "push"]),
            requests=[(u, f"earlier-{rng.random()}:{u}") for u in users],
            campaign=rng.choice(["spring", "old"]),
            tags=tuple(rng.choice([[], ["promo"]])),
            now=(base - timedelta(hours=rng.uniform(0, 48))).timestamp(),
        )
    starts = sorted(
        {base + timedelta(minutes=15 * rng.randint(0, 4 * 36)) for _ in range(rng.randint(2, 4))}
    )
    jobs = [random_job(rng, n, start) for n, start in enumerate(starts)]
    assert [j.pk for j in scheduled_jobs()] == [j.pk for j in jobs]

    plans = plan_compute()
    live = get_limiter()
    assert not list(live.client.scan_iter(f"{live.prefix}plan:*"))  # the copy is removed

    for job, plan in zip(jobs, plans, strict=True):
        before = in_logs(job)  # an earlier job of the same campaign sent them (a duplicate)
        assert jobs_start_due(now=job.start_at)  # nothing else happens in between
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, now=job.start_at)
        job.refresh_from_db()
        case = f"seed {seed}, job {job.pk}"
        assert Counter(job.reasons) == +plan.reasons, case
        assert in_logs(job) - before == {int(u) for u in plan.admitted}, case
        assert plan.sent == job.sent and plan.recipients == job.total, case


def test_the_plan_names_the_earlier_job_that_takes_the_slot(world):
    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()
    start = timezone.now() + timedelta(hours=2)
    promo = send_job_create(
        channel="push",
        campaign="promo",
        template="welcome",
        tags=["promo"],
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in (1, 2, 3)],
        start_at=start,
        queue=False,
    )
    launch = send_job_create(
        channel="email",
        campaign="launch",
        template="welcome",
        tags=["promo"],
        priority=9,
        recipients=recipients(2, 3, 4),
        start_at=start + timedelta(hours=20),
        queue=False,
    )
    first, second = plan_compute()
    assert (first.job_id, first.sent) == (promo.pk, 3)
    assert (second.job_id, second.sent, second.reasons["daily_cap"]) == (launch.pk, 1, 2)
    assert second.taken_by == Counter({promo.pk: 2})
    assert sorted(second.lost_users) == [2, 3]
    assert list(second.rules.values()) == [2]
