"""manage.py group_logs: every user's logs still in its bucket moved into its group, on one node
and on a cluster, refused while a process of another release reports; the limiters then read
buckets no more (docs/limiter.md, "Buckets and groups")."""

import json
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from limits.engine import log
from limits.engine.limiter import Limiter
from tests.limits.rulesets import caps, ms

NOW = 1_763_800_000.0
PREFIX = "test:"


def _run(*args: str) -> str:
    out = StringIO()
    call_command("group_logs", *args, stdout=out)
    return out.getvalue()


def _holding(client: Any, user: int) -> set[str]:
    fields = (log.bucket_field(user), log.uncounted_field(user))
    return {
        key
        for key in log.user_keys(PREFIX, user)
        if any(client.hexists(key, field) for field in fields)
    }


@pytest.mark.django_db
def test_the_logs_move_into_their_groups_once_no_process_of_the_release_before_runs(
    settings_redis: Any,
) -> None:
    client = settings_redis
    before = Limiter(client, prefix=PREFIX, groups=False)  # the release before: buckets
    rules = caps(daily=2)
    for user in (1, 2, 300):
        assert before.acquire("email", [(user, f"a{user}")], rules, now_ms=ms(NOW))[0].allowed
    job = before.acquire("email", [(1, "t1")], rules, now_ms=ms(NOW), holder=7, uncounted=True)
    assert job[0].allowed
    assert _holding(client, 1) == {log.bucket_key(PREFIX, 1)}

    # A process of the release before still reports: refused, nothing moved.
    entry = {"role": "worker", "host": "old-host", "pid": 7, "seen_at": time.time()}
    client.hset(f"{PREFIX}processes", "old-host:7", json.dumps({**entry, "functions": "0ld"}))
    with pytest.raises(CommandError, match=r"Not moved: 1 process of another release"):
        _run()
    assert _holding(client, 1) == {log.bucket_key(PREFIX, 1)}
    assert not Limiter(client, prefix=PREFIX).grouped()

    client.hdel(f"{PREFIX}processes", "old-host:7")
    out = _run()
    assert "Moved 4 logs out of 2 buckets into their groups" in out
    for user in (1, 2, 300):
        assert _holding(client, user) == {log.group_key(PREFIX, user)}
    for user in (1, 300):  # each bucket says it has groups, and outlives them
        bucket, group = log.user_keys(PREFIX, user)
        assert client.hkeys(bucket) == [log.EXPIRY_FIELD]
        assert b"g" in client.hget(bucket, log.EXPIRY_FIELD)
        assert client.pttl(bucket) >= client.pttl(group)

    # This release reads groups alone now, and finds every send: the second of the day fills
    # the cap, the third is refused, the job's message is a duplicate in the uncounted log.
    limiter = Limiter(client, prefix=PREFIX)
    assert limiter.grouped()
    second = limiter.acquire("email", [(1, "b1"), (300, "b300")], rules, now_ms=ms(NOW + 60))
    assert [(d.reason, d.counts["daily"]) for d in second] == [("allowed", 2), ("allowed", 2)]
    third = limiter.acquire("email", [(1, "c1"), (1, "t1")], rules, now_ms=ms(NOW + 60))
    assert [d.reason for d in third] == ["daily_cap", "duplicate"]
    assert "Moved 0 logs out of 2 buckets" in _run()  # again: nothing left
