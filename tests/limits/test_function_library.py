"""Two releases' function libraries side by side, on one Redis and on every node of a cluster
(limits/engine/transport.py, `FunctionLibrary`): each release calls its own, neither's load
replaces the other's, and a library that went missing is loaded again."""

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from limits.engine.limiter import Limiter
from limits.engine.transport import (
    LIMITER_LIBRARY,
    SOURCE,
    FunctionLibrary,
    libraries_loaded,
)
from limits.engine.upkeep import primaries
from tests.limits.rulesets import caps, ms

NOW = 1_763_800_000.0
FUNCTIONS = (
    "gk_acquire",
    "gk_decide",
    "gk_decide_each",
    "gk_import",
    "gk_release",
    "gk_restore",
    "gk_run",
    "gk_sweep",
    "gk_group",
    "gk_usage",
)
# Another release: the same Lua but for one comment, so another version.
OTHER = FunctionLibrary(
    SOURCE.replace("as a Redis Functions library.", "as a Redis Functions library (next).", 1)
)
USERS = list(range(0, 30 * 300, 300))  # 30 buckets: on every node of a cluster


def _loads(client: Any) -> int:
    """FUNCTION LOAD commands the server (every primary of a cluster) has run."""
    return sum(
        conn.info("commandstats").get("cmdstat_function|load", {}).get("calls", 0)
        for _, conn in primaries(client)
    )


def _names(*libraries: FunctionLibrary) -> dict[str, list[str]]:
    """What FUNCTION LIST shows of these releases' libraries: each name and function's with
    the release's version."""
    return {
        f"gatekeeper_limiter_{library.version}": sorted(f"{f}_{library.version}" for f in FUNCTIONS)
        for library in libraries
    }


def _reasons(limiter: Limiter, message: str, rules: Any) -> set[str]:
    decisions = limiter.acquire("email", [(u, message) for u in USERS], rules, now_ms=ms(NOW))
    return {d.reason for d in decisions}


@pytest.fixture(
    params=[
        pytest.param("single", marks=pytest.mark.processes),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A Redis server of the test's own (libraries are a server's, and other suites share the
    machine's), then the run's cluster, left with this release's library alone."""
    if request.param == "single":
        own = request.getfixturevalue("own_redis")
        single = redis.Redis.from_url(own.url)
        yield single
        single.close()
        return
    cluster: RedisCluster = request.getfixturevalue("cluster_client")
    cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield cluster
    for _, conn in primaries(cluster):
        if OTHER.name in libraries_loaded(conn):
            conn.function_delete(OTHER.name)


def test_the_version_is_the_lua_texts_and_every_name_carries_it() -> None:
    assert FunctionLibrary(SOURCE).version == LIMITER_LIBRARY.version  # same text, same names
    assert OTHER.version != LIMITER_LIBRARY.version
    assert LIMITER_LIBRARY.name == f"gatekeeper_limiter_{LIMITER_LIBRARY.version}"
    assert LIMITER_LIBRARY.text.startswith(f"#!lua name={LIMITER_LIBRARY.name}\n")
    assert LIMITER_LIBRARY.function("gk_decide") == f"gk_decide_{LIMITER_LIBRARY.version}"
    with pytest.raises(ValueError, match="suffix once"):
        FunctionLibrary(SOURCE.replace("local SUFFIX = ''", "local SUFFIX = '_x'"))


def test_two_releases_libraries_answer_side_by_side_and_neither_replaces_the_other(
    client: Any,
) -> None:
    old, new = Limiter(client, library=OTHER), Limiter(client)
    rules = caps(daily=2)
    # The two releases take turns over the same logs, each counting the other's sends.
    assert _reasons(old, "a", rules) == {"allowed"}
    assert _reasons(new, "b", rules) == {"allowed"}
    loaded = _loads(client)
    assert _reasons(old, "c", rules) == {"daily_cap"}
    assert new.release("email", [(u, "a") for u in USERS]) == [True] * len(USERS)
    assert _reasons(old, "c", rules) == {"allowed"}
    assert _reasons(new, "d", rules) == {"daily_cap"}
    # No call of either found its functions missing: nothing was loaded again.
    assert _loads(client) == loaded
    for _, conn in primaries(client):
        assert libraries_loaded(conn) == _names(LIMITER_LIBRARY, OTHER)
        usage = conn.function_list(library=LIMITER_LIBRARY.name)[0][5]
        flags = {f[1].decode(): f[5] for f in usage}
        assert flags[LIMITER_LIBRARY.function("gk_usage")] == [b"no-writes"]
    # A new process of this release loads the same library again (REPLACE, the same text):
    # the other release's stays, and its calls still need no load.
    assert _reasons(Limiter(client), "e", rules) == {"daily_cap"}
    reloaded = _loads(client)
    assert reloaded > loaded
    assert _reasons(old, "e", rules) == {"daily_cap"}
    assert _loads(client) == reloaded
    for _, conn in primaries(client):
        assert libraries_loaded(conn) == _names(LIMITER_LIBRARY, OTHER)


def test_a_library_gone_missing_is_loaded_again_and_the_other_release_keeps_its_own(
    client: Any,
) -> None:
    old, new = Limiter(client, library=OTHER), Limiter(client)
    rules = caps(daily=1)
    assert _reasons(new, "a", rules) == {"allowed"}
    assert _reasons(old, "b", rules) == {"daily_cap"}
    # As after a failover to a replica that lacks it: this release's library is gone.
    for _, conn in primaries(client):
        conn.function_delete(LIMITER_LIBRARY.name)
    loaded = _loads(client)
    assert _reasons(new, "c", rules) == {"daily_cap"}  # ran, on the logs as they were
    assert _loads(client) > loaded
    loaded = _loads(client)
    assert _reasons(old, "d", rules) == {"daily_cap"}
    assert _loads(client) == loaded  # the other release's library was never touched
    for _, conn in primaries(client):
        assert libraries_loaded(conn) == _names(LIMITER_LIBRARY, OTHER)
