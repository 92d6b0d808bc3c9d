"""The upgrade from the two-sorted-set logs, on one node and on a 3-master cluster: an upgrade in
the middle of a week loses no recorded send and never over-admits a user.

Old logs are written here as the earlier version wrote them (ZADD into `{u:<id>}:<channel>` and
`{u:<id>}:all`, scores in ms); the new limiter decides with upgrade on, and convert_logs moves
the rest, also when stopped half-way and run again."""

import random
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from redis.cluster import RedisCluster

from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine import log
from limits.engine.legacy import LegacyLogs, legacy_key
from limits.engine.limiter import Limiter, get_limiter, reset_limiter
from limits.engine.upkeep import convert_cursors_key, logs_convert, primaries
from tests.limits.rulesets import caps, ms
from tests.support.redis import PREFIX

NOW = 1_763_800_000.0  # seconds (as retry_after reads); the engine is given ms(NOW)
HOUR = 3_600.0
DAY = 86_400.0
RETENTION_MS = 8 * 86_400_000
# Users in many buckets and (on the cluster) on every node; 2**33 + 7 is a 64-bit id.
USERS = [1, 2, 3, 255, 256, 257, 1_000, 4_097, 70_000, 123_456, 999_999, 2**33 + 7]


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def client(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Any:
    if request.param == "single":
        return redis_client
    cluster: RedisCluster = request.getfixturevalue("cluster_client")
    cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
    return cluster


@pytest.fixture
def limiter(client: Any) -> Limiter:
    """The new limiter while logs of the earlier format remain (GATEKEEPER_LOG_UPGRADE on)."""
    return Limiter(client, prefix=PREFIX, upgrade=True)


Sends = dict[int, list[tuple[str, str, int]]]  # user -> (channel, message id, time ms)


def write_old(client: Any, user: int, channel: str, message: str, at: float) -> int:
    """One send as the earlier version recorded it: in the channel's log and in `all`."""
    at_ms = round(at * 1000)
    pipe = client.pipeline(transaction=False)
    pipe.zadd(legacy_key(PREFIX, user, channel), {message: at_ms})
    pipe.zadd(legacy_key(PREFIX, user, "all"), {f"{channel}:{message}": at_ms})
    pipe.pexpire(legacy_key(PREFIX, user, channel), RETENTION_MS)
    pipe.pexpire(legacy_key(PREFIX, user, "all"), RETENTION_MS)
    pipe.execute()
    return at_ms


def old_week(client: Any, users: list[int] = USERS, *, now: float = NOW) -> Sends:
    """A week's worth of old logs: each user 1 to 6 sends, both channels, over the last 6 days."""
    rng = random.Random(13)
    sends: Sends = {}
    for user in users:
        sends[user] = []
        for k in range(rng.randint(1, 6)):
            channel = rng.choice(("email", "push"))
            at = now - rng.uniform(60, 6 * DAY)
            message = f"m-{user}-{k}"
            sends[user].append((channel, message, write_old(client, user, channel, message, at)))
    return sends


def old_keys(client: Any) -> list[bytes]:
    found: list[bytes] = []
    for _, conn in primaries(client):
        found.extend(conn.scan_iter(match=f"{PREFIX}{{u:*}}:*"))
    return found


def old_keys_of(client: Any, user: int) -> list[str]:
    keys = [legacy_key(PREFIX, user, scope) for scope in ("email", "push", "all")]
    return [key for key in keys if client.exists(key)]


def logged(limiter: Limiter, user: int) -> list[tuple[str, int, bytes]]:
    return sorted((e.channel, e.at_ms, e.message) for e in limiter.entries(user))


def expected(sends: list[tuple[str, str, int]]) -> list[tuple[str, int, bytes]]:
    return sorted((channel, at, log.stored_message_hash(message)) for channel, message, at in sends)


def convert(limiter: Limiter, *, now: float = NOW, **options: Any) -> list[Any]:
    return list(logs_convert(limiter, retention_ms=RETENTION_MS, now_ms=ms(now), **options))


# --- decisions during the upgrade -----------------------------------------------------------


def test_a_user_at_the_daily_cap_before_the_upgrade_is_refused_after_it(
    limiter: Limiter, client: Any
) -> None:
    write_old(client, 1, "email", "a", NOW - 3 * HOUR)
    write_old(client, 1, "email", "b", NOW - HOUR)
    write_old(client, 1, "push", "c", NOW - 2 * HOUR)
    write_old(client, 1, "email", "d", NOW - 3 * DAY)
    refused = limiter.acquire("email", [(1, "new")], caps(daily=2, weekly=5), now_ms=ms(NOW))[0]
    assert (refused.allowed, refused.reason) == (False, "daily_cap")
    assert refused.counts == {"daily": 2, "weekly": 3}
    # The older of today's two sends leaves the 24 h window first.
    assert refused.retry_after == pytest.approx(DAY - 3 * HOUR)
    assert old_keys(client) == []


def test_a_user_at_the_weekly_cap_before_the_upgrade_is_refused_until_the_oldest_leaves(
    limiter: Limiter, client: Any
) -> None:
    for k, days_ago in enumerate((6, 4, 2)):
        write_old(client, 2, "email", f"m{k}", NOW - days_ago * DAY)
    refused = limiter.acquire("email", [(2, "new")], caps(daily=5, weekly=3), now_ms=ms(NOW))[0]
    assert refused.reason == "weekly_cap"
    assert refused.retry_after == pytest.approx(DAY)
    assert limiter.acquire("email", [(2, "new")], caps(weekly=3), now_ms=ms(NOW + DAY))[0].allowed


def test_old_sends_of_another_channel_count_against_rules_on_every_channel(
    limiter: Limiter, client: Any
) -> None:
    write_old(client, 3, "push", "p1", NOW - 5 * HOUR)
    write_old(client, 3, "push", "p2", NOW - 4 * HOUR)
    refused = limiter.acquire("email", [(3, "e1")], caps(all_daily=2), now_ms=ms(NOW))[0]
    assert refused.reason == "daily_cap"
    assert refused.rule is not None and refused.rule["id"] == 3
    assert refused.retry_after == pytest.approx(DAY - 5 * HOUR)


def test_a_user_below_the_cap_gets_exactly_the_slots_left(limiter: Limiter, client: Any) -> None:
    write_old(client, 4, "email", "old", NOW - 2 * HOUR)
    rules = caps(daily=3)
    first, second, third = (
        limiter.acquire("email", [(4, f"new{k}")], rules, now_ms=ms(NOW + k))[0] for k in range(3)
    )
    assert [first.reason, second.reason, third.reason] == ["allowed", "allowed", "daily_cap"]
    assert second.counts == {"daily": 3, "weekly": 3}


def test_a_batch_moves_every_user_it_decides_for(limiter: Limiter, client: Any) -> None:
    sends = old_week(client)
    decisions = limiter.acquire(
        "email", [(user, "new") for user in USERS], caps(weekly=100), now_ms=ms(NOW), dry_run=True
    )
    for decision in decisions:
        emails = sum(1 for channel, _, _ in sends[decision.user_id] if channel == "email")
        assert decision.counts["weekly"] == emails + 1  # with the one decided

    assert old_keys(client) == []
    for user in USERS:
        assert logged(limiter, user) == expected(sends[user])


def test_an_old_send_sent_again_is_a_duplicate(limiter: Limiter, client: Any) -> None:
    write_old(client, 5, "email", "m1", NOW - HOUR)
    again = limiter.acquire("email", [(5, "m1")], caps(daily=5), now_ms=ms(NOW))[0]
    assert (again.reason, again.counts["daily"]) == ("duplicate", 1)


def test_releasing_an_old_send_takes_it_out(limiter: Limiter, client: Any) -> None:
    now = time.time()  # a release runs on the server's clock
    write_old(client, 6, "email", "kept", now - 2 * HOUR)
    write_old(client, 6, "email", "failed", now - HOUR)
    assert limiter.release("email", [(6, "failed"), (6, "never")]) == [True, False]
    assert old_keys(client) == []
    assert [e.message for e in limiter.entries(6)] == [log.stored_message_hash("kept")]
    assert limiter.acquire("email", [(6, "new")], caps(daily=2), now_ms=ms(now))[0].allowed


def test_a_quota_reset_forgets_old_logs_too(limiter: Limiter, client: Any) -> None:
    write_old(client, 7, "email", "a", NOW - HOUR)
    write_old(client, 7, "push", "b", NOW - HOUR)
    write_old(client, 7, "sms", "c", NOW - HOUR)  # a channel no longer configured
    assert limiter.reset(7) is True
    assert old_keys(client) == []
    assert limiter.reset(7) is False
    allowed = limiter.acquire("email", [(7, "new")], caps(daily=1, all_daily=1), now_ms=ms(NOW))[0]
    assert (allowed.reason, allowed.counts) == ("allowed", {"daily": 1, "weekly": 1})


def test_the_quota_read_counts_old_sends(limiter: Limiter, client: Any) -> None:
    write_old(client, 8, "email", "a", NOW - HOUR)
    usage = limiter.usage(8, [("email", caps(daily=3))], now_ms=ms(NOW))
    assert usage is not None and [u.used for u in usage] == [1]


def test_a_channel_no_longer_configured_is_moved_through_the_all_log(
    limiter: Limiter, client: Any
) -> None:
    write_old(client, 9, "sms", "s1", NOW - HOUR)
    write_old(client, 9, "email", "e1", NOW - 2 * HOUR)
    refused = limiter.acquire("email", [(9, "e2")], caps(all_daily=2), now_ms=ms(NOW))[0]
    assert refused.reason == "daily_cap"
    assert old_keys(client) == []  # the sms log as well, not left for its TTL
    assert {e.channel for e in limiter.entries(9)} == {"sms", "email"}


def test_two_processes_moving_one_user_count_each_send_once(limiter: Limiter, client: Any) -> None:
    sends = old_week(client, [10])
    other = LegacyLogs(client, prefix=PREFIX, import_entries=limiter.import_entries)
    read_first = other.read([10])
    # Meanwhile the gate moves the user and records a send...
    limiter.acquire("email", [(10, "new")], caps(), now_ms=ms(NOW))
    # ...and the other process imports what it read before: nothing is added twice.
    assert other.move_logs(read_first, now_ms=ms(NOW)) == 0
    (new,) = [e for e in limiter.entries(10) if e.message == log.stored_message_hash("new")]
    assert logged(limiter, 10) == sorted([*expected(sends[10]), ("email", new.at_ms, new.message)])


def test_entries_older_than_the_retention_are_not_imported(limiter: Limiter, client: Any) -> None:
    write_old(client, 11, "email", "stale", NOW - 9 * DAY)
    write_old(client, 11, "email", "fresh", NOW - DAY)
    assert limiter.acquire("email", [(11, "x")], caps(), now_ms=ms(NOW), dry_run=True)[0].allowed
    assert [e.message for e in limiter.entries(11)] == [log.stored_message_hash("fresh")]
    assert old_keys(client) == []


# --- convert_logs ---------------------------------------------------------------------------


def test_converting_moves_every_old_log_into_the_new_one(limiter: Limiter, client: Any) -> None:
    sends = old_week(client)
    pages = convert(limiter, page=7)
    assert sum(p.users for p in pages) == len(USERS)
    assert sum(p.entries for p in pages) == sum(len(s) for s in sends.values())
    assert {p.node for p in pages} == {name for name, _ in primaries(client)}
    assert old_keys(client) == []
    for user in USERS:
        assert logged(limiter, user) == expected(sends[user])
    assert not client.exists(convert_cursors_key(PREFIX))


def test_converting_again_adds_nothing(limiter: Limiter, client: Any) -> None:
    sends = old_week(client)
    convert(limiter)
    assert sum(p.entries for p in convert(limiter)) == 0
    for user in USERS:
        assert logged(limiter, user) == expected(sends[user])


def test_a_dry_run_counts_and_changes_nothing(limiter: Limiter, client: Any) -> None:
    sends = old_week(client)
    write_old(client, 12, "email", "stale", NOW - 9 * DAY)
    before = sorted(old_keys(client))
    pages = convert(limiter, dry_run=True)
    assert sum(p.keys for p in pages) == len(before)
    assert sum(p.users for p in pages) == len(USERS) + 1
    assert sum(p.entries for p in pages) == sum(len(s) for s in sends.values())
    assert sorted(old_keys(client)) == before
    assert all(limiter.entries(user) == [] for user in USERS)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch, client: Any) -> list[tuple[str, int]]:
    """Every SCAN call on each primary as (node, cursor): the real calls, recorded."""
    calls: list[tuple[str, int]] = []
    for name, conn in primaries(client):

        def recording(
            cursor: int = 0, *args: Any, real: Any = conn.scan, node: str = name, **kwargs: Any
        ) -> Any:
            calls.append((node, int(cursor)))
            return real(cursor, *args, **kwargs)

        monkeypatch.setattr(conn, "scan", recording)
    return calls


