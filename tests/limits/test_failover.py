"""The gate and the quota through a Redis Cluster failover (3 primaries, each with a replica): a
primary demoted while it stays up (CLUSTER FAILOVER TAKEOVER on its replica), and one killed
whose replica takes over and which comes back as a replica. Clients whose slot map predates the
failover, and new clients seeded with the demoted node's address, answer every user of the
moved slots; what was counted before the failover is counted after it, once."""

from collections.abc import Sequence

import pytest
import redis
from redis.cluster import RedisCluster

from bench.servers import RedisClusterProcesses
from gatekeeper.lib.redis_client import make_redis, pipelined
from limits.engine import log
from limits.engine.limiter import Limiter
from limits.reasons import Reason
from tests.limits.rulesets import caps, ms
from tests.support.redis import PREFIX

NOW = 1_763_800_000.0
RULES = caps(daily=3)
ASKS = 3  # per request: the first and a couple of retries, as the worker and callers retry


def gate(limiter: Limiter, users: Sequence[int], message_id: str) -> dict[int, str]:
    """Each user's decision on one send, asked again while `unavailable`."""
    reasons: dict[int, str] = {}
    todo = list(users)
    for _ in range(ASKS):
        decisions = limiter.acquire("email", [(u, message_id) for u in todo], RULES, now_ms=ms(NOW))
        reasons.update((d.user_id, d.reason) for d in decisions)
        todo = [d.user_id for d in decisions if d.reason == Reason.UNAVAILABLE]
        if not todo:
            break
    return reasons


def quota(limiter: Limiter, users: Sequence[int]) -> dict[int, int | None]:
    """Each user's sends counted by the daily cap, read as the quota reads them (None: still
    unavailable after the retries)."""
    used: dict[int, int | None] = {}
    for user in users:
        figures = None
        for _ in range(ASKS):
            figures = limiter.usage(user, [("email", RULES)], now_ms=ms(NOW))
            if figures is not None:
                break
        used[user] = None if figures is None else figures[0].used
    return used


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("failover", ["takeover", "kill"])
def test_the_gate_and_the_quota_follow_a_failover(
    replicated_cluster: RedisClusterProcesses, failover: str
) -> None:
    cluster = replicated_cluster
    primary, replica = cluster.primary_and_replica()
    seed = primary.url  # every client starts from the node that fails over
    # Clients whose slot map is read before the failover: one that gated every user (the
    # library is loaded on the primary), two that used only the other nodes (their first call
    # to the moved slots loads it there: the quota first, the gate first), and one for claims.
    gated = Limiter(make_redis(seed, cluster=True), prefix=PREFIX)
    quota_first = Limiter(make_redis(seed, cluster=True), prefix=PREFIX)
    gate_first = Limiter(make_redis(seed, cluster=True), prefix=PREFIX)
    claims = RedisCluster.from_url(seed)

    users = [user * 300 for user in range(120)]  # each in a bucket of its own: slots all over
    primary_slots = [slots for slots, port in cluster.owners().items() if port == primary.port]

    def on_primary(user: int) -> bool:
        slot = claims.keyslot(log.bucket_key(PREFIX, user))
        return any(start <= slot <= end for start, end in primary_slots)

    moved = [user for user in users if on_primary(user)]
    kept = [user for user in users if not on_primary(user)]
    assert len(moved) >= 20 and len(kept) >= 20
    for message_id in ("before:1", "before:2"):
        assert gate(gated, users, message_id) == dict.fromkeys(users, "allowed")
    assert quota(quota_first, kept) == dict.fromkeys(kept, 2)
    assert gate(gate_first, kept, "before:2") == dict.fromkeys(kept, "duplicate")
    claim_keys = [f"{log.bucket_key(PREFIX, user)}:claim" for user in moved]
    pipelined(claims, [("SET", key, "1") for key in claim_keys])
    cluster.wait_replicated(primary, replica)

    if failover == "takeover":
        cluster.take_over(replica)  # the primary stays up, demoted
    else:
        primary.kill()
        owners = cluster.take_over(replica)
        # While it is down, a client that knew it meets a closed port and reads the map again.
        assert quota(gated, moved) == dict.fromkeys(moved, 2)
        primary.start()  # empty, and told by the others that it is a replica now
        cluster.wait_settled(owners)
    demoted = redis.Redis(port=primary.port)
    assert demoted.info("replication")["role"] == "slave"
    # Seeded with the demoted node's address: the first node it reaches is a replica. Built as
    # every process builds its client (the settings' timeouts).
    fresh = Limiter(make_redis(seed, cluster=True), prefix=PREFIX)

    # Sends counted before are counted after, once: each user had 2 of 3, so exactly one more
    # is admitted, whichever client asks first.
    assert quota(quota_first, moved) == dict.fromkeys(moved, 2)
    assert gate(gate_first, moved, "after:1") == dict.fromkeys(moved, "allowed")
    assert gate(gated, moved, "after:2") == dict.fromkeys(moved, "daily_cap")
    assert gate(fresh, moved, "after:3") == dict.fromkeys(moved, "daily_cap")
    assert gate(fresh, moved, "after:1") == dict.fromkeys(moved, "duplicate")
    for limiter in (gated, quota_first, gate_first, fresh):
        assert quota(limiter, moved) == dict.fromkeys(moved, 3)
    assert quota(fresh, kept) == dict.fromkeys(kept, 2)
    assert pipelined(claims, [("GET", key) for key in claim_keys]) == [b"1"] * len(claim_keys)
    # The clients that had not loaded the library on the demoted node were refused with
    # READONLY there (the fault this covers), and followed the slots anyway.
    assert demoted.info("errorstats")["errorstat_READONLY"]["count"] >= 2
    demoted.close()
