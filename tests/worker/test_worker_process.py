"""End to end through real Celery worker processes (prefork) on the real Redis broker."""

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from aiosmtpd.controller import Controller
from kombu import Connection

from limits.services import cap_set
from segments.models import Segment
from tests.celery_workers import start_celery_worker, stop_celery_worker, worker_env
from tests.redis_servers import free_port
from worker import services
from worker.models import SendJob
from worker.processes import processes_list
from worker.services import send_job_create
from worker.tasks import send_chunk

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TEST_BROKER_URL = os.environ.get("GATEKEEPER_TEST_BROKER_URL", "redis://127.0.0.1:6379/9")


class SlowInbox:
    """An SMTP server that takes a little while per message, like a real one."""

    def __init__(self) -> None:
        self.recipients: list[str] = []

    async def handle_DATA(self, server, session, envelope):
        await asyncio.sleep(0.02)
        self.recipients.extend(envelope.rcpt_tos)
        return "250 OK"


@pytest.fixture
def inbox() -> Iterator[tuple[SlowInbox, int]]:
    handler = SlowInbox()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield handler, controller.port
    controller.stop()


@pytest.fixture
def start_worker(inbox, redis_client, settings) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
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

    def start() -> subprocess.Popen[bytes]:
        process = start_celery_worker("sends,builds", env)
        started.append(process)
        return process

    yield start
    for process in started:
        stop_celery_worker(process)


def queue_on_test_broker(ids: list[int]) -> None:
    with Connection(TEST_BROKER_URL) as conn:
        for chunk_id in ids:
            send_chunk.apply_async((chunk_id,), connection=conn)  # type: ignore[call-arg]


def wait_for(condition: Callable[[], bool], *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def job_done(job: SendJob) -> bool:
    job.refresh_from_db()
    return job.status == SendJob.Status.DONE


def test_a_cap_edit_governs_a_running_worker_within_five_seconds(
    published, start_worker, inbox, monkeypatch
):
    monkeypatch.setattr(services, "_queue", queue_on_test_broker)
    version = published(vip=(10, [1], {"email": (5, 10)}))
    worker = start_worker()
    first = send_job_create(
        channel="email",
        campaign="c0",
        template="welcome",
        recipients=[{"user_id": 9, "address": "nine@example.com"}],
    )
    wait_for(lambda: job_done(first), seconds=60, what="the first job")
    assert first.reasons == {"allowed": 1} and inbox[0].recipients == ["nine@example.com"]
    # The worker's child reported itself and the snapshot it gates with (for the dashboard).
    reported = [p for p in processes_list() if p["role"] == "worker"]
    assert [p["version"] for p in reported] == [version]
    assert reported[0]["pid"] != worker.pid  # the prefork child, not the parent

    edited = time.monotonic()
    cap_set(segment=Segment.objects.get(is_default=True), channel="email", daily=0, weekly=0)
    for attempt in range(1, 100):
        job = send_job_create(
            channel="email",
            campaign=f"c{attempt}",
            template="welcome",
            recipients=[{"user_id": 9, "address": "nine@example.com"}],
        )
        wait_for(lambda job=job: job_done(job), seconds=30, what=f"job {attempt}")
        if job.reasons == {"blocked": 1}:
            break
    took = time.monotonic() - edited
    assert job.reasons == {"blocked": 1}
    assert took < 5, f"the edit took {took:.1f} s to govern"


def test_a_worker_killed_mid_job_then_restarted_sends_nobody_twice(
    published, start_worker, inbox, monkeypatch, settings
):
    monkeypatch.setattr(services, "_queue", queue_on_test_broker)
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 25
    published(vip=(10, [1], {}))
    handler = inbox[0]
    recipients = [{"user_id": u, "address": f"u{u}@example.com"} for u in range(1000, 1200)]
    first = start_worker()
    job = send_job_create(
        channel="email", campaign="kill", template="welcome", recipients=recipients
    )
    wait_for(lambda: len(handler.recipients) >= 40, seconds=60, what="the first sends")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    delivered_before_restart = len(handler.recipients)
    assert delivered_before_restart < 200, "the job finished before the worker was killed"

    start_worker()
    try:
        wait_for(lambda: job_done(job), seconds=60, what="the job to finish after the restart")
    except AssertionError:
        # Say where it stuck: chunks left, and tasks the broker holds as unacknowledged.
        import redis

        broker = redis.Redis.from_url(TEST_BROKER_URL)
        print(
            "chunks:",
            list(job.chunks.values_list("pk", "status")),
            "unacked:",
            broker.hlen("unacked"),
        )
        raise
    counts = Counter(handler.recipients)
    assert max(counts.values()) == 1, f"sent twice: {[r for r, n in counts.items() if n > 1]}"
    # Every recipient has an outcome, and got at most one email. At most the one send whose
    # SMTP exchange the kill cut off is missing: it counts as ambiguous and is not repeated.
    assert job.processed == 200
    assert len(counts) >= 199
