"""A worker told to stop (worker/stopping.py): SIGTERM to its main process, as systemd with
KillMode=mixed and Kubernetes send it, in the middle of a chunk. It finishes the send in
flight, hands the chunk back and exits; another worker finishes the job at once, not when a
lease runs out: nothing lost, nothing twice, nothing ambiguous."""

import os
import signal

import pytest

from tests.support.worker_processes import email_job, job_counts, job_done, received_once, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Long enough that a chunk not handed back would outlast the test's wait for the job.
LEASE = {"GATEKEEPER_CHUNK_LEASE_SECONDS": "600"}


def test_a_stopped_worker_hands_its_chunk_back_and_another_finishes_the_job(
    published, start_worker, inbox
):
    published(vip=(10, [1], {}))
    handler = inbox[0]
    addresses, job = email_job("stop", range(3000, 3300))  # one chunk of 300
    # The worker is told to stop while the server holds its 40th message.
    handler.hold(at=40, accept=True)
    first = start_worker(**LEASE)
    assert handler.holding.wait(90), "the worker never reached the 40th message"
    os.kill(first.pid, signal.SIGTERM)  # its main process only
    handler.release()
    # The 40th answered, the chunk handed back: it ends long before the 300th (without the
    # stop, Celery's warm shutdown would have waited for the whole chunk).
    first.wait(timeout=30)
    assert first.returncode == 0
    stopped_at = len(handler.recipients)
    assert 40 <= stopped_at < 300

    start_worker(**LEASE)
    wait_for(lambda: job_done(job), seconds=120, what="another worker to finish the job")
    received = received_once(handler)  # each address once
    assert len(received) == 300 and set(received) == set(addresses)
    counts = job_counts(job)
    assert (job.sent, job.ambiguous, job.pending) == (300, 0, 0), counts
