"""Send claims (worker/claims.py) on one Redis node and on a Redis Cluster: the gate's entries and
their holders, chunk records, the previous version's claims, and commands packed by hand, one
burst per node; both answer alike."""

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from gatekeeper.lib.redis_client import pipelined
from limits.engine.limiter import get_limiter
from worker.claims import (
    NOT_SENT,
    SENDING,
    SENDING_STATE,
    SENT,
    SENT_STATE,
    ChunkRecord,
    Claim,
    RunLost,
    claim_key,
    made_ms,
    old_claims_read,
    record_key,
    record_read,
)
from worker.gate import Gate


class Everyone:
    """Every user in the default segment (the snapshot's own tests load real ones)."""

    version = "test"

    def resolve_many(self, ids: Any) -> list[str]:
        return ["default"] * len(ids)


def made_chunk(pk: int) -> Any:
    """What names a chunk's record: its id and when it was made."""
    return SimpleNamespace(pk=pk, created_at=datetime(2026, 11, 27, tzinfo=UTC))


def gate() -> Gate:
    return Gate(index=Everyone(), record_ledger=False, record_stats=False)


@pytest.mark.django_db
def test_the_gate_claims_sends_for_a_job_and_names_the_holder_of_a_duplicate(
    settings_redis: Any,
) -> None:
    requests = [(user, f"spring:{user}") for user in range(200)]  # every node of a cluster
    first = gate().check(channel="push", requests=requests, campaign="spring", job=7)
    assert {d.reason for d in first} == {"allowed"}
    # Another run of the same job, another job, the REST gate: each told who holds the send.
    for job in (7, 8, None):
        again = gate().check(channel="push", requests=requests[:3], campaign="spring", job=job)
        assert [(d.reason, d.holder) for d in again] == [("duplicate", 7)] * 3
    assert gate().holders(channel="push", requests=[requests[0], (0, "other")]) == [7, None]
    # Given back by its job only.
    assert gate().release(channel="push", requests=requests[:1], job=8) == [False]
    assert gate().release(channel="push", requests=requests[:1], job=7) == [True]
    assert gate().holders(channel="push", requests=requests[:1]) == [None]
    # Another channel's sends are its own.
    assert gate().holders(channel="email", requests=requests[1:2]) == [None]


@pytest.mark.django_db
def test_a_jobs_transactional_sends_are_claimed_and_never_counted(settings_redis: Any) -> None:
    requests = [(1, "receipt:1"), (2, "receipt:2")]
    first = gate().check(channel="email", requests=requests, category="transactional", job=5)
    assert [(d.reason, d.holder) for d in first] == [("exempt", None)] * 2
    again = gate().check(channel="email", requests=requests, category="transactional", job=6)
    assert [(d.reason, d.holder) for d in again] == [("duplicate", 5)] * 2
    # A marketing send under the same message id is a duplicate too; nothing was counted.
    marketing = gate().check(channel="email", requests=requests[:1], job=9)
    assert [(d.reason, d.holder, d.counts) for d in marketing] == [
        ("duplicate", 5, {"daily": 0, "weekly": 0})
    ]
    assert get_limiter().entries(1) == []
    # The REST gate's transactional answer records nothing.
    exempt = gate().check(channel="email", requests=[(3, "r:3")], category="transactional")
    assert [d.reason for d in exempt] == ["exempt"]
    assert gate().holders(channel="email", requests=[(3, "r:3")]) == [None]


def test_a_chunk_record_keeps_how_far_each_send_got_for_the_run_that_holds_it(
    settings_redis: Any,
) -> None:
    chunk, other = made_chunk(41), made_chunk(42)
    first = ChunkRecord(chunk, "a" * 16)
    assert first.take() == b""
    first.mark([(0, SENDING_STATE), (1, SENDING_STATE), (2, SENDING_STATE), (7, SENT_STATE)])
    first.mark([(0, SENT_STATE), (1, NOT_SENT)])
    assert record_read(chunk) == bytes([2, 0, 1, 0, 0, 0, 0, 2])
    # A second run takes it over: the first one's marks are refused, nothing written.
    second = ChunkRecord(chunk, "b" * 16)
    assert second.take() == bytes([2, 0, 1, 0, 0, 0, 0, 2])
    with pytest.raises(RunLost):
        first.mark([(2, SENT_STATE)])
    second.mark([(2, SENT_STATE)] + [(p, SENT_STATE) for p in range(8, 70008)])
    states = record_read(chunk)
    assert (states[:3], len(states), set(states[8:])) == (bytes([2, 0, 2]), 70008, {2})
    assert 7 * 86400 < settings_redis.ttl(record_key(41, made_ms(chunk))) <= 8 * 86400
    assert record_read(other) == b""


def test_the_previous_versions_claims_are_read(settings_redis: Any) -> None:
    pipelined(
        settings_redis,
        [
            ("SET", claim_key("push", "m:1"), "sent:7"),
            ("SET", claim_key("push", "m:2"), "sending:7:dead"),
            ("SET", claim_key("push", "m:3"), "sending"),
        ],
    )
    assert old_claims_read("push", ["m:1", "m:2", "m:3", "m:4"]) == [
        Claim(state=SENT, job=7, run=None),
        Claim(state=SENDING, job=7, run="dead"),
        Claim(state=SENDING, job=None, run=None),
        None,
    ]


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


@pytest.mark.django_db
def test_a_chunk_run_again_sends_and_charges_each_recipient_once_on_a_node_and_a_cluster(
    settings_redis: Any, campaign: Any, settings: Any
) -> None:
    from tests.support.sends import earlier_run, make_job, recorded
    from worker.chunks import send_chunk_run
    from worker.delivery.local import MemoryDispatcher
    from worker.models import SendChunk

    settings.GATEKEEPER_DISPATCHERS = {"push": "memory"}
    MemoryDispatcher.outbox.clear()
    users = list(range(1000, 1300))  # buckets on every node of a cluster
    job = make_job(*users, channel="push", campaign="again")
    chunk = job.chunks.get()
    # A run gated them all, sent the first 100, was cut off in the next 50, and died.
    earlier_run(job, sent=tuple(users[:100]), sending=tuple(users[100:150]))
    outcome = {"sent": 250, "ambiguous": 50}
    assert send_chunk_run(chunk_id=chunk.pk) == outcome
    assert [m.user_id for m in MemoryDispatcher.outbox] == users[150:]
    # Delivered once more after it was counted: nothing is sent or charged again.
    SendChunk.objects.filter(pk=chunk.pk).update(status=SendChunk.Status.QUEUED)
    assert send_chunk_run(chunk_id=chunk.pk) == outcome
    assert len(MemoryDispatcher.outbox) == 150
    assert {recorded(u, "push") for u in users} == {1}
