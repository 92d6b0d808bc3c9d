"""Upgrading the ledger to rows that name their kind (migration 0013): every row of the old
table comes through with the same id, time, user, fields, message id and outcome, on SQLite and
on PostgreSQL's day partitions; the drain then goes on writing after the ids it kept."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from limits.ledger.drain import ledger_write
from limits.ledger.stream import Decided
from limits.ledger.table import decisions, kinds_forget
from limits.models.ledger import LedgerKind

pytestmark = pytest.mark.postgres

BEFORE = [("limits", "0012_change_label")]
NOW = datetime(2025, 11, 22, 8, 26, 40, tzinfo=UTC)
OLD_COLUMNS = (
    "id, at, user_id, channel, campaign, tags, priority, segment, snapshot_version, reason, "
    "rule_id, message_id, category, outcome"
)


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


OLD_ROWS = [
    # id, at, user, channel, campaign, tags, priority, segment, version, reason, rule, message,
    # category, outcome
    (7, NOW, 1, "email", "spring", '["promo"]', 5, "vip", "v1", "allowed", None, "spring:1",
     "marketing", "sent"),
    (8, NOW, 2, "email", "spring", '["promo"]', 5, "vip", "v1", "daily_cap", 3, "spring:2",
     "marketing", ""),
    (9, NOW + timedelta(days=1), 1, "push", "", "[]", 5, "", "", "exempt", None, "otp-1",
     "transactional", "ambiguous"),
    (12, NOW + timedelta(days=1), 3, "email", "spring", '["promo", "b"]', 5, "vip", "v1",
     "allowed", None, "own-id", "marketing", "released"),
]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_every_old_row_comes_through_whole():
    migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                for day in (NOW.date(), NOW.date() + timedelta(days=1)):
                    cursor.execute(
                        f"CREATE TABLE limits_ledgerentry_p{day:%Y%m%d} PARTITION OF "
                        f"limits_ledgerentry FOR VALUES FROM ('{day}') TO "
                        f"('{day + timedelta(days=1)}')"
                    )
            marks = ", ".join(["%s"] * 14)
            for row in OLD_ROWS:
                at = connection.ops.adapt_datetimefield_value(row[1])
                cursor.execute(
                    f"INSERT INTO limits_ledgerentry ({OLD_COLUMNS}) VALUES ({marks})",
                    [row[0], at, *row[2:]],
                )
    finally:
        migrate(latest())
    kinds_forget()
    found = list(
        decisions()
        .order_by("id")
        .values_list(
            "id", "at", "user_id", "channel", "campaign", "tags", "priority", "segment",
            "snapshot_version", "reason", "rule_id", "message", "category", "outcome",
        )
    )  # fmt: skip
    assert found == [(*row[:5], json.loads(row[5]), *row[6:]) for row in OLD_ROWS]
    # The campaign's own message ids are not kept; the others are.
    assert list(decisions().order_by("id").values_list("message_id", flat=True)) == [
        None,
        None,
        "otp-1",
        "own-id",
    ]
    assert LedgerKind.objects.count() == 4
    # New rows take ids after the old ones, and find the kinds the upgrade made.
    ledger_write(
        [
            Decided(
                at_ms=int(NOW.timestamp() * 1000), channel="email", campaign="spring",
                tags=["promo"], priority=5, category="marketing", version="v1", users=[4],
                messages=["spring:4"], segments=["vip"], reasons=["allowed"], rules=[None],
            )
        ]
    )  # fmt: skip
    assert decisions().order_by("id").values_list("id", "message").last() == (13, "spring:4")
    assert LedgerKind.objects.count() == 4
    # And back: unapplied, the migration puts every row back with all its fields.
    migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {OLD_COLUMNS} FROM limits_ledgerentry ORDER BY id")
            back = cursor.fetchall()
    finally:
        migrate(latest())
        kinds_forget()
    expected = [*OLD_ROWS, (13, NOW, 4, "email", "spring", '["promo"]', 5, "vip", "v1",
                            "allowed", None, "spring:4", "marketing", "")]  # fmt: skip
    assert [
        (row[0], *row[2:5], json.loads(row[5]) if isinstance(row[5], str) else row[5], *row[6:])
        for row in back
    ] == [(row[0], *row[2:5], json.loads(row[5]), *row[6:]) for row in expected]
