"""The forward plan predicts, per recipient, what the gate decides when each scheduled job
starts: checked against the gate's own later decisions over random rules, quiet hours, jobs
(some of them reserved), earlier sends and clocks around DST changes, when nothing else happens
in between."""

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.utils import timezone

from limits.engine import log
from limits.engine.limiter import get_limiter
from limits.engine.quiet import QuietFields
from limits.engine.reservations import holds_cache
from limits.policy.selectors import policy_cache
from limits.policy.services import QUIET_HOURS
from segments.models import Segment
from tests.support.sends import make_rule, recipients
from worker.chunks import send_chunk_run
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.plan import plan_compute, plan_overlaps, plan_refresh, plan_shape, scheduled_jobs
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
        reserve=rng.random() < 0.4,
        queue=False,
    )
    # The clock of the case (around a DST change, months ahead), set past the API's bounds.
    SendJob.objects.filter(pk=job.pk).update(start_at=start, expires_at=start + timedelta(days=1))
    job.refresh_from_db()
    return job


def earlier_sends(rng: random.Random, base: datetime, *, most: int) -> None:
    """What the users' logs hold already: up to `most` batches of sends over the two days
    before `base`."""
    for _ in range(rng.randint(0, most)):
        users = rng.sample(USERS, rng.randint(1, 30))
        gate_check(
            channel=rng.choice(["email", "push"]),
            requests=[(u, f"earlier-{rng.random()}:{u}") for u in users],
            campaign=rng.choice(["spring", "old"]),
            tags=tuple(rng.choice([[], ["promo"]])),
            now=base - timedelta(hours=rng.uniform(0, 48)),
        )


def in_logs(job: SendJob) -> set[int]:
    """The job's recipients whose logs hold its message id on its channel."""
    limiter = get_limiter()
    users = set()
    for chunk in SendChunk.objects.filter(job=job):
        for row in chunk.recipients:
            held = {e.message for e in limiter.entries(row["user_id"]) if e.channel == job.channel}
            if log.stored_message_hash(row["message_id"]) in held:
                users.add(row["user_id"])
    return users


@pytest.mark.parametrize("seed", range(24))
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
    earlier_sends(rng, base, most=8)
    starts = sorted(
        {base + timedelta(minutes=15 * rng.randint(0, 4 * 36)) for _ in range(rng.randint(2, 4))}
    )
    jobs = [random_job(rng, n, start) for n, start in enumerate(starts)]
    assert [j.pk for j in scheduled_jobs()] == [j.pk for j in jobs]

    assert plan_refresh(force=True)  # the reserved jobs' holds with it
    holds_cache().clear()
    plans = plan_compute()
    live = get_limiter()
    assert not list(live.client.scan_iter(f"{live.prefix}plan:*"))  # nothing written

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
    # Every promo sent had the day's one slot: one more promo first would have refused it.
    assert (first.one_slot_left, second.one_slot_left) == (3, 1)


def test_the_plan_counts_the_sends_one_more_send_before_the_start_would_refuse(world):
    """What a prediction cannot know, said per job: sends predicted that one more send to the
    same user before the job starts would refuse (the rule with the least room had one)."""
    make_rule("2 a day", channel="email", limit=2)
    policy_cache().invalidate()
    start = timezone.now() + timedelta(hours=2)
    gate_check(channel="email", requests=[(1, "before:1"), (2, "before:2")], now=start)
    job = send_job_create(
        channel="email",
        campaign="news",
        template="welcome",
        recipients=recipients(1, 2, 3),
        start_at=start + timedelta(hours=1),
        queue=False,
    )
    (plan,) = plan_compute()
    assert (plan.job_id, plan.sent, plan.one_slot_left) == (job.pk, 3, 2)  # users 1 and 2
    assert plan_shape([plan], [job])[0]["one_slot_left"] == 2


def test_a_plan_that_outlived_its_lock_leaves_the_next_holders_lock(world, monkeypatch):
    """A plan made for longer than its lock (PLAN_LOCK_SECONDS) finds, when it ends, the lock
    another process took after it ran out: it gives back only its own, so that the other's
    plan is not joined by a third."""
    from worker import plan

    live = get_limiter()
    lock = f"{live.prefix}{plan.PLAN_LOCK}"
    live.client.delete(lock)
    real = plan.plan_with_holds

    def outlasting(jobs, **kwargs):
        assert live.client.exists(lock)  # this plan's, while it is made
        assert live.client.pexpire(lock, 0)  # its time ran out (0 ms: the key is gone now)
        assert live.client.set(lock, "next", nx=True, ex=60)  # and the next process took it
        return real(jobs, **kwargs)

    monkeypatch.setattr(plan, "plan_with_holds", outlasting)
    assert plan_refresh(force=True)  # this one's plan is made all the same
    assert live.client.get(lock) == b"next"  # the next holder's lock stands
    assert plan.plan_computing()
    assert not plan_refresh(force=True)  # and keeps a second plan from being made beside it
    live.client.delete(lock)


