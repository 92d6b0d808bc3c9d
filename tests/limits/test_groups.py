"""Buckets and groups (docs/limiter.md): a user's logs in its bucket of 256 or in its group of 16,
moved into the group by this release's limiter (the group its home) and read and written wherever
they are by the release before (its home the bucket: a Limiter with `groups=False`), never lost
or counted twice, on one node and on a cluster."""

import redis

from bench.servers import RedisServer
from limits.engine import log
from limits.engine.limiter import Limiter, Restored
from limits.engine.upkeep import logs_sweep
from tests.limits.rulesets import caps, ms

NOW = 1_763_800_000.0
HOUR = 3_600.0


def keys_holding(limiter: Limiter, user: int) -> set[str]:
    fields = (log.bucket_field(user), log.uncounted_field(user))
    return {
        key
        for key in log.user_keys(limiter.prefix, user)
        if any(limiter.client.hexists(key, field) for field in fields)
    }


def test_this_release_moves_a_users_logs_to_its_group_and_the_one_before_follows(
    limiter: Limiter,
) -> None:
    previous = Limiter(limiter.client, prefix=limiter.prefix, groups=False)
    bucket, group = log.user_keys(limiter.prefix, 1)
    rules = caps(daily=3)
    # The release before: users 1 and 2 (one group, one bucket), each log in the bucket.
    for user in (1, 2):
        sent = previous.acquire("email", [(user, f"a{user}")], rules, now_ms=ms(NOW))
        assert sent[0].allowed
    job = previous.acquire(
        "email", [(1, "t1")], rules, now_ms=ms(NOW), holder=7, uncounted=True
    )  # a job's transactional send: the uncounted log
    assert job[0].allowed
    assert keys_holding(limiter, 1) == keys_holding(limiter, 2) == {bucket}

    # This release records user 1's second send: both of its logs move to the group.
    second = limiter.acquire("email", [(1, "a1b")], rules, now_ms=ms(NOW + HOUR))
    assert second[0].allowed and second[0].counts["daily"] == 2
    assert keys_holding(limiter, 1) == {group}
    assert keys_holding(limiter, 2) == {bucket}
    assert [e.holder for e in previous.entries(1, uncounted=True)] == [7]

    # The release before decides where the logs are: the third send fills the cap, the fourth is
    # refused, a duplicate is found in the uncounted log; and it writes there, not back.
    third = previous.acquire("email", [(1, "a1c")], rules, now_ms=ms(NOW + 2 * HOUR))
    fourth = previous.acquire("email", [(1, "a1d")], rules, now_ms=ms(NOW + 2 * HOUR))
    again = previous.acquire("email", [(1, "t1")], rules, now_ms=ms(NOW + 2 * HOUR))
    assert (third[0].reason, fourth[0].reason, again[0].reason) == (
        "allowed",
        "daily_cap",
        "duplicate",
    )
    assert keys_holding(limiter, 1) == {group}
    usage = previous.usage(1, [("email", rules)], now_ms=ms(NOW + 2 * HOUR))
    assert usage is not None and usage[0].used == 3
    assert [e.at_ms for e in previous.history(1, now_ms=ms(NOW + 2 * HOUR))] == [
        ms(NOW + 2 * HOUR),
        ms(NOW + HOUR),
        ms(NOW),
    ]

    # Either release takes a send back out of the group; rebuild_logs' restore adds nothing
    # that is there and puts back what is not.
    assert previous.release("email", [(1, "a1c")]) == [True]
    assert limiter.release("email", [(1, "a1b")]) == [True]
    back = [Restored(1, "email", ms(NOW + HOUR), "a1b", "", 5, ())]
    assert previous.restore(back, retention_ms=8 * 86_400_000, now_ms=ms(NOW + 3 * HOUR)) == 1
    assert previous.restore(back, retention_ms=8 * 86_400_000, now_ms=ms(NOW + 3 * HOUR)) == 0
    assert keys_holding(limiter, 1) == {group}
    assert len(previous.entries(1)) == 2

    # User 2 moves too: the bucket, left with its expiry alone, stays while its groups live
    # (its expiry says it has groups: only then does the release before read them).
    limiter.acquire("email", [(2, "a2b")], rules, now_ms=ms(NOW + HOUR))
    assert keys_holding(limiter, 2) == {group}
    assert limiter.client.hkeys(bucket) == [log.EXPIRY_FIELD]
    assert b"g" in limiter.client.hget(bucket, log.EXPIRY_FIELD)
    assert limiter.client.pttl(bucket) >= limiter.client.pttl(group)

    # An erasure forgets the user wherever its logs are.
    assert previous.forget([1, 2]) == 3  # user 1's two logs, user 2's one
    assert keys_holding(limiter, 1) == keys_holding(limiter, 2) == set()


