"""End to end through real Celery worker processes (prefork) on the real Redis broker."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from django.test import Client

from limits.people.unsubscribe import unsubscribe_url
from limits.policy.services import cap_set
from segments.models import Segment
from tests.support.celery_workers import start_celery_worker, stop_celery_worker, worker_env
from tests.support.worker_processes import (
    TEST_BROKER_URL,
    email_job,
    job_counts,
    job_done,
    kill,
    received_once,
    wait_for,
)
from worker.models import SendJob
from worker.processes import processes_list
from worker.services import send_job_create

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_cap_edit_governs_a_running_worker_within_five_seconds(published, start_worker, inbox):
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


def test_an_unsubscribe_governs_a_running_worker_within_seconds(published, start_worker, inbox):
    """The one-click POST is made in this process; the worker's process has its own list in
    memory and must see the change by reading the journal, within its TTL (2 s)."""
    published(vip=(10, [1], {}))
    start_worker()

    def job_for(n: int) -> SendJob:
        job = send_job_create(
            channel="email",
            campaign=f"u{n}",
            template="welcome",
            recipients=[{"user_id": 9, "address": "nine@example.com"}],
        )
        wait_for(lambda: job_done(job), seconds=60, what=f"job {n}")
        return job

    assert job_for(0).reasons == {"allowed": 1}
    link = unsubscribe_url(user_id=9, channel="email")
    clicked = time.monotonic()
    answer = Client().post(urlsplit(link).path, {"List-Unsubscribe": "One-Click"})
    assert answer.status_code == 200
    for n in range(1, 100):
        job = job_for(n)
        if job.reasons == {"suppressed": 1}:
            break
    took = time.monotonic() - clicked
    assert job.reasons == {"suppressed": 1} and (job.sent, job.capped) == (0, 1)
    assert took < 5, f"the unsubscribe took {took:.1f} s to govern"
    # Every job before the one refused sent its email, once.
    assert inbox[0].recipients == ["nine@example.com"] * n


@pytest.mark.postgres
def test_workers_killed_at_several_points_send_nobody_twice_and_every_send_is_counted(
    published, start_worker, inbox, settings
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 40
    published(vip=(10, [1], {}))
    handler = inbox[0]
    addresses, job = email_job("kill", range(1000, 1400))
    # 1. Killed during a message the server never took (it refuses it once released).
    handler.hold(at=60, accept=False)
    worker = start_worker()
    assert handler.holding.wait(60), "the worker never reached the 60th message"
    kill(worker)
    handler.release()
    # 2. Killed after the server took a message, before the worker heard so.
    handler.hold(at=180, accept=True)
    worker = start_worker()
    assert handler.holding.wait(60), "the restarted worker never reached the 180th message"
    kill(worker)
    handler.release()
    # 3. Killed at whatever it was doing when 300 had arrived.
    worker = start_worker()
    wait_for(lambda: len(handler.recipients) >= 300, seconds=60, what="300 sends")
    kill(worker)
    start_worker()
    wait_for(lambda: job_done(job), seconds=90, what="the job to finish after three kills")

    received = received_once(handler)
    counts = job_counts(job)
    assert sum(counts.values()) == job.total == 400 and counts["pending"] == 0, counts
    # The two sends cut off by kills 1 and 2 are ambiguous (the first did not arrive, the
    # second did); kill 3 may have cut off one more.
    assert 2 <= job.ambiguous <= 3, counts
    # Every send the server has is counted as sent or ambiguous; every one it lacks is
    # counted as failed or ambiguous (or refused by the gate).
    assert job.sent <= len(received) <= job.sent + job.ambiguous, counts
    missing = 400 - len(received)
    assert missing <= job.failed + job.ambiguous + job.capped, counts
    assert addresses[59] not in received  # the send of kill 1 never arrived...
    assert addresses[179] in received  # ...and the send of kill 2 did


class DedupingRelay:
    """A push relay that keeps each Idempotency-Key's first delivery and answers a repeat with
    200 without delivering again, as providers with idempotency keys do. `hold_at` stops it
    after taking the n-th push, before answering."""

    def __init__(self) -> None:
        self.delivered: list[str] = []
        self.requests = 0
        self.hold_at: int | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                key = self.headers["Idempotency-Key"]
                relay.requests += 1
                if key not in relay.delivered:
                    relay.delivered.append(key)
                if relay.hold_at is not None and len(relay.delivered) >= relay.hold_at:
                    relay.hold_at = None
                    relay.holding.set()
                    relay.release.wait(30)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/push"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.postgres
def test_a_push_cut_off_by_a_killed_worker_is_sent_again_with_its_key_and_nothing_is_lost(
    published, redis_client, settings
):
    import redis

    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 50
    published(vip=(10, [1], {}))
    relay = DedupingRelay()
    env = worker_env(
        TEST_BROKER_URL,
        GATEKEEPER_PUSH_BACKEND="worker.dispatchers.WebhookPushBackend",  # the earlier setting
        GATEKEEPER_PUSH_WEBHOOK_URL=relay.url,
        CELERY_VISIBILITY_TIMEOUT="5",
        CELERY_UNACKED_RESTORE_INTERVAL="2",
        GATEKEEPER_CHUNK_LEASE_SECONDS="3",
    )
    recipients = [{"user_id": u, "address": f"token-{u}"} for u in range(2000, 2150)]
    job = send_job_create(channel="push", campaign="p", template="welcome", recipients=recipients)
    relay.hold_at = 70
    first = start_celery_worker("sends", env)
    try:
        assert relay.holding.wait(60), "the worker never reached the 70th push"
        kill(first)
        relay.release.set()
        second = start_celery_worker("sends", env)
        try:
            wait_for(lambda: job_done(job), seconds=90, what="the job after the kill")
        finally:
            stop_celery_worker(second)
    finally:
        if first.poll() is None:
            kill(first)
        relay.server.shutdown()
    # The 70th push reached the relay before the kill; the new worker sent it again with the
    # same key, the relay kept one, and the job counts it as sent: nothing ambiguous, no loss.
    assert len(relay.delivered) == len(set(relay.delivered)) == 150
    assert relay.requests == 151
    assert (job.sent, job.ambiguous, job.failed, job.pending) == (150, 0, 0, 0)


@pytest.mark.postgres
def test_a_file_in_parts_is_read_by_both_workers_and_sent_once_each_in_file_order(
    published, start_worker, settings
):
    """A 3 MB file in parts of 1 MiB, two worker processes: each later part read by whichever
    is free, taken in by the job's reading run in file order, every user sent once."""
    import io

    from worker.models import SendJobPart
    from worker.services import send_job_from_file

    published(vip=(10, [1], {}))
    pad = "x" * 40
    lines = [f"{i},token-{i}-{pad}" for i in range(1, 50_001)]
    lines[45_000] = f"7,token-7-again-{pad}"  # user 7 again, in the last part
    data = ("\n".join(lines) + "\n").encode()
    for _ in range(2):
        start_worker(
            GATEKEEPER_DISPATCHERS='{"push": "null"}', GATEKEEPER_SEND_FILE_PART_BYTES=str(2**20)
        )
    job = send_job_from_file(
        fileobj=io.BytesIO(data),
        name="big.csv",
        channel="push",
        campaign="parts",
        template="welcome",
        on_invalid="skip",
    )
    wait_for(lambda: job_done(job), seconds=120, what="the job in parts")
    job.refresh_from_db()
    parts = list(SendJobPart.objects.filter(job=job).order_by("index"))
    assert len(parts) == 2 and {p.status for p in parts} == {"taken"}  # and part 0
    assert (job.total, job.duplicate, job.pending) == (50_000, 1, 0)
    assert job.sent + job.capped == 49_999
