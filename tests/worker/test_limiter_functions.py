"""manage.py limiter_functions: the limiter's libraries of every release on every primary, and
dropping those of other releases only once no process of theirs reports (worker/processes.py)."""

import json
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from redis.cluster import RedisCluster

from bench.servers import free_port
from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine.transport import LIMITER_LIBRARY, SOURCE, FunctionLibrary, libraries_loaded
from limits.engine.upkeep import primaries
from worker.processes import process_report, stale_after

OTHER = FunctionLibrary(
    SOURCE.replace("as a Redis Functions library.", "as a Redis Functions library (next).", 1)
)
# Somebody else's library on the same server: never the command's to drop.
THEIRS = "#!lua name=someone_else\nredis.register_function('their_fn', function() return 1 end)"


def _run(*args: str) -> str:
    out = StringIO()
    call_command("limiter_functions", *args, stdout=out)
    return out.getvalue()


def _libraries(client: Any) -> list[set[str]]:
    """Every library's name on each primary."""
    return [{entry[1].decode() for entry in conn.function_list()} for _, conn in primaries(client)]


def _register(client: Any, prefix: str, host: str, functions: str | None) -> None:
    """A process of another host in the registry, as its own report would put it."""
    entry = {"role": "worker", "host": host, "pid": 7, "version": "v1", "seen_at": time.time()}
    if functions is not None:
        entry["functions"] = functions
    client.hset(f"{prefix}processes", f"{host}:7", json.dumps(entry))


@pytest.fixture(
    params=[
        pytest.param("single", marks=pytest.mark.processes),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def client(request: pytest.FixtureRequest, settings: Any) -> Iterator[Any]:
    """The process's Redis: one of the test's own (libraries are a server's, and other suites
    share the machine's), then the run's cluster; each primary holding this release's library,
    another release's, one from before versioned names (the Lua as the file holds it: the names
    such a release registered) and somebody else's."""
    settings.GATEKEEPER_KEY_PREFIX = "test:"
    if request.param == "single":
        own = request.getfixturevalue("own_redis")
        settings.REDIS_URL = own.url
        client: Any = redis.Redis.from_url(own.url)
    else:
        client = request.getfixturevalue("cluster_client")
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
        node = client.get_default_node()
        settings.REDIS_URL = f"redis://{node.host}:{node.port}/0"
        settings.REDIS_CLUSTER = True
    reset_redis_clients()
    for _, conn in primaries(client):
        for text in (LIMITER_LIBRARY.text, OTHER.text, SOURCE, THEIRS):
            conn.function_load(text, replace=True)
    yield client
    reset_redis_clients()
    for _, conn in primaries(client):
        for name in libraries_loaded(conn).keys() - {LIMITER_LIBRARY.name}:
            conn.function_delete(name)
        conn.function_delete("someone_else")


def test_other_releases_libraries_are_dropped_once_no_process_of_theirs_reports(
    client: Any, settings: Any
) -> None:
    everything = {LIMITER_LIBRARY.name, OTHER.name, "gatekeeper_limiter", "someone_else"}
    nodes = len(primaries(client))
    listed = _run()
    assert f"{OTHER.name}, 10 functions (another release)" in listed
    assert "gatekeeper_limiter, 10 functions (a release before versioned names)" in listed
    assert f"{LIMITER_LIBRARY.name}, 10 functions (this release)" in listed
    assert "someone_else" not in listed
    assert f"{2 * nodes} libraries of other releases: --drop-others deletes them" in listed
    assert _libraries(client) == [everything] * nodes  # listing changes nothing

    # A process of this release, and one of the other: the drop is refused.
    process_report(role="web", status={"version": "v1"})
    _register(client, "test:", "old-host", OTHER.version)
    with pytest.raises(
        CommandError, match=f"worker on old-host \\(pid 7\\): functions {OTHER.version}"
    ):
        _run("--drop-others")
    assert _libraries(client) == [everything] * nodes

    # The other release's process has gone quiet: the drop goes ahead, and only the others go.
    gone = time.time() - stale_after() - 1
    entry = json.loads(client.hget("test:processes", "old-host:7"))
    client.hset("test:processes", "old-host:7", json.dumps({**entry, "seen_at": gone}))
    dropped = _run("--drop-others")
    assert f"dropped {OTHER.name}" in dropped
    assert f"Dropped {2 * nodes} libraries of other releases on {nodes} node" in dropped
    assert f"{LIMITER_LIBRARY.name} stays." in dropped
    assert _libraries(client) == [{LIMITER_LIBRARY.name, "someone_else"}] * nodes
    assert "No library of another release is loaded." in _run("--drop-others")


def test_a_process_from_before_versioned_names_refuses_the_drop_unless_forced(
    client: Any,
) -> None:
    _register(client, "test:", "older-host", None)
    with pytest.raises(CommandError, match=r"a release before versioned names.*--force"):
        _run("--drop-others")
    assert all("gatekeeper_limiter" in names for names in _libraries(client))
    with pytest.raises(CommandError, match="--force goes with --drop-others"):
        _run("--force")
    forced = _run("--drop-others", "--force")
    assert "dropped gatekeeper_limiter\n" in forced
    assert _libraries(client) == [{LIMITER_LIBRARY.name, "someone_else"}] * len(primaries(client))


def test_redis_down_is_a_clear_error(settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    reset_redis_clients()
    try:
        with pytest.raises(CommandError, match="Redis failed \\(ConnectionError"):
            _run("--drop-others")
    finally:
        reset_redis_clients()
