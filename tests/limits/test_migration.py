"""The gate and the quota through a slot migration on a Redis Cluster (resharding): a slot holding
several users' buckets is left half-way from one primary to another (CLUSTER SETSLOT IMPORTING
and MIGRATING, some buckets moved with MIGRATE), then its migration is finished. Calls for the
buckets already moved are refused with ASK by the slot's owner, calls declaring buckets on both
sides with TRYAGAIN; every user is answered all along, on the first ask, and counted once."""

import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from bench.servers import RedisClusterProcesses, RedisServer
from gatekeeper.lib.redis_client import BUSY_PAUSE
from limits.engine import log
from limits.engine.limiter import Limiter
from tests.limits.rulesets import caps, ms

NOW = 1_763_800_000.0
PREFIX = "migrating:"
RULES = caps(daily=3)
LOW_BYTES = (1, 2, 200)  # three users in each bucket


@cache
def buckets_in_one_slot() -> list[int]:
    """Five buckets whose keys share one cluster slot (a slot holds many buckets): two to move
    before the calls, two to leave on the source, one that no send has created yet."""
    found = [1]
    bucket = 1
    while len(found) < 5:
        bucket += 1
        if slot_of(bucket) == slot_of(1):
            found.append(bucket)
    return found


def slot_of(bucket: int) -> int:
    return key_slot(log.bucket_key(PREFIX, bucket << log.BUCKET_BITS).encode())


def users_of(buckets: Sequence[int]) -> list[int]:
    return [(bucket << log.BUCKET_BITS) | low for bucket in buckets for low in LOW_BYTES]


def gate(limiter: Limiter, users: Sequence[int], message_id: str) -> dict[int, tuple[str, int]]:
    """Each user's decision on one send, asked once, in one batch: (reason, sends of the day)."""
    decisions = limiter.acquire("email", [(u, message_id) for u in users], RULES, now_ms=ms(NOW))
    return {d.user_id: (d.reason, d.counts.get("daily", -1)) for d in decisions}


def quota(limiter: Limiter, users: Sequence[int]) -> dict[int, int | None]:
    """Each user's sends counted by the daily cap, read once (None: unavailable)."""
    used: dict[int, int | None] = {}
    for user in users:
        figures = limiter.usage(user, [("email", RULES)], now_ms=ms(NOW))
        used[user] = None if figures is None else figures[0].used
    return used


def errors(node: RedisServer, kind: str) -> int:
    with redis.Redis(port=node.port) as client:
        return int(client.info("errorstats").get(f"errorstat_{kind}", {}).get("count", 0))


def keys_in_slot(node: RedisServer, slot: int) -> int:
    with redis.Redis(port=node.port) as client:
        return int(client.execute_command("CLUSTER COUNTKEYSINSLOT", slot))


