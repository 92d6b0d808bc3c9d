"""Beat's hand-over under a running job (gatekeeper/beat.py): two real beats, a real send worker
and a real upkeep worker, the ledger on and drained on beat's schedule. A job's sends wait for a
slot of a rolling cap that frees a few seconds ahead (on the real clock: the workers read it);
the leading beat is SIGKILLed just before they fall due, so the other beat takes the lead and
its `send_chunks_due` releases them while its `ledger_drain` writes their decisions. (A rule's
window is at least a minute: the first job's sends are gated with `now` a minute less a few
seconds ago, through the worker, so that their slots free a few seconds from now.) Every
deferred send goes out once, the ledger holds every decision once, and the hand-over (leader
killed to the other beat's first tick as leader: the lease taken) is printed and bounded by
GATEKEEPER_BEAT_LOCK_SECONDS, shortened here to 3 s."""

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from gatekeeper.beat import lease_key
from limits.ledger.drain import drain_backlog
from limits.ledger.table import decisions
from limits.models.ledger import LedgerEntry
from tests.support.celery_workers import (
    start_celery_beat_logged,
    start_celery_worker,
    stop_celery_worker,
    worker_env,
)
from tests.support.dispatch_log import (
    dispatched,
    file_dispatch_env,
)
from tests.support.sends import make_rule
from tests.support.worker_processes import TEST_BROKER_URL, job_counts, job_done, wait_for
from worker.models import SendChunk, SendJob
from worker.services import send_job_create
from worker.tasks import send_chunk

pytestmark = [
    pytest.mark.processes,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

LOCK_SECONDS = 3.0  # the beats' lease (GATEKEEPER_BEAT_LOCK_SECONDS; 15 s by default)
# A dead leader's lease ends within LOCK_SECONDS of its last renewal and the other beat tries
# every third of it (gatekeeper/beat.py); one more second for a loaded machine's scheduling.
HAND_OVER_BOUND = LOCK_SECONDS + LOCK_SECONDS / 3 + 1.0
WINDOW = 60  # the cap: one push per user in any minute (the shortest window a rule takes)
AHEAD = 10.0  # the first job's sends are gated this long less than WINDOW ago
USERS = range(1, 301)
# A job of other users in small chunks, queued once the second job's sends wait: the send
# worker gates and sends it through the hand-over, and the drain writes its decisions meanwhile.
STEADY = range(10_001, 20_001)
STEADY_CHUNK = 250
STEADY_RATE = 800  # the dispatcher's sends a second: the steady job lasts about 12 s
KILL_AHEAD = 1.0  # the leader is killed this long before the deferred sends fall due


def leader_pid(data: redis.Redis) -> int | None:
    token = cast(bytes | None, data.get(lease_key()))
    return int(token.split(b":")[1]) if token else None


@pytest.fixture
def processes(published, redis_client, tmp_path) -> Iterator[dict[str, Any]]:
    """The snapshot and the cap first (the workers read them at start), then the send worker,
    the upkeep worker and two beats. Yields the beats, the dispatch log and the beats' logs."""
    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    published(vip=(10, list(USERS), {}))
    make_rule("apart", channel="push", window_seconds=WINDOW, limit=1)
    log = tmp_path / "dispatched.txt"
    env = worker_env(
        TEST_BROKER_URL,
        GATEKEEPER_BEAT_LOCK_SECONDS=str(LOCK_SECONDS),
        **file_dispatch_env(log, STEADY_RATE),
    )
    workers = [
        start_celery_worker(settings.CELERY_TASK_DEFAULT_QUEUE, env),
        start_celery_worker(settings.UPKEEP_QUEUE, env),
    ]
    beats: dict[int, subprocess.Popen[Any]] = {}
    logs: dict[int, Path] = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        beat_log = tmp_path / name / "beat.log"
        process = start_celery_beat_logged(env, tmp_path / name, beat_log)
        beats[process.pid], logs[process.pid] = process, beat_log
    yield {"beats": beats, "dispatched": log, "logs": logs}
    for process in [*workers, *beats.values()]:
        stop_celery_worker(process)


def push_job(campaign: str, users: range = USERS, *, queue: bool = True) -> SendJob:
    return send_job_create(
        channel="push",
        campaign=campaign,
        template="welcome",
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in users],
        on_capped="defer",
        queue=queue,
    )


def waiting(job: SendJob) -> list[SendChunk]:
    return list(
        SendChunk.objects.filter(
            job=job, kind=SendChunk.Kind.DEFERRED, status=SendChunk.Status.QUEUED
        ).order_by("not_before")
    )


