"""Atomicity under concurrent processes, and behaviour when Redis loses its functions or dies."""

import multiprocessing
import threading
from collections import Counter

import pytest
import redis
from redis.cluster import RedisCluster

from limits.limiter import Limiter, Limits, Policy
from tests.redis_servers import RedisServer

NOW = 1_763_800_000.0
USERS = 10
ATTEMPTS = 200
POLICY = Policy(channel=Limits(daily=3, weekly=5), all=Limits())


def _hammer(
    url: str, worker: int, cluster: bool, results: "multiprocessing.Queue[list[int]]"
) -> None:
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    limiter = Limiter(client, prefix="race:")
    admitted: list[int] = []
    for attempt in range(ATTEMPTS):
        user = attempt % USERS
        # Small batches interleave with the other processes' calls.
        (decision,) = limiter.acquire("email", [(user, f"w{worker}-a{attempt}")], POLICY, now=NOW)
        if decision.allowed:
            admitted.append(user)
    results.put(admitted)


@pytest.mark.parametrize("topology", ["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def test_four_processes_never_admit_more_than_the_cap(
    topology: str, request: pytest.FixtureRequest, redis_client: redis.Redis, redis_url: str
) -> None:
    if topology == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
        RedisCluster.from_url(url).flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        url = redis_url
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[list[int]] = ctx.Queue()
    processes = [
        ctx.Process(target=_hammer, args=(url, w, topology == "cluster", results)) for w in range(4)
    ]
    for p in processes:
        p.start()
    admitted: Counter[int] = Counter()
    for _ in processes:
        admitted.update(results.get(timeout=120))
    for p in processes:
        p.join(timeout=30)
    assert admitted == {user: 3 for user in range(USERS)}


def test_it_reloads_its_functions_after_a_flush_between_batches(own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url)
    limiter = Limiter(client)
    policy = Policy(channel=Limits(daily=1), all=Limits())
    assert limiter.acquire("email", [(1, "a")], policy, now=NOW)[0].reason == "allowed"
    client.function_flush()
    decisions = limiter.acquire("email", [(1, "b"), (2, "c")], policy, now=NOW)
    assert [d.reason for d in decisions] == ["daily_cap", "allowed"]


def test_decisions_stay_exact_while_another_client_keeps_flushing_functions(
    own_redis: RedisServer,
) -> None:
    limiter = Limiter(redis.Redis.from_url(own_redis.url))
    flusher = redis.Redis.from_url(own_redis.url)
    stop = threading.Event()

    def flush_repeatedly() -> None:
        # Paced, not a tight loop: a flush every millisecond or so, many per run.
        while not stop.wait(0.001):
            flusher.function_flush()

    thread = threading.Thread(target=flush_repeatedly)
    thread.start()
    flushes_before = flusher.info("commandstats").get("cmdstat_function|flush", {}).get("calls", 0)
    try:
        reasons: Counter[str] = Counter()
        for attempt in range(300):
            decisions = limiter.acquire(
                "email", [(u, f"m{attempt}") for u in range(5)], POLICY, now=NOW
            )
            reasons.update(d.reason for d in decisions)
    finally:
        stop.set()
        thread.join()
    flushes = flusher.info("commandstats").get("cmdstat_function|flush", {}).get("calls", 0)
    assert flushes - flushes_before > 10
    # Each call either ran whole or was resent whole: exactly the cap for every user.
    assert reasons["allowed"] == 5 * 3
    assert reasons["unavailable"] == 0
    assert reasons["daily_cap"] == 5 * 300 - 15


def test_redis_down_gives_unavailable_and_recovers_after_restart(own_redis: RedisServer) -> None:
    limiter = Limiter(
        redis.Redis.from_url(own_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    )
    policy = Policy(channel=Limits(daily=5), all=Limits())
    assert limiter.acquire("email", [(1, "a")], policy, now=NOW)[0].reason == "allowed"

    own_redis.stop()
    down = limiter.acquire("email", [(1, "b"), (2, "c")], policy, now=NOW)
    assert [(d.allowed, d.reason) for d in down] == [(False, "unavailable")] * 2
    assert limiter.peek("email", 1, policy, now=NOW) is None
    assert limiter.release("email", [(1, "a")]) == [False]
    assert limiter.ping() is False

    own_redis.start()  # same port, empty: no data, no functions
    up = limiter.acquire("email", [(1, "d")], policy, now=NOW)
    assert (up[0].allowed, up[0].reason) == (True, "allowed")


def test_fail_open_lets_sends_through_uncounted_when_redis_is_down(own_redis: RedisServer) -> None:
    limiter = Limiter(
        redis.Redis.from_url(own_redis.url, socket_connect_timeout=0.5), fail_open=True
    )
    own_redis.stop()
    decision = limiter.acquire("email", [(1, "a")], Policy(Limits(daily=0), Limits()), now=NOW)[0]
    assert (decision.allowed, decision.reason) == (True, "unavailable")


@pytest.mark.cluster
def test_a_cluster_batch_survives_functions_flushed_on_every_node(
    cluster_client: RedisCluster,
) -> None:
    cluster_client.flushall(target_nodes=RedisCluster.PRIMARIES)
    limiter = Limiter(cluster_client, prefix="flush:")
    policy = Policy(channel=Limits(daily=1), all=Limits())
    users = list(range(500))
    assert {
        d.reason for d in limiter.acquire("email", [(u, "a") for u in users], policy, now=NOW)
    } == {"allowed"}
    for node in cluster_client.get_primaries():
        cluster_client.get_redis_connection(node).function_flush()
    again = limiter.acquire("email", [(u, "b") for u in users], policy, now=NOW)
    assert {d.reason for d in again} == {"daily_cap"}
