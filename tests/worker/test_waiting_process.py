"""Waiting sends end to end: a real Celery worker and a real Celery beat on the tests' broker,
a real SMTP server, real Redis. Time is passed, not waited for: the first pass runs at night
(`send_chunk` with `now`), and the morning comes by `send_chunks_due` called with `now`
through the broker, run by the worker like beat's own calls. Beat itself runs meanwhile on the
real clock, hours before any release: it must send nothing."""

import re
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.support.celery_workers import (
    start_celery_beat,
    start_celery_worker,
    stop_celery_worker,
    worker_env,
)
from tests.support.sends import Inbox, smtp_serving
from tests.support.waiting import MORNING, NIGHT, SPREAD, USERS, adds_up, release
from tests.support.worker_processes import TEST_BROKER_URL, wait_for
from worker.models import SendChunk, SendJob
from worker.selectors import send_job_waiting
from worker.services import send_job_cancel_waiting, send_job_create
from worker.tasks import send_chunk, send_chunks_due

pytestmark = [
    pytest.mark.processes,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]
BEAT_TICK = re.compile(rb"send_chunks_due\[[^\]]+\] succeeded in [\d.e-]+s: (\d+)")


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    handler = Inbox()
    with smtp_serving(handler) as port:
        yield handler, port


@pytest.fixture
def worker_and_beat(inbox, redis_client, tmp_path) -> Iterator[Path]:
    """Starts them; yields the worker's log (INFO: each task's result)."""
    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    env = worker_env(
        TEST_BROKER_URL,
        EMAIL_URL=f"smtp://127.0.0.1:{inbox[1]}",
        GATEKEEPER_CAPS_TTL_SECONDS="2",
        # The periodic tasks' results are what the test reads: written only when asked.
        GATEKEEPER_PERIODIC_LOG_LEVEL="INFO",
    )
    log = tmp_path / "worker.log"
    # Beat's tasks run on the upkeep queue (gatekeeper/settings.py), its chunks on sends.
    processes = [
        start_celery_worker(f"sends,{settings.UPKEEP_QUEUE}", env, log=log),
        start_celery_beat(env, tmp_path),
    ]
    yield log
    for process in processes:
        stop_celery_worker(process)


def sent_users(inbox: Inbox) -> Counter[int]:
    return Counter(int(address[1:].split("@")[0]) for address, _ in inbox.messages)


def job(campaign: str, expires_at: datetime) -> SendJob:
    return send_job_create(
        channel="email",
        campaign=campaign,
        template="welcome",
        recipients=[{"user_id": u, "address": f"u{u}@example.com"} for u in USERS],
        on_capped="defer",
        expires_at=expires_at,
        queue=False,
    )


def waiting(jobs: list[SendJob]) -> list[SendChunk]:
    return list(
        SendChunk.objects.filter(
            job__in=jobs, kind=SendChunk.Kind.DEFERRED, status=SendChunk.Status.QUEUED
        )
    )


def morning(at: datetime, jobs: list[SendJob]) -> None:
    """Beat's task at `at`, run by the worker; returns once what it queued has run."""
    due = {c.pk for c in waiting(jobs) if c.not_before is not None and c.not_before <= at}
    send_chunks_due.apply_async(kwargs={"now": at.isoformat()})
    wait_for(
        lambda: not SendChunk.objects.filter(pk__in=due, status=SendChunk.Status.QUEUED).exists(),
        seconds=60,
        what=f"the chunks due at {at:%H:%M}",
    )


def test_deferred_sends_go_at_their_release_not_before_and_end_when_expired_or_cancelled(
    quiet_vip, inbox, worker_and_beat
):
    handler = inbox[0]
    night = job("night", MORNING + timedelta(hours=2))
    short = job("short", MORNING + timedelta(minutes=12))
    cancelled = job("cancel", MORNING + timedelta(hours=2))
    jobs = [night, short, cancelled]
    # The first pass, at night, by the worker.
    first = [chunk.pk for j in jobs for chunk in j.chunks.all()]
    for chunk_id in first:
        send_chunk.apply_async((chunk_id,), {"now": NIGHT.isoformat()})
    wait_for(
        lambda: not SendChunk.objects.filter(pk__in=first, status="queued").exists(),
        seconds=60,
        what="the night's first pass",
    )
    late = {u for u in USERS if release(u) > short.expires_at}
    assert 0 < len(late) < len(USERS)
    for j in jobs:
        counts = adds_up(j)
        assert j.reasons["quiet_hours"] == len(USERS)
        assert counts["expired"] == (len(late) if j is short else 0)
        assert send_job_waiting(j.pk)["sends"] == counts["pending"]
    assert handler.messages == []
    # Grouped by release minute: the spread is kept, nobody's group before their release.
    for chunk in waiting([night]):
        releases = [release(r["user_id"]) for r in chunk.recipients]
        assert chunk.not_before == max(releases)
        assert chunk.not_before - min(releases) < timedelta(minutes=1)
    assert len(waiting([night])) > 20

    # Cancel one job's waiting sends (as the REST API and the admin do).
    cancelled = send_job_cancel_waiting(job=cancelled)
    assert adds_up(cancelled)["cancelled"] == len(USERS) and cancelled.status == "done"

    # The real beat runs on the real clock, hours before any release: it queues nothing.
    # Counted by their "succeeded" lines: a "received" line comes before its result.
    mark = len(BEAT_TICK.findall(worker_and_beat.read_bytes()))
    wait_for(
        lambda: len(BEAT_TICK.findall(worker_and_beat.read_bytes())) > mark,
        seconds=40,
        what="a tick of the real beat run by the worker",
    )
    assert {int(n) for n in BEAT_TICK.findall(worker_and_beat.read_bytes())} == {0}
    assert handler.messages == []

    # 08:10 in Paris: the groups released by then go out, of both waiting jobs.
    at = MORNING + timedelta(minutes=10)
    expected = {
        r["user_id"]
        for c in waiting([night])
        if c.not_before is not None and c.not_before <= at
        for r in c.recipients
    }
    morning(at, jobs)
    sent = sent_users(handler)
    assert set(sent) == expected and set(sent.values()) == {2}  # night's and short's
    assert all(release(u) <= at for u in sent)
    for j in (night, short):
        counts = adds_up(j)
        assert counts["sent"] == len(expected)

    # 08:20: the short job expired at 08:12 with sends still waiting: they are dropped.
    at = MORNING + timedelta(minutes=20)
    morning(at, jobs)
    short_counts = adds_up(short)
    assert short_counts["pending"] == 0 and short.status == "done"
    assert short_counts["expired"] == len(USERS) - len(expected)
    assert not waiting([short])

    # 08:31: everybody of the night job has had their release.
    morning(MORNING + timedelta(seconds=SPREAD + 60), jobs)
    counts = adds_up(night)
    assert (counts["sent"], counts["pending"], night.status) == (len(USERS), 0, "done")
    assert sent_users(handler) == {u: 2 if u in expected else 1 for u in USERS}
    assert adds_up(cancelled)["sent"] == 0