@pytest.mark.django_db(transaction=True)
def test_the_plan_over_rest_is_made_in_the_background_and_follows_edits(api, snapshot):
    from tests.support import broker
    from tests.support.api import call
    from worker import tasks

    broker.clear("sends")  # user 7: one email a day and a week (the snapshot's default caps)
    s = api("gate")
    # Both jobs on one UTC day whatever the hour the test runs at: `?to=<day>` must hold both.
    start = (timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    body = {"channel": "email", "template": "welcome", "start_at": start.isoformat()}
    first = call(
        s, "POST", "/api/v1/sends/", json={**body, "campaign": "a", "recipients": recipients(1, 7)}
    )
    later = {**body, "start_at": (start + timedelta(hours=1)).isoformat()}
    second = call(
        s, "POST", "/api/v1/sends/", json={**later, "campaign": "b", "recipients": recipients(7)}
    )
    viewer = api("viewer")
    answer = call(viewer, "GET", "/api/v1/plan/").json()
    assert (answer["stale"], answer["computing"], answer["jobs"]) == (True, True, [])
    assert [name for name, _ in broker.queued("sends")] == ["worker.tasks.plan_refresh_due"]
    assert tasks.plan_refresh_due() is True
    answer = call(viewer, "GET", "/api/v1/plan/").json()
    assert (answer["stale"], answer["computing"]) == (False, False)
    a, b = answer["jobs"]
    assert (a["job"], a["sent"], a["refused"]) == (first.json()["id"], 2, {})
    assert (b["job"], b["sent"], b["refused"]) == (second.json()["id"], 0, {"weekly_cap": 1})
    assert b["taken_by"] == [{"job": a["job"], "campaign": "a", "sends": 1}]
    assert b["lost_users"] == [7] and b["rules"][0]["refused"] == 1
    assert tasks.plan_refresh_due() is False  # nothing changed: not made again

    day = start.date().isoformat()
    only = call(viewer, "GET", f"/api/v1/plan/?from={b['start_at'].replace('+00:00', 'Z')}").json()
    assert [j["job"] for j in only["jobs"]] == [b["job"]]
    assert len(call(viewer, "GET", f"/api/v1/plan/?to={day}").json()["jobs"]) == 2
    bad = call(viewer, "GET", "/api/v1/plan/?from=tomorrow")
    assert bad.status_code == 400 and "from" in bad.json()
    one = call(viewer, "GET", f"/api/v1/sends/{b['job']}/plan/")
    assert one.status_code == 200 and one.json()["refused"] == {"weekly_cap": 1}

    # Moving the second job eight days on frees its slot: the plan is stale until made again.
    moved = (start + timedelta(days=8)).isoformat()
    assert call(s, "PATCH", f"/api/v1/sends/{b['job']}/", json={"start_at": moved}).ok
    assert call(viewer, "GET", "/api/v1/plan/").json()["stale"] is True
    assert tasks.plan_refresh_due() is True
    b = call(viewer, "GET", f"/api/v1/sends/{b['job']}/plan/").json()
    assert (b["sent"], b["refused"], b["taken_by"]) == (1, {}, [])
    assert call(s, "POST", f"/api/v1/sends/{b['job']}/cancel/").ok
    gone = call(viewer, "GET", f"/api/v1/sends/{b['job']}/plan/")
    assert gone.status_code == 404 and "not scheduled" in gone.json()["detail"]


@pytest.mark.cluster
def test_the_plan_and_its_holds_on_one_node_and_on_a_cluster(published, settings, settings_redis):
    """Users on every node of a cluster: the plan is what the gate then decides, a reserved
    job's holds refuse what they must, and the plan writes nothing to any node but its result."""
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    users = [k * 257 + 1 for k in range(30)]  # 30 buckets: slots on every node
    published(vip=(10, users[:10], {}))
    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()
    start = timezone.now() + timedelta(hours=2)

    def job(members, *, hours, priority, reserve=False, tags=("promo",)):
        return send_job_create(
            channel="email",
            campaign=f"c{hours}",
            template="welcome",
            tags=list(tags),
            priority=priority,
            recipients=recipients(*members),
            start_at=start + timedelta(hours=hours),
            reserve=reserve,
            queue=False,
        )

    jobs = [
        job(users[:20], hours=0, priority=3),
        job(users[5:25], hours=4, priority=8, reserve=True),
        job(users[10:], hours=30, priority=5, tags=()),
    ]
    assert plan_refresh(force=True)
    holds_cache().clear()
    plans = plan_compute()
    assert plans[0].reasons["reserved"] == 15  # users[5:20] are held for the second job
    nodes = (
        [settings_redis.get_redis_connection(n) for n in settings_redis.get_primaries()]
        if hasattr(settings_redis, "get_primaries")
        else [settings_redis]
    )
    prefix = get_limiter().prefix
    assert not [k for node in nodes for k in node.scan_iter(f"{prefix}plan:*")]
    for planned, scheduled in zip(plans, jobs, strict=True):
        before = in_logs(scheduled)
        jobs_start_due(now=scheduled.start_at)
        for chunk in SendChunk.objects.filter(job=scheduled).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, now=scheduled.start_at)
        scheduled.refresh_from_db()
        assert Counter(scheduled.reasons) == +planned.reasons
        assert in_logs(scheduled) - before == {int(u) for u in planned.admitted}