def test_deferred_sends_fall_due_while_the_leading_beat_is_killed(
    processes, settings, capsys
) -> None:
    started = time.monotonic()
    settings.GATEKEEPER_SEND_CHUNK_SIZE = STEADY_CHUNK
    steady = push_job("steady", STEADY, queue=False)
    settings.GATEKEEPER_SEND_CHUNK_SIZE = len(USERS)
    data = redis.Redis.from_url(settings.REDIS_URL)
    beats: dict[int, subprocess.Popen[Any]] = processes["beats"]
    wait_for(lambda: leader_pid(data) in beats, seconds=60, what="a beat to take the lead")

    # The first job takes every user's slot (its chunks run by the worker with `now`, as if
    # gated WINDOW - AHEAD seconds ago); the second, gated at once after it on the real clock,
    # waits for the slots to free: AHEAD seconds from now.
    first = push_job("first", queue=False)
    then = timezone.now() - timedelta(seconds=WINDOW - AHEAD)
    for chunk in first.chunks.all():
        send_chunk.apply_async((chunk.pk,), {"now": then.isoformat()})
    wait_for(lambda: job_done(first), seconds=60, what="the first job")
    second = push_job("second")
    wait_for(
        lambda: job_counts(second)["pending"] == len(USERS) and bool(waiting(second)),
        seconds=30,
        what="the second job's sends to wait",
    )
    second.refresh_from_db()
    assert second.reasons == {"cap": len(USERS)}, second.reasons
    chunks = waiting(second)
    assert sum(c.size for c in chunks) == len(USERS)
    due = min(cast(Any, c.not_before) for c in chunks)
    assert due > timezone.now() + timedelta(seconds=1), "the sends fell due too soon"
    assert not dispatched(processes["dispatched"]).keys() & {(u, f"second:{u}") for u in USERS}
    # Beat's drain wrote the decisions so far, under the first leader.
    wait_for(
        lambda: LedgerEntry.objects.count() == 2 * len(USERS),
        seconds=AHEAD / 2,
        what="the first leader's drain",
    )
    for chunk_id in steady.chunks.values_list("pk", flat=True):
        send_chunk.delay(chunk_id)

    # Just before they fall due, the leader is killed: no release of its can find them due.
    kill_at = due - timedelta(seconds=KILL_AHEAD)
    wait_for(lambda: timezone.now() >= kill_at, seconds=30, what="the sends' release")
    dead = cast(int, leader_pid(data))
    assert dead in beats
    os.killpg(dead, signal.SIGKILL)
    killed = time.monotonic()
    beats[dead].wait(timeout=10)
    backlog = drain_backlog().entries
    steady.refresh_from_db()
    steady_left = job_counts(steady)["pending"]
    # The other beat's first tick as leader is the one that takes the lease.
    deadline = killed + 30
    while leader_pid(data) in (None, dead):
        assert time.monotonic() < deadline, "no beat took the lead"
        time.sleep(0.02)
    hand_over = time.monotonic() - killed
    led_at = timezone.now()
    (survivor,) = set(beats) - {dead}
    assert leader_pid(data) == survivor
    with capsys.disabled():  # printed whether or not pytest captures the output
        print(
            f"\nbeat hand-over: {hand_over:.2f} s (lease {LOCK_SECONDS:g} s); at the kill the "
            f"ledger's stream held {backlog} decisions and the steady job {steady_left} sends"
        )
    assert hand_over < HAND_OVER_BOUND
    # It led for the first time now; the steady job's decisions kept coming meanwhile.
    assert processes["logs"][survivor].read_bytes().count(b"takes the lead") == 1
    assert steady_left > 0

    # The new leader's send_chunks_due releases the sends, its ledger_drain writes them down.
    wait_for(lambda: job_done(second), seconds=40, what="the deferred sends to go out")
    released = time.monotonic() - killed
    counts = job_counts(second)
    assert (counts["sent"], counts["pending"]) == (len(USERS), 0), counts
    # Released by the new leader's send_chunks_due, not before their time, each run once.
    # A new leader runs at once the tasks whose last run it did not see (gatekeeper/beat.py).
    handed = []
    for chunk in SendChunk.objects.filter(pk__in=[c.pk for c in chunks]):
        assert chunk.status == SendChunk.Status.DONE and chunk.runs == 1
        handed.append(cast(Any, chunk.queued_at))
    assert min(handed) >= max(due, led_at - timedelta(seconds=0.1))
    assert max(handed) < led_at + timedelta(seconds=LOCK_SECONDS)
    wait_for(lambda: job_done(steady), seconds=60, what="the steady job")
    assert job_counts(steady)["sent"] == len(STEADY)

    # Every send of both jobs handed to the dispatcher once; the deferred ones once each.
    sent = dispatched(processes["dispatched"])
    twice = [key for key, n in sent.items() if n > 1]
    assert not twice, f"sent twice: {twice[:10]}"
    assert set(sent) == {(u, f"{c}:{u}") for u in USERS for c in ("first", "second")} | {
        (u, f"steady:{u}") for u in STEADY
    }

    # The ledger, drained by beat's drain alone: each decision once. The first job's sends
    # allowed and sent; the second's refused by the cap, then allowed and sent at release.
    expected = Counter(
        {
            **{(u, f"first:{u}", "allowed", "sent"): 1 for u in USERS},
            **{(u, f"second:{u}", "cap", ""): 1 for u in USERS},
            **{(u, f"second:{u}", "allowed", "sent"): 1 for u in USERS},
            **{(u, f"steady:{u}", "allowed", "sent"): 1 for u in STEADY},
        }
    )
    wait_for(
        lambda: LedgerEntry.objects.filter(outcome="sent").count() >= 2 * len(USERS) + len(STEADY),
        seconds=30,
        what="beat's drain to write every decision",
    )
    assert drain_backlog().entries == 0
    found = Counter(decisions().values_list("user_id", "message", "reason", "outcome"))
    assert found == expected, (found - expected, expected - found)
    with capsys.disabled():
        print(
            f"released {(max(handed) - led_at).total_seconds():.2f} s after the lead was taken, "
            f"sent {released:.2f} s after the kill; "
            f"test {time.monotonic() - started:.1f} s after the processes started"
        )
