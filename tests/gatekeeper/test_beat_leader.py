"""No single beat (gatekeeper/beat.py): the lease itself on real Redis, then two real beat
processes, of which one sends the periodic tasks; killed, the other takes the lead."""

import base64
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from django.conf import settings

from gatekeeper.beat import Lease, lease_key
from tests.conftest import TEST_REDIS_URL
from tests.support.celery_workers import start_celery_beat, stop_celery_worker, worker_env
from tests.support.worker_processes import TEST_BROKER_URL, wait_for


def test_one_process_holds_the_lease_and_hands_it_over(redis_client: redis.Redis) -> None:
    redis_client.delete(lease_key())
    first, second = Lease(seconds=15), Lease(seconds=15)
    assert first.hold() and not second.hold()
    assert first.hold() and not second.hold()  # renewed, still the first's
    ttl = redis_client.pttl(lease_key())
    assert 14_000 < ttl <= 15_000
    # A leader that stops hands over at once; one that dies, when its lease ends (here: now).
    first.release()
    assert second.hold() and not first.hold()
    redis_client.delete(lease_key())
    assert first.hold() and not second.hold()
    assert not second.held and first.held


def test_a_process_that_cannot_reach_redis_does_not_lead(settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    from gatekeeper.lib.redis_client import reset_redis_clients

    reset_redis_clients()
    try:
        assert Lease(seconds=15).hold() is False
    finally:
        settings.REDIS_URL = TEST_REDIS_URL
        reset_redis_clients()


# --- two real beat processes ------------------------------------------------------------------

PREFIX = "beattest:"


def origins(broker: redis.Redis, queue: str) -> set[str]:
    """The processes (Celery's `gen<pid>@<host>`) that sent the messages waiting in `queue`."""
    found = set()
    for raw in broker.lrange(queue, 0, -1):
        message = json.loads(raw)
        found.add(message["headers"]["origin"])
        assert json.loads(base64.b64decode(message["body"]))  # a whole task message
    return found


def leader_pid(data: redis.Redis) -> int | None:
    token = cast(bytes | None, data.get(f"{PREFIX}beat:leader"))
    return int(token.split(b":")[1]) if token else None


@pytest.fixture
def beats(tmp_path: Path) -> Iterator[list[subprocess.Popen[Any]]]:
    broker = redis.Redis.from_url(TEST_BROKER_URL)
    broker.flushdb()
    env = worker_env(
        TEST_BROKER_URL, GATEKEEPER_KEY_PREFIX=PREFIX, GATEKEEPER_BEAT_LOCK_SECONDS="3"
    )
    started = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        started.append(start_celery_beat(env, tmp_path / name))
    yield started
    for process in started:
        stop_celery_worker(process)


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_one_beat_sends_the_tasks_and_another_takes_over_when_it_is_killed(beats) -> None:
    broker = redis.Redis.from_url(TEST_BROKER_URL)
    data = redis.Redis.from_url(TEST_REDIS_URL)
    data.delete(f"{PREFIX}beat:leader")
    pids = {process.pid for process in beats}
    wait_for(lambda: leader_pid(data) in pids, seconds=60, what="a beat to take the lead")
    first = leader_pid(data)
    # The drain is due every 2 s and the webhooks' dispatch every second: several messages.
    wait_for(lambda: broker.llen(settings.UPKEEP_QUEUE) >= 5, seconds=60, what="upkeep tasks")
    host = os.uname().nodename
    assert origins(broker, settings.UPKEEP_QUEUE) == {f"gen{first}@{host}"}

    leader = next(process for process in beats if process.pid == first)
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(timeout=10)
    killed_at = time.monotonic()
    wait_for(lambda: leader_pid(data) not in (None, first), seconds=30, what="the other to lead")
    # The lease (3 s) ended and the other, trying every second, took it: well within 30 s.
    assert time.monotonic() - killed_at < 30
    second = leader_pid(data)
    assert second in pids - {first}
    broker.delete(settings.UPKEEP_QUEUE)
    wait_for(lambda: broker.llen(settings.UPKEEP_QUEUE) >= 3, seconds=30, what="its tasks")
    assert origins(broker, settings.UPKEEP_QUEUE) == {f"gen{second}@{host}"}

    # Stopped on purpose (SIGTERM, as systemd does), a leader hands the lease back at once.
    survivor = next(process for process in beats if process.pid == second)
    os.killpg(survivor.pid, signal.SIGTERM)
    survivor.wait(timeout=30)
    assert data.get(f"{PREFIX}beat:leader") is None


# The periodic tasks that may run long: on the upkeep worker they would hold the drain up.
LONG = {
    "limits.tasks.ledger_upkeep",
    "limits.tasks.users_erase_due",
    "worker.tasks.dead_addresses_report_due",
    "worker.tasks.plan_refresh_due",
    "worker.tasks.rounds_decide_due",
}


def test_the_periodic_tasks_run_on_a_queue_of_their_own_but_the_long_ones() -> None:
    from gatekeeper.celery import app

    def queue(name: str) -> str:
        return str(app.amqp.router.route({}, name, (), {})["queue"].name)

    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        name = str(entry["task"])
        expected = settings.CELERY_TASK_DEFAULT_QUEUE if name in LONG else settings.UPKEEP_QUEUE
        assert queue(name) == expected, name
    # What they start goes where it always went.
    assert queue("worker.tasks.send_chunk") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue("limits.tasks.webhook_run") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert queue("segments.tasks.build_snapshot") == "builds"