def test_a_rule_made_just_before_a_job_is_in_its_plan_whatever_this_process_cached(
    world, monkeypatch
):
    """A rule made seconds before a job was scheduled, already refusing at the gate, was missing
    from the plan: the plan read the policy from the process's cached copy (kept for
    GATEKEEPER_CAPS_TTL_SECONDS), while the plan's inputs were hashed from the database, so the
    stale plan also passed for fresh. The plan reads the policy as it is."""
    cache = policy_cache()
    monkeypatch.setattr(cache, "ttl", 3600.0)
    cache.invalidate()
    cache.table()  # this process's copy, read before the rule
    start = timezone.now() + timedelta(hours=1)
    gate_check(  # four users had their one push of the day already
        channel="push", requests=[(u, f"earlier:{u}") for u in (1, 2, 3, 4)], campaign="old"
    )
    make_rule("1 push a day", channel="push", limit=1)  # by another process: no invalidation
    job = send_job_create(
        channel="push",
        campaign="later",
        template="welcome",
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in range(1, 11)],
        start_at=start,
        queue=False,
    )
    assert plan_refresh(force=True)
    (planned,) = plan_compute()
    assert (planned.job_id, planned.sent) == (job.pk, 6)
    assert planned.reasons["daily_cap"] == 4
    assert plan_refresh() is False  # made with the policy its inputs were hashed from


def test_overlaps_count_the_users_every_pair_of_jobs_shares():
    from worker.plan import JobPlan, plan_overlaps

    rng = random.Random(3)
    start = datetime(2027, 1, 1, tzinfo=UTC)
    audiences = [sorted(rng.sample(range(1, 500), rng.randint(0, 200))) for _ in range(6)]
    plans = [
        JobPlan(job_id=k, campaign=f"c{k}", channel="email", priority=5, start_at=start)
        for k in range(6)
    ]
    for plan, users in zip(plans, audiences, strict=True):
        plan.audience = np.asarray(users, dtype=np.uint64)
    found = {tuple(o["jobs"]): o["users"] for o in plan_overlaps(plans)}
    expected = {
        (i, j): len(set(audiences[i]) & set(audiences[j]))
        for i in range(6)
        for j in range(i + 1, 6)
        if set(audiences[i]) & set(audiences[j])
    }
    assert found == expected and found


@pytest.mark.parametrize("seed", range(6))
def test_a_job_the_plan_puts_through_the_gate_is_counted_as_one_decided_at_once(
    world, seed, monkeypatch
):
    """The two ways a job is planned (its recipients at once over arrays; through the gate
    chunk by chunk, for a job listing a user twice or transactional) count alike."""
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    for n in range(rng.randint(1, 3)):
        random_rule(rng, n)
    policy_cache().invalidate()
    earlier_sends(rng, base, most=6)
    starts = sorted({base + timedelta(minutes=15 * rng.randint(0, 4 * 36)) for _ in range(3)})
    [random_job(rng, n, start) for n, start in enumerate(starts)]
    at_once = plan_compute()
    monkeypatch.setattr("worker.plan._job_decided", lambda *args, **kwargs: None)
    through_gate = plan_compute()
    assert at_once and len(at_once) == len(through_gate)
    for a, b in zip(at_once, through_gate, strict=True):
        assert (a.job_id, a.recipients, +a.reasons, +a.rules, +a.taken_by) == (
            b.job_id,
            b.recipients,
            +b.reasons,
            +b.rules,
            +b.taken_by,
        )
        assert (a.held_from, a.held_until) == (b.held_from, b.held_until)
        assert np.array_equal(a.admitted, b.admitted) and a.lost_users == b.lost_users
        assert a.one_slot_left is not None and b.one_slot_left is None


