"""A preference change made while a real Celery worker runs a 100,000-recipient send job governs
the sends the job has not yet gated: once the change is visible to the worker (committed, plus
GATEKEEPER_SUPPRESSION_TTL_SECONDS), every send of the people who made it is refused with
`preference`; what was gated before went out once; everybody else's sends all go out once."""

import random
import time

import pytest
import redis

from limits.engine.topics import TopicFields
from limits.ledger.drain import ledger_drain_all
from limits.ledger.table import decisions
from limits.people.preferences import preferences_patch
from limits.policy.selectors import policy_cache, topics_read
from limits.policy.services import TOPICS
from tests.support.celery_workers import start_celery_worker, stop_celery_worker, worker_env
from tests.support.dispatch_log import (
    FILE_DISPATCHER,
    dispatched,
    file_dispatch_env,
)
from tests.support.sends import recorded
from tests.support.worker_processes import TEST_BROKER_URL, job_counts, job_done, wait_for
from worker.services import send_job_create

pytestmark = [
    pytest.mark.processes,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

RECIPIENTS = 100_000
USERS = range(1, RECIPIENTS + 1)
# Every hundredth user switches the job's topic off mid-job, in no particular order: spread
# over every chunk, so some were gated before the change and some after it.
CHANGED = random.Random(100).sample(USERS[99::100], k=len(USERS[99::100]))
SENT_BEFORE_CHANGE = 10_000  # the change is made once this many sends went out
# The provider's rate (sends a second): the job lasts at least 10 s however fast the machine,
# well beyond the change and the TTL.
RATE = 10_000


def test_a_topic_switched_off_during_a_running_job_governs_the_sends_not_yet_gated(
    published, redis_client, settings, tmp_path
):
    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    published(vip=(10, [1], {}))
    TOPICS.create(fields=TopicFields(slug="news", name="News", channels=["push"]), via="command")
    policy_cache().invalidate()
    ttl = settings.GATEKEEPER_SUPPRESSION_TTL_SECONDS
    settings.GATEKEEPER_DISPATCHERS = {"push": FILE_DISPATCHER}
    log = tmp_path / "dispatched.txt"
    env = worker_env(
        TEST_BROKER_URL,
        GATEKEEPER_SUPPRESSION_TTL_SECONDS=str(ttl),
        **file_dispatch_env(log, RATE),
    )
    worker = start_celery_worker("sends", env, log=tmp_path / "worker.log")
    asked: dict[int, float] = {}  # when the change of each user was asked for
    visible: dict[int, float] = {}  # by when every process sees it: committed, plus the TTL
    try:
        created = time.time()
        job = send_job_create(
            channel="push",
            campaign="news",
            template="welcome",
            topic="news",
            recipients=[{"user_id": u, "address": f"token-{u}"} for u in USERS],
        )
        chunks = job.chunks.count()
        assert chunks >= 10, "too few chunks for a change to land between them"

        def sent_so_far() -> int:
            job.refresh_from_db()
            return job.sent

        wait_for(lambda: sent_so_far() >= SENT_BEFORE_CHANGE, seconds=90, what="the first sends")
        assert job.pending >= RECIPIENTS // 2, "the job got too far before the change"
        topics = topics_read()
        for user_id in CHANGED:
            asked[user_id] = time.time()
            preferences_patch(
                user_id=user_id,
                changes={"topics": {"news": {"push": False}}},
                topics=topics,
                source="api",
            )
            visible[user_id] = time.time() + ttl
        wait_for(lambda: job_done(job), seconds=120, what="the job to finish")
    finally:
        stop_celery_worker(worker)

    # The job's counts add up: each recipient sent or refused for their preference.
    counts = job_counts(job)
    assert sum(counts.values()) == job.total == RECIPIENTS, counts
    assert counts["sent"] + counts["capped"] == RECIPIENTS, counts
    by_reason = {"allowed": job.sent, "preference": job.capped}
    assert job.reasons == {reason: n for reason, n in by_reason.items() if n}, job.reasons

    # One decision per recipient in the ledger, each with its gate call's time.
    ledger_drain_all(seconds=60)
    rows = decisions().values_list("user_id", "at", "reason", "outcome", "topic", "channel")
    outcome: dict[int, tuple[float, str, str]] = {}
    for user_id, at, reason, sent, topic, channel in rows.iterator(chunk_size=20_000):
        assert user_id not in outcome, f"user {user_id} was decided twice"
        assert (topic, channel) == ("news", "push")
        outcome[user_id] = (at.timestamp(), reason, sent)
    assert sorted(outcome) == list(USERS)

    # What the worker handed over: each admitted send once, nothing else.
    handed = dispatched(log)
    twice = [key for key, n in handed.items() if n > 1]
    assert not twice, f"sent twice: {twice[:10]}"
    sent = {u for u, (_, reason, _) in outcome.items() if reason == "allowed"}
    assert set(handed) == {(u, f"news:{u}") for u in sent}
    assert len(sent) == job.sent
    assert {outcome[u][2] for u in sent} == {"sent"}
    refused = set(USERS) - sent
    assert {outcome[u][1:] for u in refused} <= {("preference", "")}
    # Nobody who said nothing was refused.
    assert refused <= set(CHANGED), sorted(refused - set(CHANGED))[:10]

    # One worker process runs the chunks one after another, so a gate call began after the one
    # before it ended (its time in the ledger is taken once it decided).
    calls = sorted({at for at, _, _ in outcome.values()})
    assert len(calls) == chunks, "a chunk was gated more than once, or two at once"
    began_after = dict(zip(calls, [created, *calls[:-1]], strict=True))
    before, after, meanwhile = [], [], []
    for user_id in CHANGED:
        at = outcome[user_id][0]
        if at < asked[user_id]:
            before.append(user_id)  # decided before the change was asked for
        elif began_after[at] >= visible[user_id]:
            after.append(user_id)  # gated once every process saw it
        else:
            meanwhile.append(user_id)  # within the TTL: either way, once
    split = f"before {len(before)}, within the TTL {len(meanwhile)}, after {len(after)}"
    assert len(before) >= 50 and len(after) >= 100, split
    assert set(before) <= sent, "a send gated before the change was asked for was refused"
    late = sorted(set(after) & sent)
    assert not late, f"{len(late)} sent after their change was visible ({split}): {late[:10]}"
    assert set(after) <= refused

    # The refused sends were charged nothing; those that went out once each.
    for user_id in [*after[:50], *before[:50]]:
        assert recorded(user_id, "push") == (user_id in sent), user_id
