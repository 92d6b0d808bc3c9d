"""The process registry behind the dashboard's "which process runs which version"."""

import json
import os
from datetime import UTC, datetime, timedelta

from limits.engine.transport import LIMITER_LIBRARY
from worker.processes import process_report, processes_by_version, processes_list, stale_after


def test_a_process_reports_its_version_and_quiet_ones_are_forgotten(redis_client, settings):
    settings.GATEKEEPER_SNAPSHOT_POLL_SECONDS = 5
    key = f"{settings.GATEKEEPER_KEY_PREFIX}processes"
    redis_client.hset(
        key,
        "gone-host:1",
        json.dumps({"role": "web", "host": "gone-host", "pid": 1, "version": "v0", "seen_at": 0}),
    )
    redis_client.hset(key, "garbage", "not json")
    seen = datetime(2026, 6, 1, 9, tzinfo=UTC)
    quiet_for = timedelta(seconds=stale_after())
    process_report(role="worker", status={"version": "v1", "source": "store"}, now=seen)
    listed = processes_list(now=seen + quiet_for - timedelta(seconds=1))
    assert [(p["role"], p["pid"], p["version"]) for p in listed] == [("worker", os.getpid(), "v1")]
    assert listed[0]["functions"] == LIMITER_LIBRARY.version  # the library it calls
    assert redis_client.hkeys(key) == [f"{listed[0]['host']}:{os.getpid()}".encode()]
    assert list(processes_by_version(now=seen)) == ["v1"]
    assert processes_list(now=seen + quiet_for + timedelta(seconds=1)) == []
    assert redis_client.hlen(key) == 0


def test_reporting_without_redis_does_not_raise(settings):
    from bench.servers import free_port
    from gatekeeper.lib.redis_client import reset_redis_clients

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    reset_redis_clients()
    process_report(role="web", status={"version": "v1"})