def test_asked_for_it_each_job_counts_the_later_jobs_of_higher_priority(world, api):
    from tests.support.api import call
    from worker.plan import plan_later_counted

    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()
    start = timezone.now() + timedelta(hours=2)
    promo = send_job_create(
        channel="push", campaign="promo", template="welcome", tags=["promo"],
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in (1, 2, 3)],
        start_at=start, queue=False,
    )  # fmt: skip
    launch = send_job_create(
        channel="email", campaign="launch", template="welcome", tags=["promo"], priority=9,
        recipients=recipients(2, 3, 4), start_at=start + timedelta(hours=20), queue=False,
    )  # fmt: skip
    # As the plan is made: the earlier promo takes the slots the later launch needed.
    assert [p.sent for p in plan_compute()] == [3, 1]
    counted = {job["job"]: job for job in plan_later_counted()}
    assert (counted[promo.pk]["sent"], counted[promo.pk]["refused"]) == (1, {"reserved": 2})
    assert counted[promo.pk]["taken_by"] == [{"job": launch.pk, "campaign": "launch", "sends": 2}]
    assert counted[promo.pk]["lost_users"] == [2, 3]
    assert counted[launch.pk]["sent"] == 3
    assert not SendJob.objects.filter(reserve=True).exists()  # nothing saved
    answer = call(api("viewer"), "GET", "/api/v1/plan/?later=counted")
    assert answer.status_code == 200, answer.text
    assert {j["job"]: j["sent"] for j in answer.json()["jobs"]} == {promo.pk: 1, launch.pk: 3}
    bad = call(api("viewer"), "GET", "/api/v1/plan/?later=maybe")
    assert bad.status_code == 400 and "later" in bad.json()


def test_the_plan_page_shows_what_each_job_loses_to_later_jobs_when_asked(world, viewer_client):
    from django.urls import reverse

    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()
    start = timezone.now() + timedelta(hours=2)
    promo = send_job_create(
        channel="email", campaign="promo", template="welcome", tags=["promo"],
        recipients=recipients(1, 2, 3), start_at=start, queue=False,
    )  # fmt: skip
    send_job_create(
        channel="email", campaign="launch", template="welcome", tags=["promo"], priority=9,
        recipients=recipients(2, 3), start_at=start + timedelta(hours=20), queue=False,
    )  # fmt: skip
    plan_refresh(force=True)
    page = viewer_client.get(reverse("admin:plan")).content.decode()
    assert 'id="plan-later-count"' in page and 'id="plan-later"' not in page
    asked = viewer_client.get(reverse("admin:plan") + "?later=counted").content.decode()
    row = asked[asked.index(f"<tr><td>#{promo.pk} promo</td>") :].split("</tr>")[0]
    assert ">3<" in row and ">1<" in row and "-2" in row and "launch (2)" in row


