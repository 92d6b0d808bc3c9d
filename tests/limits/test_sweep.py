"""The sweep of aged-out send logs, on one node and on a 3-master cluster: users whose newest
send has left the retention are dropped from their buckets, a bucket left empty goes, and each
run continues the walk where the last one stopped."""

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from redis.cluster import RedisCluster

from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine import log
from limits.engine.limiter import Limiter, get_limiter, reset_limiter
from limits.engine.upkeep import logs_sweep, primaries, sweep_cursors_key
from limits.policy.selectors import policy_read
from limits.tasks import send_logs_sweep
from tests.limits.rulesets import caps, ms
from tests.support.redis import PREFIX

NOW = 1_763_800_000.0  # seconds (as retry_after reads); the engine is given ms(NOW)
DAY = 86_400.0
RETENTION_MS = 8 * 86_400_000


def record(limiter: Limiter, user: int, at: float) -> None:
    assert limiter.acquire("email", [(user, f"m-{user}-{at}")], caps(), now_ms=ms(at))[0].allowed


def group(user: int) -> str:
    return log.group_key(PREFIX, user)


def test_it_drops_users_whose_log_has_aged_out_and_keeps_the_others(limiter: Limiter) -> None:
    record(limiter, 1, NOW - 10 * DAY)  # quiet, sharing a bucket with a recent user
    record(limiter, 2, NOW - 10 * DAY)
    record(limiter, 2, NOW - DAY)  # the newest entry decides
    record(limiter, 256, NOW - 9 * DAY)  # two groups of quiet users only
    record(limiter, 300, NOW - 8 * DAY - 1)
    record(limiter, 70_000, NOW - 7 * DAY)  # inside the retention
    report = logs_sweep(limiter, buckets=100, retention_ms=RETENTION_MS, now_ms=ms(NOW))
    assert (report.dropped, report.emptied) == (3, 2)
    assert report.buckets >= 3
    assert limiter.entries(1) == []
    assert limiter.entries(2) != []
    assert len(limiter.entries(70_000)) == 1
    assert not limiter.client.exists(group(256)) and not limiter.client.exists(group(300))
    assert limiter.client.exists(group(1))
    # Their bucket, which says it has groups, expires with the last of them.
    bucket = log.bucket_key(PREFIX, 256)
    assert limiter.client.hkeys(bucket) == [log.EXPIRY_FIELD]
    # Every node's walk came to its end: the next run starts it over.
    assert report.passes == len(primaries(limiter.client))


def test_a_second_sweep_finds_nothing_more(limiter: Limiter) -> None:
    record(limiter, 1, NOW - 10 * DAY)
    record(limiter, 2, NOW - DAY)
    assert logs_sweep(limiter, buckets=100, retention_ms=RETENTION_MS, now_ms=ms(NOW)).dropped == 1
    again = logs_sweep(limiter, buckets=100, retention_ms=RETENTION_MS, now_ms=ms(NOW))
    assert (again.dropped, again.emptied) == (0, 0)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch, limiter: Limiter) -> list[tuple[str, int]]:
    """Every SCAN call on each primary as (node, cursor): the real calls, recorded."""
    calls: list[tuple[str, int]] = []
    for name, conn in primaries(limiter.client):

        def recording(
            cursor: int = 0, *args: Any, real: Any = conn.scan, node: str = name, **kwargs: Any
        ) -> Any:
            calls.append((node, int(cursor)))
            return real(cursor, *args, **kwargs)

        monkeypatch.setattr(conn, "scan", recording)
    return calls


def test_each_run_looks_at_a_few_buckets_and_the_next_continues(
    limiter: Limiter, scans: list[tuple[str, int]]
) -> None:
    users = [256 * k for k in range(60)]
    # Five users sent to recently, each in a bucket of their own: whichever 6 buckets the first
    # run meets first (a cluster's nodes come in any order), one at least is a quiet user's.
    for user in users:
        record(limiter, user, NOW - (10 if user % 3072 else 1) * DAY)
    quiet = [user for user in users if user % 3072]

    first = logs_sweep(limiter, buckets=6, retention_ms=RETENTION_MS, now_ms=ms(NOW), page=2)
    assert 0 < first.buckets < len(users)
    assert 0 < first.dropped < len(quiet)
    saved = {
        node.decode(): int(cursor)
        for node, cursor in limiter.client.hgetall(sweep_cursors_key(PREFIX)).items()
    }
    assert any(saved.values())

    scans.clear()
    runs, dropped = 1, first.dropped
    while dropped < len(quiet):
        report = logs_sweep(limiter, buckets=6, retention_ms=RETENTION_MS, now_ms=ms(NOW), page=2)
        assert report.buckets <= 2 * 6  # about the budget: SCAN's COUNT is a hint
        dropped += report.dropped
        runs += 1
        assert runs < len(users)
    # The second run started each node's walk where the first left it.
    first_calls: dict[str, int] = {}
    for node, cursor in scans:
        first_calls.setdefault(node, cursor)
    assert first_calls == {node: saved.get(node, 0) for node in first_calls}
    assert dropped == len(quiet)
    assert all(limiter.entries(user) == [] for user in quiet)
    assert all(len(limiter.entries(user)) == 1 for user in users if user not in quiet)


@pytest.fixture
def configured(limiter: Limiter, settings: Any) -> Iterator[Limiter]:
    """Settings pointing at the test's Redis (a cluster where the limiter's client is one)."""
    client = limiter.client
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        settings.REDIS_URL = f"redis://{node.host}:{node.port}/0"
        settings.REDIS_CLUSTER = True
    settings.GATEKEEPER_KEY_PREFIX = PREFIX
    settings.GATEKEEPER_LOG_SWEEP_BUCKETS = 1000
    reset_redis_clients()
    reset_limiter()
    yield get_limiter()
    reset_redis_clients()
    reset_limiter()


@pytest.mark.django_db
def test_the_task_sweeps_with_the_rules_retention(configured: Limiter) -> None:
    now = time.time()  # the task runs on the server's clock
    retention = policy_read().retention_ms / 1000
    record(configured, 1, now - retention - DAY)
    record(configured, 2, now - retention + DAY)
    assert send_logs_sweep() == 1
    assert configured.entries(1) == []
    assert len(configured.entries(2)) == 1


def test_beat_queues_the_sweep() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["send-logs-sweep"]
    assert entry["task"] == send_logs_sweep.name