def run_migration(cluster: RedisClusterProcesses, target: RedisServer | None) -> None:
    """Migrate the slot of a few users' buckets from its primary to `target` (another primary
    when None), checking the gate and the quota mid-way and after; the slot ends on `target`."""
    buckets = buckets_in_one_slot()
    moved, kept, fresh = users_of(buckets[:2]), users_of(buckets[2:4]), users_of(buckets[4:])
    everyone = moved + kept + fresh
    slot = slot_of(buckets[0])
    source = cluster.node(next(p for (lo, hi), p in cluster.owners().items() if lo <= slot <= hi))
    if target is None:
        target = next(
            n for n in cluster.nodes if n.port in cluster.owners().values() and n != source
        )
    # A client whose slot map is read before the migration starts, as a running process's is.
    client = RedisCluster.from_url(cluster.url)
    limiter = Limiter(client, prefix=PREFIX)
    try:
        assert gate(limiter, moved + kept, "before:1") == dict.fromkeys(
            moved + kept, ("allowed", 1)
        )

        cluster.begin_migration(slot, source, target)
        # Each bucket's users in two groups (low bytes 1 and 2, and 200): three keys a bucket.
        moving = sorted({key for user in moved for key in log.user_keys(PREFIX, user)})
        assert len(moving) == 6
        cluster.migrate(source, target, moving)
        # Mid-migration: the source holds the kept buckets, the target the moved ones.
        assert (keys_in_slot(source, slot), keys_in_slot(target, slot)) == (6, 6)
        asks, tries = errors(source, "ASK"), errors(source, "TRYAGAIN")

        # Only moved buckets in a call: refused whole with ASK, answered by the target.
        assert gate(limiter, moved, "mid:1") == dict.fromkeys(moved, ("allowed", 2))
        assert errors(source, "ASK") > asks
        # Only buckets still on the source: answered there.
        assert gate(limiter, kept, "mid:1") == dict.fromkeys(kept, ("allowed", 2))
        # A bucket that exists nowhere yet: created on the target.
        assert gate(limiter, fresh, "mid:1") == dict.fromkeys(fresh, ("allowed", 1))
        assert keys_in_slot(target, slot) == 9
        # Buckets on both sides in one call: refused with TRYAGAIN, sent again after a pause one
        # bucket per call (those moved after an ASK, to the target).
        started = time.monotonic()
        assert gate(limiter, everyone, "mid:1") == {
            **dict.fromkeys(moved + kept, ("duplicate", 2)),
            **dict.fromkeys(fresh, ("duplicate", 1)),
        }
        assert time.monotonic() - started >= BUSY_PAUSE
        assert errors(source, "TRYAGAIN") > tries
        assert gate(limiter, everyone, "mid:2") == {
            **dict.fromkeys(moved + kept, ("allowed", 3)),
            **dict.fromkeys(fresh, ("allowed", 2)),
        }
        assert gate(limiter, everyone, "mid:3") == {
            **dict.fromkeys(moved + kept, ("daily_cap", 3)),
            **dict.fromkeys(fresh, ("allowed", 3)),
        }
        assert gate(limiter, everyone, "mid:4") == dict.fromkeys(everyone, ("daily_cap", 3))
        assert quota(limiter, everyone) == dict.fromkeys(everyone, 3)
        # A send taken back is taken back once, wherever its bucket is.
        one_each = [moved[0], kept[0], fresh[0]]
        assert limiter.release("email", [(u, "mid:2") for u in one_each]) == [True] * 3
        assert limiter.release("email", [(u, "mid:2") for u in one_each]) == [False] * 3
        assert quota(limiter, one_each) == dict.fromkeys(one_each, 2)
        assert gate(limiter, one_each, "mid:5") == dict.fromkeys(one_each, ("allowed", 3))
        assert keys_in_slot(source, slot) == 6  # nothing written where it should not be

        cluster.move_slot(slot, target.port)
        assert keys_in_slot(source, slot) == 0
        # The map read before the migration now meets MOVED and is read again.
        assert gate(limiter, everyone, "after:1") == dict.fromkeys(everyone, ("daily_cap", 3))
        assert gate(limiter, everyone, "mid:2") == {
            **{u: ("duplicate", 3) for u in everyone if u not in one_each},
            **{u: ("daily_cap", 3) for u in one_each},
        }
        assert quota(limiter, everyone) == dict.fromkeys(everyone, 3)
        fresh_client = RedisCluster.from_url(cluster.url)
        try:
            after = Limiter(fresh_client, prefix=PREFIX)
            assert quota(after, everyone) == dict.fromkeys(everyone, 3)
            assert gate(after, one_each, "mid:5") == dict.fromkeys(one_each, ("duplicate", 3))
            assert gate(after, everyone, "after:2") == dict.fromkeys(everyone, ("daily_cap", 3))
        finally:
            fresh_client.close()
    finally:
        client.close()


@pytest.mark.cluster
def test_the_gate_and_the_quota_follow_a_slot_migrating_between_primaries(
    redis_cluster: RedisClusterProcesses,
) -> None:
    owners = redis_cluster.owners()
    slot = slot_of(buckets_in_one_slot()[0])
    source = next(port for (lo, hi), port in owners.items() if lo <= slot <= hi)
    try:
        run_migration(redis_cluster, None)
    finally:
        # The session's cluster as it was: the slot back on its primary, no key of this test.
        redis_cluster.move_slot(slot, source)
        redis_cluster.wait_settled(owners)
        with RedisCluster.from_url(redis_cluster.url) as client:
            client.flushall(target_nodes=RedisCluster.PRIMARIES)


@pytest.mark.cluster
@pytest.mark.slow
def test_the_gate_and_the_quota_follow_a_slot_migrating_to_a_new_node(tmp_path: Path) -> None:
    # Adding a shard: the importing node serves no slot yet, so no client's map names it.
    cluster = RedisClusterProcesses(tmp_path).start()
    try:
        run_migration(cluster, cluster.join())
    finally:
        cluster.stop()
