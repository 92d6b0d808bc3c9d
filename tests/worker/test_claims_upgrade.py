"""An upgrade from per-message send claims in the middle of a running job: a worker of the
previous release (run from git) is killed midway, and this version's worker finishes the job
by reading what that one left (worker/claims.py, "Upgrading from per-message claims")."""

import pytest

from tests.support.celery_workers import release_tree_or_skip
from tests.support.worker_processes import (
    email_job,
    job_counts,
    job_done,
    kill,
    received_once,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The last release that claimed each send in a Redis string of its own.
PREVIOUS_RELEASE = "9fc164eb43aabca04970582e4948ce00cf288b94"


@pytest.fixture
def previous_release(tmp_path_factory):
    return release_tree_or_skip(PREVIOUS_RELEASE, tmp_path_factory)


def test_a_job_the_previous_release_left_midway_is_finished_without_a_loss_or_a_double(
    published, start_worker, inbox, settings, previous_release, own_redis
):
    # A Redis server of the test's own: the previous release loads its library of functions,
    # which is the server's, not a database's, over this version's; on the shared server it
    # would answer the calls of any suite running beside this one with the previous release's
    # functions.
    settings.REDIS_URL = own_redis.url
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 40
    published(vip=(10, [1], {}))
    handler = inbox[0]
    addresses, job = email_job("upgrade", range(2000, 2200))
    # The previous release's worker, killed after the server took the 60th message and before
    # it heard so: its second chunk is charged in the logs (entries naming no job), claimed
    # in its per-message strings, 19 of them sent and the 60th cut off.
    handler.hold(at=60, accept=True)
    old = start_worker(root=previous_release, redis_url=own_redis.url)
    try:
        assert handler.holding.wait(90), "the previous release's worker never reached the 60th"
    finally:
        kill(old)
    handler.release()
    # This version's worker takes the job over and finishes it.
    start_worker(redis_url=own_redis.url)
    wait_for(lambda: job_done(job), seconds=120, what="the job to finish after the upgrade")

    received = received_once(handler)
    assert len(received) == 200  # nothing lost
    counts = job_counts(job)
    # The 60th went out but nobody heard so: ambiguous, not sent again; the rest sent once.
    assert (job.sent, job.ambiguous, job.pending) == (199, 1, 0), counts
    assert addresses[59] in received
