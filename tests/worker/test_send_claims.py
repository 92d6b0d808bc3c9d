"""Send claims (worker/claims.py) on one Redis node and on a Redis Cluster: commands packed by
hand, one burst per node; both answer alike."""

from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from gatekeeper.lib.redis_client import pipelined
from worker.claims import SENDING, SENT, Claim, RunClaims, claim_key, claims_read


def test_a_run_claims_sends_and_settles_them(settings_redis: Any) -> None:
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
    assert 7 * 86400 < settings_redis.ttl(claim_key("push", ids[0])) <= 8 * 86400
    # Another channel's claims are its own.
    assert claims_read("email", ids[:1]) == [None]


def test_take_over_claims_again_for_this_run(settings_redis: Any) -> None:
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


def test_a_run_that_takes_its_own_claim_again_has_it(settings_redis: Any) -> None:
    # As after a connection broke and the claims were sent again: the first sending took them.
    run = RunClaims(channel="push", job_id=4, run="r1")
    assert run.take(["m:1", "m:2"]) == [None, None]
    assert run.take(["m:1", "m:2"]) == [None, None]
    assert RunClaims(channel="push", job_id=4, run="r2").take(["m:1"]) == [
        Claim(state=SENDING, job=4, run="r1")
    ]


def test_commands_are_sent_again_on_a_new_connection_when_theirs_broke(
    redis_client: redis.Redis,
) -> None:
    kwargs = redis_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs["db"])
    assert pipelined(client, [("SET", "test:broken", "1"), ("GET", "test:broken")]) == [b"OK", b"1"]
    (pooled,) = client.connection_pool._available_connections  # the one the pool reuses next
    pooled.send_command("CLIENT", "ID")
    assert redis_client.client_kill_filter(_id=pooled.read_response()) == 1
    # The pool does not know it is gone: the commands meet a closed socket, then go again.
    assert pipelined(client, [("GET", "test:broken")]) == [b"1"]
    client.close()


@pytest.mark.cluster
def test_a_command_for_a_slot_being_moved_follows_the_ask_to_the_importing_node(
    cluster_client: RedisCluster,
) -> None:
    cluster_client.flushall(target_nodes=RedisCluster.PRIMARIES)
    key = "test:asked:{b}"
    slot = cluster_client.keyslot(key)
    source = cluster_client.get_node_from_key(key)
    target = next(n for n in cluster_client.get_primaries() if n.name != source.name)
    source_redis = cluster_client.get_redis_connection(source)
    target_redis = cluster_client.get_redis_connection(target)
    source_id, target_id = source_redis.cluster("myid"), target_redis.cluster("myid")
    target_redis.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source_redis.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    try:
        # The source no longer has keys of the slot it has not moved yet: ASK, to the target.
        assert pipelined(cluster_client, [("SET", key, "1", "NX", "GET")]) == [None]
        assert pipelined(cluster_client, [("GET", key), ("DEL", key)]) == [b"1", 1]
        assert source_redis.cluster("countkeysinslot", slot) == 0
    finally:
        for node in (source_redis, target_redis):
            node.execute_command("CLUSTER SETSLOT", slot, "STABLE")


def test_a_batch_is_settled_and_the_next_claimed_in_one_round_trip(settings_redis: Any) -> None:
    run = RunClaims(channel="push", job_id=6, run="r6")
    assert run.take(["m:1", "m:2"]) == [None, None]
    # The settling comes first: a claim settled as sent is found as such by the taking after it.
    found = run.settle(sent=["m:1"], unsent=["m:2"], take=["m:3", "m:1", "m:2"])
    assert found == [None, Claim(state=SENT, job=6, run=None), None]
    assert claims_read("push", ["m:1", "m:2", "m:3"]) == [
        Claim(state=SENT, job=6, run=None),
        Claim(state=SENDING, job=6, run="r6"),
        Claim(state=SENDING, job=6, run="r6"),
    ]
