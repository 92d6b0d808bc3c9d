"""rebuild_logs: Redis killed and started empty, the logs rebuilt from the send ledger; no user
is then over any cap, and nobody's quota was lost (every user's log is what it was)."""

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.servers import RedisServer
from limits.engine.limiter import get_limiter
from limits.engine.log import stored_message_hash
from limits.ledger.drain import ledger_drain_all
from limits.ledger.rebuild import logs_rebuild, mark_key
from limits.policy.rules import RuleFields
from limits.policy.services import RULES
from tests.support.clocks import instant
from worker.gate import gate_check, gate_release

pytestmark = pytest.mark.postgres

NOW = float(int(time.time()))
NOW_AT = datetime.fromtimestamp(NOW, UTC)  # the rebuild takes an aware datetime
DAY = 86_400.0
USERS = [1, 2, 3, 9, 10, 11]  # 1-3 vip (1 a day, 20 a week on email), the others default


@pytest.fixture
def own_redis(settings, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    settings.REDIS_URL = server.url  # the gate, the ledger's stream and the rebuild use it
    yield server
    server.stop()


@pytest.fixture
def history(published, own_redis) -> None:
    """Six days of sends: classic caps, a per-campaign rule, tags and priorities, a send given
    back, a refused one and an exempt one."""
    published(vip=(10, [1, 2, 3], {"email": (1, 20)}))
    RULES.create(
        fields=RuleFields(
            name="One mail of a campaign a week", segment=None, channel="email",
            match="campaign", tag="", window_kind="rolling", window_seconds=7 * 86_400,
            window_unit="", limit=1, reserve_below_priority=None, reserve_slots=None,
        ),
        via="command",
    )  # fmt: skip
    for day in range(6, 0, -1):
        at = NOW - day * DAY + 3600
        gate_check(
            channel="email",
            requests=[(u, f"d{day}:{u}") for u in USERS],
            campaign=f"news{day}",
            tags=("promo",) if day % 2 else (),
            priority=day % 10,
            now=instant(at),
        )
        gate_check(
            channel="push", requests=[(u, f"p{day}:{u}") for u in USERS], now=instant(at + 60)
        )
    gate_check(channel="email", requests=[(u, f"spring:{u}") for u in USERS], campaign="spring",
               now=instant(NOW - 3600))  # fmt: skip
    gate_check(channel="email", requests=[(u, f"otp:{u}") for u in USERS],
               category="transactional", now=instant(NOW - 60))  # fmt: skip
    assert gate_release(channel="email", requests=[(9, "d1:9"), (10, "d2:10")]) == [True, True]
    ledger_drain_all()


def logs() -> dict[int, list]:
    return {u: sorted(get_limiter().entries(u), key=lambda e: (e.channel, e.at_ms)) for u in USERS}


def probe() -> list[tuple[int, str, str]]:
    """What the gate would now say to one more send of each kind, for every user."""
    found = []
    for channel, campaign in (("email", "news0"), ("email", "spring"), ("push", "")):
        decisions = gate_check(
            channel=channel,
            requests=[(u, f"probe:{u}") for u in USERS],
            campaign=campaign,
            dry_run=True,
            now=instant(NOW),
        )
        found += [(d.user_id, f"{channel}:{campaign}", d.reason) for d in decisions]
    return found


def test_a_rebuild_after_redis_lost_everything_gives_back_every_count(history, own_redis):
    before, answers = logs(), probe()
    assert {reason for *_, reason in answers} >= {"allowed", "daily_cap"}
    assert ("email:spring", "allowed") not in {(kind, reason) for _, kind, reason in answers}

    own_redis.kill()
    own_redis.start()  # same port, nothing: every user's quota would start afresh
    assert all(not entries for entries in logs().values())
    assert {reason for *_, reason in probe()} == {"allowed"}

    report = logs_rebuild(now=NOW_AT)
    assert (report.users, report.added) == (len(USERS), report.sends)
    assert logs() == before  # every entry back: times, messages, campaigns, tags, priorities
    assert probe() == answers  # so nobody is over a cap, and nobody lost a slot
    assert not get_limiter().client.exists(mark_key(get_limiter().prefix))  # done: no mark left

    again = logs_rebuild(now=NOW_AT)  # run twice: nothing added the second time
    assert (again.sends, again.added) == (report.sends, 0)
    assert logs() == before


def test_sends_given_back_are_not_put_back(history, own_redis):
    own_redis.kill()
    own_redis.start()
    logs_rebuild(now=NOW_AT)
    hashes = {e.message for e in get_limiter().entries(9)}
    assert stored_message_hash("d1:9") not in hashes  # released
    assert stored_message_hash("d2:9") in hashes
    assert stored_message_hash("otp:9") not in hashes  # exempt: never counted


def test_a_rebuild_that_stops_goes_on_from_the_last_user_done(history, own_redis):
    before = logs()
    own_redis.kill()
    own_redis.start()

    def stop_after_first_batch(report):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        logs_rebuild(now=NOW_AT, batch=10, progress=stop_after_first_batch)
    done = {u for u, entries in logs().items() if entries}
    assert done and done != set(USERS)
    report = logs_rebuild(now=NOW_AT, batch=10)
    assert report.resumed_after is not None and report.resumed_after in done
    assert logs() == before
    # Finished: the mark is gone, so the next rebuild starts at the first user.
    assert logs_rebuild(now=NOW_AT).resumed_after is None
