"""The send ledger, first step: the gate's decisions reach the database exactly once, through
the Redis stream and the drain, on SQLite and PostgreSQL; a drainer that dies loses nothing and
doubles nothing; old days leave whole."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from limits.engine.quiet import QuietFields
from limits.ledger import drain
from limits.ledger.drain import (
    CLAIM_IDLE_MS,
    GROUP,
    TABLE,
    drainer_key,
    ledger_drain,
    ledger_drain_all,
    ledger_upkeep,
    ledger_write,
    outcomes_sql,
    outcomes_write,
    partitions_list,
)
from limits.ledger.stream import Decided, Outcomes, ledger_entry, stream_key
from limits.ledger.table import KIND_TABLE, decisions, kinds_forget
from limits.models.ledger import LedgerBatch, LedgerCount, LedgerEntry, LedgerKind
from limits.policy.services import QUIET_HOURS
from tests.support.clocks import instant
from tests.support.sends import make_job
from worker.chunks import send_chunk_run
from worker.gate import Gate, gate_check, gate_release

pytestmark = pytest.mark.postgres

NOW = 1_763_800_000.0  # 2025-11-22 08:26:40 UTC


@pytest.fixture
def snapshot(published):
    return published(vip=(10, [1, 2], {"email": (1, None)}))


def rows():
    return list(
        decisions()
        .order_by("id")
        .values_list("user_id", "message", "segment", "reason", "rule_id", "category")
    )


def test_every_decision_is_kept_with_what_decided_it(snapshot):
    gate_check(
        channel="email",
        requests=[(1, "a"), (1, "b"), (9, "c")],
        campaign="spring",
        tags=("promo",),
        priority=7,
        now=instant(NOW),
    )
    gate_check(
        channel="email", requests=[(9, "otp")], category="transactional", now=instant(NOW + 1)
    )
    gate_check(channel="email", requests=[(9, "dry")], dry_run=True, now=instant(NOW + 2))
    assert LedgerEntry.objects.count() == 0  # not yet drained: off the hot path
    assert ledger_drain_all() == 4
    found = rows()
    daily = found[1][4]
    assert daily is not None  # the vip daily cap's rule id
    assert found == [
        (1, "a", "vip", "allowed", None, "marketing"),
        (1, "b", "vip", "daily_cap", daily, "marketing"),
        (9, "c", "default", "allowed", None, "marketing"),
        (9, "otp", "default", "exempt", None, "transactional"),
    ]
    first = (
        decisions()
        .order_by("id")
        .values_list("at", "channel", "campaign", "tags", "priority", "snapshot_version")
        .first()
    )
    assert first == (datetime.fromtimestamp(NOW, tz=UTC), "email", "spring", ["promo"], 7, snapshot)


def test_quiet_hours_refusals_are_kept_too(snapshot):
    QUIET_HOURS.create(
        fields=QuietFields(
            segment=None, channel="all", start="08:00", end="09:00", spread_minutes=0
        )
    )
    gate_check(channel="email", requests=[(9, "q")], now=instant(NOW))
    ledger_drain_all()
    assert [r[3] for r in rows()] == ["quiet_hours"]


def test_a_drainer_that_dies_before_acknowledging_doubles_nothing(snapshot, redis_client):
    gate_check(channel="email", requests=[(9, "a"), (9, "b")], now=instant(NOW))
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    # A drainer read the entry, wrote it, committed, and died before XACK.
    [[_, [(entry_id, fields)]]] = redis_client.xreadgroup(GROUP, "dead", {key: ">"})
    ledger_write([ledger_entry(fields[b"d"])])  # type: ignore[list-item]
    LedgerBatch.objects.create(stream_id=entry_id.decode())
    # Another drainer, a minute later, claims the dead one's entry: acknowledged, not rewritten.
    redis_client.xclaim(key, GROUP, "dead", 0, [entry_id], idle=CLAIM_IDLE_MS + 1)
    report = ledger_drain()
    assert (report.entries, report.skipped, report.rows) == (1, 1, 0)
    assert [r[1] for r in rows()] == ["a", "b"]
    # The drainer that took over counted nothing again (the simulated dead one above wrote
    # the rows only; a real one commits its counts in the same transaction as its rows).
    assert not LedgerCount.objects.exists()
    assert redis_client.xlen(key) == 0


def test_a_drainer_that_dies_before_writing_loses_nothing(snapshot, redis_client):
    gate_check(channel="email", requests=[(9, "a")], now=instant(NOW))
    key = stream_key()
    redis_client.xgroup_create(key, GROUP, id="0", mkstream=True)
    [[_, [(entry_id, _)]]] = redis_client.xreadgroup(GROUP, "dead", {key: ">"})
    assert ledger_drain().entries == 0  # still the dead drainer's, not idle long enough
    redis_client.xclaim(key, GROUP, "dead", 0, [entry_id], idle=CLAIM_IDLE_MS + 1)
    assert ledger_drain().rows == 1
    assert [r[1] for r in rows()] == ["a"]


def test_a_gate_process_that_dies_after_the_limiter_loses_only_that_calls_ledger(snapshot):
    # What docs/ledger.md says a crash can lose: the decisions are in Redis's logs, and the
    # ledger never hears of them when the process dies before its XADD.
    Gate(record_ledger=False).check(channel="email", requests=[(1, "lost")], now=instant(NOW))
    gate_check(channel="email", requests=[(1, "kept")], now=instant(NOW + 1))
    ledger_drain_all()
    assert [(r[1], r[3]) for r in rows()] == [("kept", "daily_cap")]


def test_old_days_leave_whole(snapshot, settings):
    settings.GATEKEEPER_LEDGER_DAYS = 2
    now = datetime(2026, 11, 24, 12, tzinfo=UTC)
    for ago in (5, 3, 1, 0):
        gate_check(
            channel="email",
            requests=[(9, f"m{ago}")],
            campaign=f"c{ago}",
            now=now - timedelta(days=ago),
        )
    ledger_drain_all()
    report = ledger_upkeep(now=now)
    assert sorted(r[1] for r in rows()) == ["m0", "m1"]
    # The kinds only the dropped days used went with them.
    assert sorted(LedgerKind.objects.values_list("campaign", flat=True)) == ["c0", "c1"]
    if connection.vendor == "postgresql":
        assert report.dropped_days == [
            (now - timedelta(days=5)).date(),
            (now - timedelta(days=3)).date(),
        ]
        days = partitions_list()
        assert days[0] == (now - timedelta(days=1)).date()
        assert (now + timedelta(days=2)).date() in days  # made ahead of time
    else:
        assert report.deleted_rows == 2


def kind_writes(queries) -> int:
    return sum(KIND_TABLE in q["sql"] and "INSERT" in q["sql"] for q in queries.captured_queries)


def test_a_drainer_adds_each_kind_once_and_forgets_what_did_not_commit(
    snapshot, django_capture_on_commit_callbacks
):
    from django.test.utils import CaptureQueriesContext

    kinds_forget()
    gate_check(channel="email", requests=[(1, "a"), (9, "b")], campaign="k", now=instant(NOW))
    with (
        django_capture_on_commit_callbacks(execute=True),
        CaptureQueriesContext(connection) as queries,
    ):
        ledger_drain()
    assert kind_writes(queries) == 1  # the call's two kinds (vip and default), one statement
    # The same kinds again: known, no statement. A drain that rolls back leaves no kind known.
    gate_check(channel="email", requests=[(2, "c"), (9, "d")], campaign="k", now=instant(NOW + 1))
    gate_check(channel="push", requests=[(9, "e")], campaign="k", now=instant(NOW + 1))
    with (
        django_capture_on_commit_callbacks(execute=True),
        CaptureQueriesContext(connection) as queries,
    ):
        with pytest.raises(RuntimeError), transaction.atomic():
            ledger_write(
                [Decided(at_ms=int(NOW * 1000), channel="sms", campaign="gone", tags=[],
                         priority=5, category="marketing", version="", users=[3],
                         messages=["x"], segments=[""], reasons=["allowed"], rules=[None])]
            )  # fmt: skip
            raise RuntimeError("the drain's transaction fails")
        ledger_drain()
    assert kind_writes(queries) == 2  # the rolled-back one, and push's new kind; not email's
    assert not LedgerKind.objects.filter(campaign="gone").exists()
    assert sorted(r[1] for r in rows()) == ["a", "b", "c", "d", "e"]
    assert LedgerKind.objects.count() == 3


def test_one_drainer_at_a_time(snapshot, redis_client):
    gate_check(channel="email", requests=[(9, "a"), (9, "b")], now=instant(NOW))
    other = redis_client.lock(drainer_key(), timeout=60)
    assert other.acquire(blocking=False)  # another process is draining
    assert ledger_drain_all(wait=0) == 0  # beat's task: leaves it to the other
    assert ledger_drain_all(wait=0.3) == 0  # waited, and it is still at work
    assert redis_client.xlen(stream_key()) == 1 and rows() == []
    other.release()
    assert ledger_drain_all(wait=0) == 2
    assert not redis_client.exists(drainer_key())  # given back when done


def test_a_drainer_whose_lock_expired_during_a_round_stops_with_what_it_wrote(
    snapshot, redis_client, monkeypatch
):
    gate_check(channel="email", requests=[(9, "a")], now=instant(NOW))
    gate_check(channel="email", requests=[(9, "b")], now=instant(NOW + 1))
    real = drain.ledger_drain

    def outlasting(**kwargs):
        report = real(count=1, **{k: v for k, v in kwargs.items() if k != "count"})
        redis_client.delete(drainer_key())  # the lock's time ran out during the round
        return report

    monkeypatch.setattr(drain, "ledger_drain", outlasting)
    assert ledger_drain_all() == 1  # the round's work stands; no second round without the lock
    assert [r[1] for r in rows()] == ["a"]
    monkeypatch.undo()
    assert ledger_drain_all() == 1


def test_an_entry_no_drainer_can_read_is_dropped_and_holds_back_nothing(snapshot, redis_client):
    gate_check(channel="email", requests=[(9, "before")], now=instant(NOW))
    redis_client.xadd(stream_key(), {"d": b"\x93not msgpack of a gate call"})
    gate_check(channel="email", requests=[(9, "after")], now=instant(NOW + 1))
    report = ledger_drain()
    assert (report.entries, report.unreadable, report.rows) == (3, 1, 2)
    assert [r[1] for r in rows()] == ["before", "after"]
    assert redis_client.xlen(stream_key()) == 0


def counts() -> list[tuple]:
    return list(
        LedgerCount.objects.order_by("hour", "campaign", "reason").values_list(
            "hour", "channel", "campaign", "segment", "reason", "count"
        )
    )


def test_each_hour_is_counted_by_campaign_segment_channel_and_reason(snapshot):
    hour = datetime.fromtimestamp(NOW, tz=UTC).replace(minute=0, second=0, microsecond=0)
    gate_check(
        channel="email", requests=[(1, "a"), (1, "b"), (9, "c")], campaign="x", now=instant(NOW)
    )
    ledger_drain_all()
    gate_check(channel="email", requests=[(2, "d"), (2, "e")], campaign="x", now=instant(NOW + 60))
    gate_check(channel="email", requests=[(9, "f")], campaign="y", now=instant(NOW + 3600))
    ledger_drain_all()
    assert counts() == [
        (hour, "email", "x", "default", "allowed", 1),
        (hour, "email", "x", "vip", "allowed", 2),  # added to by the second drain
        (hour, "email", "x", "vip", "daily_cap", 2),
        (hour + timedelta(hours=1), "email", "y", "default", "allowed", 1),
    ]


def outcomes() -> dict[str, str]:
    return dict(decisions().values_list("message", "outcome"))


def test_what_became_of_each_dispatched_send_is_on_its_row(snapshot, relay):
    relay.statuses = [200, 400, 200]
    job = make_job(1, 2, 9, channel="push", campaign="m")
    assert send_chunk_run(chunk_id=job.chunks.get().pk) == {"sent": 2, "failed": 1}
    report = ledger_drain()
    # Four outcomes matched their rows: three dispatches, and the failed send's release,
    # which leaves its outcome "failed".
    assert (report.rows, report.outcomes, report.unmatched) == (3, 4, 0)
    assert outcomes() == {"m:1": "sent", "m:2": "failed", "m:9": "sent"}


def test_outcomes_find_their_rows_by_lookup_in_a_day_never_analyzed(db):
    # A day's partition just filled by the drain has no statistics. The outcomes' statement
    # must still find each row through the user_id index: a plan that reads the whole
    # partition per outcome took 27 s for 500 outcomes on 200,000 rows.
    users = list(range(1, 20_001))
    call = Decided(
        at_ms=int(NOW * 1000), channel="push", campaign="big", tags=[], priority=5,
        category="marketing", version="v1", users=users,
        messages=[f"big:{user}" for user in users], segments=["vip"] * len(users),
        reasons=["allowed"] * len(users), rules=[None] * len(users),
    )  # fmt: skip
    since = datetime.fromtimestamp(NOW - 60, tz=UTC)
    found = Outcomes(
        since_ms=int(since.timestamp() * 1000),
        channel="push",
        rows=[(user, f"big:{user}", "sent") for user in users[::40]],
    )
    with transaction.atomic():
        ledger_write([call])
        statement = outcomes_sql(len(found.rows), connection.vendor)
        at = connection.ops.adapt_datetimefield_value(since)
        parameters = [
            *(v for i, (user, message, _) in enumerate(found.rows) for v in (user, message, i)),
            "push",
            at,
        ]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"EXPLAIN {statement}", parameters)
                plan = "\n".join(line for (line,) in cursor.fetchall())
                scans = re.findall(r"Seq Scan on (\S+)", plan)
            else:
                cursor.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
                plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
                scans = re.findall(r"SCAN (\w+)", plan)
        # The ledger's table is `e` in the statement (SQLite's plan names it so).
        assert not [name for name in scans if name.startswith(TABLE) or name == "e"], plan
        assert outcomes_write(found) == len(found.rows)
    assert LedgerEntry.objects.filter(outcome="sent").count() == 500
    assert decisions().get(message="big:41").outcome == "sent"
    assert decisions().get(message="big:42").outcome == ""


def test_a_send_given_back_over_the_api_is_marked_released(snapshot):
    # Now, not NOW: a release finds its decision within the longest window back from now.
    gate_check(channel="email", requests=[(9, "kept"), (9, "back")])
    ledger_drain_all()
    assert gate_release(channel="email", requests=[(9, "back"), (9, "never-gated")]) == [
        True,
        False,
    ]
    report = ledger_drain()
    assert (report.outcomes, report.unmatched) == (1, 0)  # nothing said of what was not there
    assert outcomes() == {"kept": "", "back": "released"}


@pytest.mark.parametrize("rounds", ["one round", "a round each"])
def test_a_send_given_back_then_admitted_again_keeps_each_decisions_own_outcome(snapshot, rounds):
    """An outcome falls on the decisions before it in the stream, never on a later one of the
    same message: given back, the message is admitted again, and that send went out."""
    from worker.gate import gate_outcomes

    def admitted(at: float) -> None:
        gate_check(channel="email", requests=[(9, "again")], now=instant(at))
        if rounds == "a round each":
            ledger_drain_all()

    admitted(NOW)
    assert gate_release(channel="email", requests=[(9, "again")]) == [True]
    gate_outcomes(channel="email", since=instant(NOW - 1), outcomes=[(9, "again", "released")])
    admitted(NOW + 60)
    ledger_drain_all()
    found = list(decisions().order_by("id").values_list("reason", "outcome"))
    assert found == [("allowed", "released"), ("allowed", "")]


def test_entries_of_the_first_format_are_still_written(snapshot, redis_client):
    # What an upgrade finds waiting in the stream: decisions packed a list per decision.
    import msgspec

    from limits.ledger.stream import DecidedRows

    old = DecidedRows(
        at_ms=round(NOW * 1000), channel="email", campaign="c", tags=["t"], priority=5,
        category="marketing", version="v1", rows=[(4, "old-a", "", "allowed", None),
                                                   (5, "old-b", "vip", "daily_cap", 7)],
    )  # fmt: skip
    redis_client.xadd(stream_key(), {"d": msgspec.msgpack.encode(old)})
    assert ledger_drain().rows == 2
    assert rows() == [
        (4, "old-a", "", "allowed", None, "marketing"),
        (5, "old-b", "vip", "daily_cap", 7, "marketing"),
    ]


def test_each_decision_keeps_the_zone_its_request_named(
    snapshot, django_capture_on_commit_callbacks
):
    from limits.people.suppression import erased_add

    with django_capture_on_commit_callbacks(execute=True):
        erased_add([7])  # refused and never named: the zones stay with the decisions kept
    gate_check(
        channel="email",
        requests=[(7, "gone"), (9, "a"), (8, "b")],
        time_zones=["Asia/Tokyo", "Europe/London", None],
        now=instant(NOW),
    )
    gate_check(
        channel="push", requests=[(9, "otp"), (8, "code")], category="transactional",
        time_zones=[None, "America/New_York"], now=instant(NOW + 1),
    )  # fmt: skip
    gate_check(channel="email", requests=[(6, "c")], now=instant(NOW + 2))
    assert ledger_drain_all() == 5
    found = list(decisions().order_by("id").values_list("user_id", "message", "reason", "zone"))
    assert found == [
        (9, "a", "allowed", "Europe/London"),
        (8, "b", "allowed", ""),
        (9, "otp", "exempt", ""),
        (8, "code", "exempt", "America/New_York"),
        (6, "c", "allowed", ""),
    ]
    # Two decisions alike but for their zone are of two kinds; a call that named no zone
    # shares the kind of a decision whose request named none.
    a, b, _, _, c = LedgerEntry.objects.order_by("id").values_list("kind_id", flat=True)
    assert a != b and b == c
    assert LedgerKind.objects.get(pk=a).zone == "Europe/London"
    assert LedgerKind.objects.get(pk=b).zone == ""


def test_entries_written_before_zones_were_kept_are_still_written(snapshot, redis_client):
    import msgspec

    from limits.ledger.stream import DECIDED

    class Before(msgspec.Struct, array_like=True, tag=DECIDED, frozen=True):
        """Decided as the gate packed it before it had zones."""

        at_ms: int
        channel: str
        campaign: str
        tags: list[str]
        priority: int
        category: str
        version: str
        users: list[int]
        messages: list[str]
        segments: list[str]
        reasons: list[str]
        rules: list[int | None]
        topic: str = ""
        arms: list[int] = []

    old = Before(
        at_ms=round(NOW * 1000), channel="email", campaign="c", tags=["t"], priority=5,
        category="marketing", version="v1", users=[4, 5], messages=["old-a", "old-b"],
        segments=["", "vip"], reasons=["allowed", "daily_cap"], rules=[None, 7], topic="news",
    )  # fmt: skip
    packed = msgspec.msgpack.encode(old)
    entry = ledger_entry(packed)
    assert isinstance(entry, Decided) and (entry.topic, entry.zones) == ("news", [])
    redis_client.xadd(stream_key(), {"d": packed})
    assert ledger_drain().rows == 2
    assert list(decisions().order_by("id").values_list("message", "topic", "zone")) == [
        ("old-a", "news", ""),
        ("old-b", "news", ""),
    ]


def test_outcomes_drained_with_their_decisions_are_written_with_them_not_updated(snapshot):
    from django.test.utils import CaptureQueriesContext

    from worker.gate import gate_outcomes

    gate_check(channel="email", requests=[(1, "w:1"), (9, "w:9")], campaign="w", now=instant(NOW))
    gate_outcomes(
        channel="email", since=instant(NOW - 1), outcomes=[(1, "w:1", "sent"), (9, "w:9", "failed")]
    )
    with CaptureQueriesContext(connection) as queries:
        report = ledger_drain()
    assert (report.rows, report.outcomes, report.unmatched) == (2, 2, 0)
    assert not [
        q for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")
    ]
    # An outcome whose decision an earlier round wrote still finds its row; a release keeps
    # the outcome already known.
    gate_outcomes(
        channel="email",
        since=instant(NOW - 1),
        outcomes=[(9, "w:9", "released"), (1, "w:1", "ambiguous")],
    )
    report = ledger_drain()
    assert (report.outcomes, report.unmatched) == (2, 0)
    assert outcomes() == {
        "w:1": "ambiguous",
        "w:9": "failed",
    }