def test_a_conversion_stopped_half_way_is_continued_by_the_next_run(
    limiter: Limiter, client: Any, scans: list[tuple[str, int]]
) -> None:
    sends = old_week(client)
    total = len(old_keys(client))
    first = logs_convert(limiter, retention_ms=RETENTION_MS, now_ms=ms(NOW), page=3)
    page = next(first)
    while page.users == 0:
        page = next(first)
    first.close()
    assert not page.finished
    left = len(old_keys(client))
    assert 0 < left < total
    saved = client.hgetall(convert_cursors_key(PREFIX))
    assert int(saved[page.node.encode()]) != 0

    scans.clear()
    convert(limiter, page=3)
    # The next run's first SCAN starts where the first run stopped, not at the beginning.
    assert scans[0] == (page.node, int(saved[page.node.encode()]))
    assert old_keys(client) == []
    for user in USERS:
        assert logged(limiter, user) == expected(sends[user])
    assert not client.exists(convert_cursors_key(PREFIX))


def test_a_conversion_that_fails_mid_page_loses_and_doubles_nothing(
    limiter: Limiter, client: Any
) -> None:
    sends = old_week(client)
    real_import = limiter.import_entries
    imported: list[int] = []

    def failing(user_id: int, entries: Any, **options: Any) -> int:
        if len(imported) == 2:
            raise redis.ConnectionError("connection lost")
        imported.append(user_id)
        return real_import(user_id, entries, **options)

    limiter.import_entries = failing  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        convert(limiter)
    # The two users imported before the failure keep their old keys: their page is not done.
    assert all(old_keys_of(client, user) for user in imported)

    limiter.import_entries = real_import  # type: ignore[method-assign]
    convert(limiter)
    assert old_keys(client) == []
    for user in USERS:
        assert logged(limiter, user) == expected(sends[user])