@pytest.mark.parametrize("seed", range(8))
def test_after_an_edit_of_some_jobs_the_plan_is_made_again_for_their_users_alone(
    world, seed, monkeypatch
):
    """Moved, changed, added or cancelled: the plan made again for the users of the jobs
    edited, the others' decisions kept, is the plan made whole."""
    from worker.plan import plan_latest
    from worker.services import send_job_cancel

    monkeypatch.setattr("worker.plan.REMAKE_SHARE", 1.0)  # a few users: always remade
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    for n in range(rng.randint(1, 3)):
        random_rule(rng, n)
    make_rule("8 a week", channel="all", window_seconds=7 * 86_400, limit=8)
    policy_cache().invalidate()
    earlier_sends(rng, base, most=6)
    starts = sorted(base + timedelta(minutes=15 * rng.randint(0, 4 * 36)) for _ in range(4))
    jobs = [random_job(rng, n, start) for n, start in enumerate(starts)]
    SendJob.objects.update(reserve=False)
    far = 70_000  # in no job yet: its log is in a bucket the plan made whole does not read
    for channel in ("email", "push"):
        gate_check(
            channel=channel,
            requests=[(far, f"far{k}:{channel}") for k in range(4)],
            campaign="spring",
            tags=("promo",),
            now=base - timedelta(minutes=30),
        )
    assert plan_refresh(force=True)
    whole = plan_latest()
    assert whole is not None and whole["remade_users"] is None
    target = jobs[rng.randrange(len(jobs))]
    edited = SendJob.objects.filter(pk=target.pk)
    match seed % 4:
        case 0:
            moved = base + timedelta(minutes=15 * rng.randint(0, 4 * 36))
            edited.update(start_at=moved, updated_at=timezone.now())
        case 1:
            edited.update(priority=rng.randint(0, 9), tags=["promo"], updated_at=timezone.now())
        case 2:
            added = random_job(rng, 9, base + timedelta(minutes=15 * rng.randint(0, 4 * 36)))
            chunk = added.chunks.order_by("pk").last()
            assert chunk is not None
            address = f"token-{far}" if added.channel == "push" else f"u{far}@example.com"
            chunk.recipients.append(
                {"user_id": far, "address": address, "message_id": f"{added.campaign}:{far}"}
            )
            chunk.save(update_fields=["recipients"])
            SendJob.objects.filter(pk=added.pk).update(total=added.total + 1)
            SendJob.objects.update(reserve=False)
        case _:
            send_job_cancel(job=target)
    assert plan_refresh()
    remade = plan_latest()
    assert remade is not None and 0 < remade["remade_users"] <= len(USERS)
    again = plan_compute()
    assert remade["jobs"] == plan_shape(again, scheduled_jobs())
    assert remade["overlaps"] == plan_overlaps(again)


@pytest.mark.parametrize("seed", range(12))
def test_after_a_policy_or_snapshot_edit_the_plan_is_made_again_for_the_users_it_reaches(
    world, seed, monkeypatch
):
    """A rule, quiet-hours entry, classic cap or zone of one segment edited, or a new snapshot
    that moves users between segments: the plan made again for the users the edit reaches, the
    others' decisions kept, is the plan made whole; an edit of one segment's remakes no user
    outside it."""
    import io

    from limits.models import Rule
    from limits.policy.services import RULES, cap_set
    from segments.index import refresh
    from segments.publishing import build_run
    from segments.services import build_start, user_list_import
    from worker.plan import plan_latest

    monkeypatch.setattr("worker.plan.REMAKE_SHARE", 1.0)  # a few users: always remade
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    for n in range(rng.randint(1, 3)):
        random_rule(rng, n)
    vip_rule = make_rule("vip 2 a day", segment="vip", channel="all", limit=2)
    make_rule("8 a week", channel="all", window_seconds=7 * 86_400, limit=8)
    policy_cache().invalidate()
    earlier_sends(rng, base, most=6)
    starts = sorted(base + timedelta(minutes=15 * rng.randint(0, 4 * 36)) for _ in range(4))
    for n, start in enumerate(starts):
        random_job(rng, n, start)
    SendJob.objects.update(reserve=False)
    assert plan_refresh(force=True)
    vip = Segment.objects.get(slug="vip")
    case = seed % 6
    match case:
        case 0:
            RULES.update(row=Rule.objects.get(pk=vip_rule.pk), changes={"limit": 1})
        case 1:
            make_rule("vip promo", segment="vip", channel=rng.choice(["email", "push"]),
                      match="tag", tag="promo", limit=rng.choice([0, 1]))  # fmt: skip
        case 2:
            QUIET_HOURS.create(
                fields=QuietFields(segment=rng.choice(["vip", None]), channel="all",
                                   start="00:00", end="23:59", spread_minutes=0),
                via="command",
            )  # fmt: skip
        case 3:
            cap_set(segment=vip, channel="email", daily=1, weekly=2, via="command")
        case 4:
            Segment.objects.filter(pk=vip.pk).update(time_zone=rng.choice(ZONES))
        case _:  # half the VIPs leave the list, as many others join it
            body = "".join(f"{u}\n" for u in USERS[10:30]).encode()
            user_list_import(segment=vip, fileobj=io.BytesIO(body), name="vip.txt")
            build_run(build_id=build_start(queue=False).pk)
            refresh()
    policy_cache().invalidate()
    assert plan_refresh()
    remade = plan_latest()
    assert remade is not None and remade["remade_users"] is not None
    if case in (0, 1, 3, 4):  # the VIPs of the jobs its rule or cap decides (of every job)
        assert (0 if case in (1, 3) else 1) <= remade["remade_users"] <= 20
    again = plan_compute()
    assert remade["jobs"] == plan_shape(again, scheduled_jobs())
    assert remade["overlaps"] == plan_overlaps(again)