def test_a_group_of_small_logs_is_a_listpack_and_a_users_first_send_goes_home(
    limiter: Limiter,
) -> None:
    previous = Limiter(limiter.client, prefix=limiter.prefix, groups=False)
    users = list(range(32, 48))  # one group
    decided = limiter.acquire("push", [(u, f"p{u}") for u in users], caps(daily=1), now_ms=ms(NOW))
    assert all(d.allowed for d in decided)
    group = log.group_key(limiter.prefix, 32)
    assert limiter.client.object("encoding", group) == b"listpack"
    assert limiter.client.hlen(group) == len(users) + 1  # and its expiry
    # Their bucket holds nobody and says it has groups.
    bucket = log.bucket_key(limiter.prefix, 32)
    assert limiter.client.hkeys(bucket) == [log.EXPIRY_FIELD]
    # The release before finds them in the group: a second send of the day is refused.
    again = previous.acquire("push", [(u, f"q{u}") for u in users], caps(daily=1), now_ms=ms(NOW))
    assert {d.reason for d in again} == {"daily_cap"}


def test_the_sweep_drops_stale_users_of_groups_and_buckets(limiter: Limiter) -> None:
    previous = Limiter(limiter.client, prefix=limiter.prefix, groups=False)
    previous.acquire("email", [(1, "old"), (300, "old")], caps(daily=5), now_ms=ms(NOW))
    limiter.acquire("email", [(2, "old"), (301, "new")], caps(daily=5), now_ms=ms(NOW))
    limiter.acquire("email", [(301, "newer")], caps(daily=5), now_ms=ms(NOW + 9 * 86_400))
    report = logs_sweep(
        limiter, buckets=100, retention_ms=8 * 86_400_000, now_ms=ms(NOW + 9 * 86_400)
    )
    assert report.dropped == 3  # users 1, 2 and 300: their newest entry left the retention
    assert [keys_holding(limiter, u) for u in (1, 2, 300)] == [set(), set(), set()]
    assert keys_holding(limiter, 301) == {log.group_key(limiter.prefix, 301)}


def test_a_group_outgrowing_its_listpack_becomes_a_hash_table_and_back_losing_nothing(
    own_redis: RedisServer,
) -> None:
    """At Redis's default hash-max-listpack-value (64) a group whose log grows past 64 bytes is
    converted to a hash table; a restart with the value docs/deploy.md asks for (4096) loads it
    back as a listpack. Every entry is kept through both."""
    client = redis.Redis.from_url(own_redis.url)
    client.config_set("hash-max-listpack-value", 64)
    limiter = Limiter(client, prefix="conv:")
    users = list(range(32, 48))  # one group
    group = log.group_key("conv:", 32)
    rules = caps(daily=10)

    def send(n: int) -> None:
        at = ms(NOW + n * 60)
        decided = limiter.acquire("email", [(u, f"m{n}-{u}") for u in users], rules, now_ms=at)
        assert [d.counts["daily"] for d in decided] == [n + 1] * len(users)

    send(0)
    assert client.object("encoding", group) == b"listpack"  # 32-byte logs
    send(1)
    send(2)  # 74-byte logs
    assert client.object("encoding", group) == b"hashtable"
    assert all(len(limiter.entries(u)) == 3 for u in users)
    # A send taken back from the hash table; then a restart from a snapshot.
    assert limiter.release("email", [(u, f"m2-{u}") for u in users]) == [True] * len(users)
    client.save()
    own_redis.stop()
    own_redis.start()
    client = redis.Redis.from_url(own_redis.url)
    limiter = Limiter(client, prefix="conv:")
    assert client.object("encoding", group) == b"listpack"
    times = [ms(NOW), ms(NOW + 60)]
    assert [sorted(e.at_ms for e in limiter.entries(u)) for u in users] == [times] * len(users)
    send(2)
