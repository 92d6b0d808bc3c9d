"""The drain when the database fails under it: a drain whose write failed takes its entries again
on its next run (or another drainer takes them at once), so the ledger is complete seconds
after the database is back, every decision written once and the outcome events behind them
counted once; a drainer that is truly gone still has its entries taken from it only after
CLAIM_IDLE_MS, except by a drain that must count events posted after them; a drain that fails
on its entries rather than on the database (a value the table refuses) leaves them to that
minute's claim, and new entries go on being drained.

The failures are real: on PostgreSQL the drain's connection is terminated (pg_terminate_backend)
while its write waits on a lock another connection holds; on SQLite another connection holds
the write lock; a refused value is a trigger's."""

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from django.db import DatabaseError, connection, transaction

from limits.ledger import drain
from limits.ledger.drain import COUNTS, GROUP, Drained, ledger_drain, ledger_drain_all
from limits.ledger.stream import stream_key
from limits.ledger.table import decisions
from limits.models.ledger import LedgerBatch, LedgerCount, LedgerEntry
from limits.models.studies import StudyEvent, StudyMember
from limits.policy.selectors import policy_cache
from tests.support.api import call
from tests.support.clocks import instant
from worker.gate import gate_check

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Not the day tests/limits/ledger/test_ledger_upgrade.py makes partitions for: this file's
# transactional tests leave their day's partition behind.
NOW = 1_764_577_600.0  # 2025-12-01 08:26:40 UTC
USERS = list(range(1, 41))


@pytest.fixture
def snapshot(published):
    return published(vip=(10, USERS[:20], {"email": (1, None)}))


def messages() -> list[str]:
    return sorted(decisions().values_list("message", flat=True))


def decided() -> list[str]:
    """Three gate calls' decisions, in the stream, not drained."""
    sent = []
    for n in range(3):
        requests = [(u, f"m{n}-{u}") for u in USERS]
        gate_check(channel="email", requests=requests, campaign="spring", now=instant(NOW + n))
        sent += [message for _, message in requests]
    return sorted(sent)


