"""Send claims (worker/claims.py) on one Redis node and on a Redis Cluster: one node gets its
commands packed by hand, a cluster through its pipeline; both answer alike."""

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from gatekeeper.lib.redis_client import get_redis, pipelined, reset_redis_clients
from worker.claims import SENDING, SENT, Claim, RunClaims, claim_key, claims_read


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def claims_redis(
    request: pytest.FixtureRequest, redis_client: redis.Redis, settings: Any
) -> Iterator[Any]:
    """Settings pointing at the test's Redis, then at a 3-master cluster."""
    if request.param == "cluster":
        cluster: RedisCluster = request.getfixturevalue("cluster_client")
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        node = cluster.get_default_node()
        settings.REDIS_URL = f"redis://{node.host}:{node.port}/0"
        settings.REDIS_CLUSTER = True
    settings.GATEKEEPER_KEY_PREFIX = "test:"
    reset_redis_clients()
    yield get_redis()
    reset_redis_clients()


def test_a_run_claims_sends_and_settles_them(claims_redis: Any) -> None:
    ids = [f"spring:{user}" for user in range(200)]  # spread over every node of a cluster
    first = RunClaims(channel="push", job_id=7, run="a1")
    assert first.take(ids) == [None] * len(ids)
    # A second run of the same job finds the first one's claims, with its run.
    second = RunClaims(channel="push", job_id=7, run="b2")
    assert second.take(ids[:3]) == [Claim(state=SENDING, job=7, run="a1")] * 3
    first.settle(sent=ids[:150], unsent=ids[150:])
    found = claims_read("push", ids)
    assert found[:150] == [Claim(state=SENT, job=7, run=None)] * 150
    assert found[150:] == [None] * 50
    # Another job finds them sent by job 7; the unsent ones are free again.
    other = RunClaims(channel="push", job_id=8, run="c3")
    assert other.take([ids[0], ids[199]]) == [Claim(state=SENT, job=7, run=None), None]
    # Claims expire (longer than the week the limiter remembers a message id for).
    assert 7 * 86400 < claims_redis.ttl(claim_key("push", ids[0])) <= 8 * 86400
    # Another channel's claims are its own.
    assert claims_read("email", ids[:1]) == [None]


def test_take_over_claims_again_for_this_run(claims_redis: Any) -> None:
    RunClaims(channel="email", job_id=3, run="dead").take(["m:1"])
    RunClaims(channel="email", job_id=3, run="live").take_over(["m:1"])
    assert claims_read("email", ["m:1"]) == [Claim(state=SENDING, job=3, run="live")]


def test_packed_commands_answer_as_redis_does_and_raise_after_reading(
    redis_client: redis.Redis,
) -> None:
    key = "test:packed"
    redis_client.delete(key)
    assert pipelined(redis_client, []) == []
    assert pipelined(redis_client, [("SET", key, "a", "NX", "GET"), ("GET", key)]) == [None, b"a"]
    with pytest.raises(redis.exceptions.ResponseError):
        pipelined(redis_client, [("INCR", key), ("SET", key, "b")])
    # Every reply was read: the connection goes on answering in order, and the command after
    # the error ran.
    assert pipelined(redis_client, [("GET", key), ("DEL", key)]) == [b"b", 1]


@pytest.mark.cluster
def test_a_command_sent_to_a_node_that_lost_its_slot_is_sent_again_to_the_new_one(
    cluster_client: RedisCluster,
) -> None:
    cluster_client.flushall(target_nodes=RedisCluster.PRIMARIES)
    node = cluster_client.get_default_node()
    client = RedisCluster(host=node.host, port=node.port)  # a client of its own, to confuse
    key = "test:moved:{a}"
    slot = client.keyslot(key)
    owner = client.get_node_from_key(key)
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    # The client's map is out of date (as after a resharding): the slot's commands go to a
    # node that answers MOVED, having run nothing.
    client.nodes_manager.slots_cache[slot] = [other]
    assert pipelined(client, [("SET", key, "1", "NX", "GET"), ("GET", key)]) == [None, b"1"]
    assert client.get_node_from_key(key).name == owner.name  # the map was read again
    assert cluster_client.get(key) == b"1"  # set once
    client.close()
