"""Real Celery worker processes for end-to-end tests: a slow SMTP server a test can stop
mid-message, workers started (this version's or an earlier release's) and killed."""

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tests.settings  # noqa: F401 (sets CELERY_BROKER_URL)
from tests.support.celery_workers import (
    ROOT,
    start_celery_worker,
    stop_celery_worker,
    worker_env,
)
from tests.support.sends import smtp_serving
from worker.models import SendJob
from worker.services import send_job_create

# The test process queues to this broker database too (tests/settings.py sets it).
TEST_BROKER_URL = os.environ["CELERY_BROKER_URL"]


class SlowInbox:
    """An SMTP server that takes a little while per message, like a real one, and that a test
    can stop in the middle of one message (`hold`): before taking it (it is then refused once
    released) or after taking it, before answering (the sender never learns it went out)."""

    def __init__(self) -> None:
        self.recipients: list[str] = []
        self._hold_at: int | None = None
        self._accept_held = False
        self.holding = threading.Event()
        self._release = threading.Event()

    def hold(self, *, at: int, accept: bool) -> None:
        self._hold_at, self._accept_held = at, accept
        self.holding.clear()
        self._release.clear()

    def release(self) -> None:
        self._hold_at = None
        self._release.set()

    async def handle_DATA(self, server, session, envelope):
        await asyncio.sleep(0.02)
        held = self._hold_at is not None and len(self.recipients) + 1 >= self._hold_at
        if held and self._accept_held:
            self.recipients.extend(envelope.rcpt_tos)
        if held:
            self.holding.set()
            while not self._release.is_set():
                await asyncio.sleep(0.01)
            return "250 OK" if self._accept_held else "451 Try again later"
        self.recipients.extend(envelope.rcpt_tos)
        return "250 OK"


def wait_for(
    condition: Callable[[], bool], *, seconds: float, what: str, every: float = 0.1
) -> float:
    """Wait until `condition` holds, looking every `every` seconds, for at most `seconds`: the
    time (time.monotonic()) at which it was first seen to hold."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
    return time.monotonic()


@pytest.fixture
def inbox() -> Iterator[tuple[SlowInbox, int]]:
    handler = SlowInbox()
    with smtp_serving(handler) as port:
        yield handler, port


@pytest.fixture
def start_worker(inbox, redis_client, settings) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    import redis

    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    started: list[subprocess.Popen[bytes]] = []
    env = worker_env(
        TEST_BROKER_URL,
        EMAIL_URL=f"smtp://127.0.0.1:{inbox[1]}",
        GATEKEEPER_CAPS_TTL_SECONDS="2",
        CELERY_VISIBILITY_TIMEOUT="5",
        CELERY_UNACKED_RESTORE_INTERVAL="2",
        # A killed worker's chunk is taken over this soon after its last lease renewal.
        GATEKEEPER_CHUNK_LEASE_SECONDS="3",
    )

    def start(
        root: Path = ROOT, redis_url: str | None = None, **settings: str
    ) -> subprocess.Popen[bytes]:
        """A worker of this version, or of the release whose source tree is `root`; on the
        tests' Redis, or the one at `redis_url`; `settings`: more of its environment."""
        own = {**env, **settings}
        if redis_url is not None:
            own["REDIS_URL"] = redis_url
        process = start_celery_worker("sends,builds", own, root=root)
        started.append(process)
        return process

    yield start
    for process in started:
        stop_celery_worker(process)


def job_done(job: SendJob) -> bool:
    job.refresh_from_db()
    return job.status == SendJob.Status.DONE


def kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def email_job(campaign: str, users: range) -> tuple[list[str], SendJob]:
    """A marketing email job of the `welcome` template to `users` (u<id>@example.com), queued
    for the workers: its addresses in order, and the job."""
    addresses = [f"u{u}@example.com" for u in users]
    recipients = [{"user_id": u, "address": a} for u, a in zip(users, addresses, strict=True)]
    job = send_job_create(
        channel="email", campaign=campaign, template="welcome", recipients=recipients
    )
    return addresses, job


def received_once(handler: SlowInbox) -> Counter[str]:
    """What the SMTP server received, per address; fails when anybody got two."""
    received = Counter(handler.recipients)
    assert max(received.values()) == 1, [a for a, n in received.items() if n > 1]
    return received


def job_counts(job: SendJob) -> dict[str, int]:
    """A (refreshed) job's outcome counts and what is still pending."""
    return {o: getattr(job, o) for o in (*SendJob.OUTCOMES, "pending")}