class _Terminator(threading.Thread):
    """PostgreSQL: holds the counts table locked from another connection until a drain's write
    waits on it, then terminates that drain's connection (as an operator or a failover would)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.locked = threading.Event()
        self.killed: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {COUNTS} IN ACCESS EXCLUSIVE MODE")
                self.locked.set()
                deadline = time.monotonic() + 30
                while not self.killed:
                    # The activity view is read once per transaction unless told to read again.
                    cursor.execute("SELECT pg_stat_clear_snapshot()")
                    cursor.execute(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND pid <> pg_backend_pid() AND query LIKE %s",
                        [f"INSERT INTO {COUNTS}%"],
                    )
                    self.killed = [pid for (pid,) in cursor.fetchall()]
                    if time.monotonic() > deadline:
                        raise AssertionError("no drain came to wait on the counts table")
                    time.sleep(0.01)  # polled until the drain waits, within the deadline
                for pid in self.killed:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        except BaseException as exc:  # handed to the test's thread
            self.error = exc
            self.locked.set()
        finally:
            connection.close()


@contextmanager
def failing_write() -> Iterator[None]:
    """The drain run inside fails for real after it took its entries: on PostgreSQL half-way
    (it wrote the ledger's rows and adds the hourly counts); on SQLite as its transaction
    begins (another process holds the write lock)."""
    if connection.vendor == "postgresql":
        terminator = _Terminator()
        terminator.start()
        assert terminator.locked.wait(30)
        assert terminator.error is None, terminator.error
        try:
            yield
        finally:
            terminator.join(30)
            assert terminator.error is None, terminator.error
            assert terminator.killed  # the drain's own connection, terminated
            connection.close()  # the dead connection: the next query opens another
        return
    # The drain's patience made short (30 s in settings): "database is locked" at once.
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout = 100")
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        with connection.cursor() as cursor:
            timeout = int(connection.settings_dict["OPTIONS"]["timeout"] * 1000)
            cursor.execute(f"PRAGMA busy_timeout = {timeout}")


def test_a_drain_whose_write_failed_writes_everything_once_on_its_next_run(snapshot, redis_client):
    sent = decided()
    with failing_write(), pytest.raises(DatabaseError):
        ledger_drain()
    # What it had written went with its transaction; its entries are still in the stream.
    assert not LedgerEntry.objects.exists() and not LedgerBatch.objects.exists()
    assert redis_client.xlen(stream_key()) == 3
    # The database is back: the next run, at once (not CLAIM_IDLE_MS later), writes them all.
    report = ledger_drain()
    assert (report.entries, report.rows, report.skipped) == (3, len(sent), 0)
    assert messages() == sent
    assert sum(LedgerCount.objects.values_list("count", flat=True)) == len(sent)
    assert redis_client.xlen(stream_key()) == 0
    assert redis_client.xpending(stream_key(), GROUP)["pending"] == 0
    # Nothing more to write: every decision once.
    assert ledger_drain_all() == 0
    assert LedgerEntry.objects.count() == len(sent)


def test_another_drainer_takes_a_failed_drains_entries_at_once(snapshot, redis_client):
    sent = decided()
    with failing_write(), pytest.raises(DatabaseError):
        ledger_drain(consumer="host-a:1")
    # The failed drain gave its entries back: another process's drain takes them now.
    report = ledger_drain(consumer="host-b:2")
    assert (report.entries, report.rows) == (3, len(sent))
    assert messages() == sent
    assert ledger_drain(consumer="host-a:1").entries == 0


def test_a_drainer_that_is_gone_keeps_its_entries_until_they_are_idle(snapshot, redis_client):
    # A drainer killed after reading never gives its entries back: they are taken only once
    # idle for CLAIM_IDLE_MS, as before (a live but slow drainer is not raced).
    sent = decided()
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    taken = redis_client.xreadgroup(GROUP, "host-gone:9", {key: ">"})
    assert len(taken[0][1]) == 3
    assert ledger_drain().entries == 0
    ids = [entry_id for entry_id, _ in taken[0][1]]
    redis_client.xclaim(key, GROUP, "host-gone:9", 0, ids, idle=60_001)
    assert ledger_drain().rows == len(sent)
    assert messages() == sent


def test_a_drainers_own_pending_entries_are_taken_first_whatever_their_idle_time(
    snapshot, redis_client
):
    # This process read them (a drain that failed before it could give them back) and is alive:
    # its next run takes them, with no minute's wait.
    sent = decided()
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    redis_client.xreadgroup(GROUP, drain._consumer(), {key: ">"}, count=2)
    report = ledger_drain()
    assert (report.entries, report.rows) == (3, len(sent))
    assert messages() == sent


# --- outcome events behind the decisions -----------------------------------------------------


@pytest.fixture
def control_group(api, snapshot):
    assert call(api("marketer"), "PUT", "/api/v1/holdout/",
                json={"share": 0.2, "salt": "faults-1"}).status_code == 200  # fmt: skip
    policy_cache().invalidate()


def ordered(api, users: list[int]) -> None:
    """The company posts an order of each of `users`, now."""
    now = datetime.now(UTC).isoformat()
    events = [{"event_id": f"o{u}", "user_id": u, "name": "order", "at": now, "value": 5.0}
              for u in users]  # fmt: skip
    posted = call(api("gate"), "POST", "/api/v1/events/", json={"events": events})
    assert posted.status_code == 202, posted.text


def orders() -> int:
    return sum(StudyEvent.objects.filter(name="order").values_list("count", flat=True))


def in_the_group() -> int:
    """Orders the users of the control group and its sample should count: one each."""
    return StudyMember.objects.filter(study=0).count()


def test_a_drain_that_failed_counts_the_events_behind_its_decisions_once_on_its_retry(
    api, control_group
):
    gate_check(channel="email", requests=[(u, f"s{u}") for u in USERS])
    ordered(api, USERS)
    with failing_write(), pytest.raises(DatabaseError):
        ledger_drain()
    assert orders() == 0 and not StudyMember.objects.exists()
    report = ledger_drain()
    assert (report.events, report.events_repeated) == (len(USERS), 0)
    assert 0 < in_the_group() < len(USERS) and orders() == in_the_group()
    ordered(api, USERS)  # posted again: repeats
    ledger_drain_all()
    assert orders() == in_the_group()


def test_a_drain_that_committed_and_died_before_acknowledging_counts_no_event_twice(
    api, control_group, redis_client
):
    gate_check(channel="email", requests=[(u, f"s{u}") for u in USERS])
    ordered(api, USERS)
    # This process's drain wrote both entries and committed, then lost Redis before its XACK.
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    [[_, entries]] = redis_client.xreadgroup(GROUP, drain._consumer(), {key: ">"})
    drain._entries_written(entries, [i.decode() for i, _ in entries], Drained())
    counted = orders()
    assert counted == in_the_group() > 0
    report = ledger_drain()  # takes them again: written already, only acknowledged
    assert (report.entries, report.skipped, report.events) == (2, 2, 0)
    assert orders() == counted and redis_client.xlen(key) == 0


def test_events_wait_for_the_decisions_a_dead_drainer_holds_before_them(
    api, control_group, redis_client
):
    gate_check(channel="email", requests=[(u, f"s{u}") for u in USERS])
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    redis_client.xreadgroup(GROUP, "host-gone:9", {key: ">"})  # then killed
    ordered(api, USERS)
    # The events came after those decisions: the drain that counts them writes the decisions
    # first, taken from the dead drainer however briefly idle.
    report = ledger_drain()
    assert report.entries == 2 and report.rows == len(USERS)
    assert in_the_group() > 0 and orders() == in_the_group()
    assert redis_client.xpending(key, GROUP)["pending"] == 0


def test_a_drain_that_fails_on_its_entries_leaves_them_to_the_minutes_claim(snapshot, redis_client):
    # A value the table refuses (here a trigger; in life a bug, or a column an upgrade changed)
    # fails every drain of that entry: retried at once it would hold up every entry after it.
    refuse = (
        "CREATE TRIGGER gk_test_refuse BEFORE INSERT ON limits_ledgerkind "
        "WHEN NEW.campaign = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    if connection.vendor == "postgresql":
        refuse = (
            "CREATE FUNCTION gk_test_refuse() RETURNS trigger AS $$ BEGIN "
            "IF NEW.campaign = 'refused' THEN RAISE EXCEPTION 'refused' USING ERRCODE = "
            "'check_violation'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql; "
            "CREATE TRIGGER gk_test_refuse BEFORE INSERT ON limits_ledgerkind FOR EACH ROW "
            "EXECUTE FUNCTION gk_test_refuse()"
        )
    with connection.cursor() as cursor:
        cursor.execute(refuse)
    try:
        gate_check(channel="email", requests=[(1, "r1")], campaign="refused", now=instant(NOW))
        with pytest.raises(DatabaseError):
            ledger_drain()
        gate_check(channel="email", requests=[(2, "f1")], campaign="fine", now=instant(NOW + 1))
        assert ledger_drain().rows == 1  # the new entry; not the failed one, yet
        assert messages() == ["f1"]
        [held] = redis_client.xpending_range(stream_key(), GROUP, "-", "+", 10)
        assert held["consumer"] == drain.FAILED.encode()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER gk_test_refuse" + (
                " ON limits_ledgerkind; DROP FUNCTION gk_test_refuse()"
                if connection.vendor == "postgresql" else ""
            ))  # fmt: skip
    # A minute later (its idle time said so) a drain takes it again: written once.
    redis_client.xclaim(stream_key(), GROUP, drain.FAILED, 0, [held["message_id"]], idle=60_001)
    assert ledger_drain().rows == 1
    assert messages() == ["f1", "r1"]