def test_converting_while_the_gate_decides_counts_each_send_once(
    limiter: Limiter, client: Any
) -> None:
    sends = old_week(client)
    pages = logs_convert(limiter, retention_ms=RETENTION_MS, now_ms=ms(NOW), page=3)
    next(pages)
    decisions = limiter.acquire("email", [(user, "new") for user in USERS], caps(), now_ms=ms(NOW))
    assert all(d.allowed for d in decisions)
    list(pages)
    assert old_keys(client) == []
    for user in USERS:
        new = ("email", round(NOW * 1000), log.stored_message_hash("new"))
        assert logged(limiter, user) == sorted([*expected(sends[user]), new])


def test_converting_moves_a_log_of_a_channel_no_longer_configured(
    limiter: Limiter, client: Any
) -> None:
    # Only the channel's own log is left (no `all`): found by SCAN, not by the channel list.
    client.zadd(legacy_key(PREFIX, 13, "sms"), {"s1": round((NOW - HOUR) * 1000)})
    pages = convert(limiter)
    assert (sum(p.users for p in pages), sum(p.entries for p in pages)) == (1, 1)
    assert old_keys(client) == []
    assert [e.channel for e in limiter.entries(13)] == ["sms"]


def test_keys_only_named_like_old_logs_are_left_alone(limiter: Limiter, client: Any) -> None:
    client.set(f"{PREFIX}{{u:not-a-user}}:email", "x")
    pages = convert(limiter)
    assert sum(p.ignored for p in pages) == 1
    assert client.get(f"{PREFIX}{{u:not-a-user}}:email") == b"x"


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def configured(client: Any, settings: Any) -> Iterator[Limiter]:
    """Settings pointing at the test's Redis (a cluster where the client is one)."""
    if isinstance(client, RedisCluster):
        node = client.get_default_node()
        settings.REDIS_URL = f"redis://{node.host}:{node.port}/0"
        settings.REDIS_CLUSTER = True
    settings.GATEKEEPER_KEY_PREFIX = PREFIX
    settings.GATEKEEPER_LOG_UPGRADE = True
    reset_redis_clients()
    reset_limiter()
    yield get_limiter()
    reset_redis_clients()
    reset_limiter()


def run(*args: str) -> str:
    out = StringIO()
    call_command("convert_logs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_converts_stops_resumes_and_reports_none_left(
    configured: Limiter, client: Any
) -> None:
    now = time.time()  # the command runs on the server's clock
    sends = old_week(client, now=now)
    total, entries = len(old_keys(client)), sum(len(s) for s in sends.values())

    dry = run("--dry-run")
    assert f"Dry run: {total} old logs of {len(USERS)} users holding {entries} entries" in dry
    assert len(old_keys(client)) == total

    stopped = run("--scan-count", "2", "--max-keys", "3")
    assert "Stopped at --max-keys: run it again to continue from there." in stopped
    assert 0 < len(old_keys(client)) < total

    resumed = run("--scan-count", "3")
    assert "Continuing the pass an earlier run stopped in." in resumed
    assert "Pass complete" in resumed
    assert old_keys(client) == []

    assert "No logs of the earlier format are left." in run()
    for user in USERS:
        assert logged(configured, user) == expected(sends[user])


@pytest.mark.django_db
def test_the_command_starts_over_when_told(configured: Limiter, client: Any) -> None:
    old_week(client, now=time.time())
    run("--scan-count", "2", "--max-keys", "2")
    assert client.exists(convert_cursors_key(PREFIX))
    restarted = run("--restart", "--scan-count", "2")
    assert "Continuing" not in restarted
    assert "Pass complete" in restarted
    assert old_keys(client) == []


def test_the_command_rejects_a_bad_limit() -> None:
    with pytest.raises(CommandError, match="--max-keys must be at least 1"):
        run("--max-keys", "0")
