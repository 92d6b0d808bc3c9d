"""The send ledger: every gate decision of a marketing send (and every exempt transactional
one; never a dry run) kept durably in the database, for a user's history, capped-send
analytics and rebuilding Redis's logs after Redis lost them.

Written off the hot path, in two steps:

1. **Append** (the gate, per call): one XADD to the Redis stream `<prefix>ledger` holding the
   whole batch packed with msgpack (the call's own fields once, then per decision its user id,
   message id, segment, reason and deciding rule): one round trip and about 30 bytes per
   decision, however large the batch.
2. **Drain** (`ledger_drain`, beat every 2 s): reads the stream as the consumer group `drain`,
   writes the decisions in one transaction (COPY on PostgreSQL, bulk inserts on SQLite) together
   with the ids of the stream entries written (`LedgerBatch`), then acknowledges and deletes the
   entries. A drainer that dies after reading leaves its entries pending: the next drain claims
   them once they have been idle for CLAIM_IDLE_MS. One that dies after committing and before
   acknowledging leaves entries whose ids are already in `LedgerBatch`: they are acknowledged
   without being written again. So each decision is written exactly once.

What a crash can lose (docs/ledger.md): a gate process that dies between the limiter's answer
and the XADD loses that call's decisions from the ledger (Redis's logs have them); Redis losing
its data loses the entries not drained yet (a few seconds' worth) together with its logs.
Nothing else.
"""

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgspec
import redis
from django.conf import settings
from django.db import connection, transaction

from gatekeeper.lib.redis_client import RedisClient, get_redis
from limits.models import LedgerBatch, LedgerEntry

logger = logging.getLogger(__name__)

STREAM = "ledger"
GROUP = "drain"
FORMAT = 1
CLAIM_IDLE_MS = 60_000  # a pending entry this long unacknowledged belongs to a dead drainer
TABLE = LedgerEntry._meta.db_table
COLUMNS = (
    "at",
    "user_id",
    "channel",
    "campaign",
    "tags",
    "priority",
    "segment",
    "snapshot_version",
    "reason",
    "rule_id",
    "message_id",
    "category",
)


def stream_key() -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}{STREAM}"


def ledger_enabled() -> bool:
    return bool(settings.GATEKEEPER_LEDGER)


def ledger_append(
    *,
    at: float,
    channel: str,
    campaign: str,
    tags: Sequence[str],
    priority: int,
    category: str,
    snapshot_version: str,
    decisions: Sequence[Any],
    client: RedisClient | None = None,
) -> bool:
    """Append one gate call's decisions to the ledger's stream. False (and a warning) when Redis
    cannot take them: the decisions stand, the ledger misses them."""
    if not decisions:
        return True
    rows = [
        (
            d.user_id,
            d.message_id,
            d.segment or "",
            d.reason,
            d.rule["id"] if d.rule else None,
        )
        for d in decisions
    ]
    packed = msgspec.msgpack.encode(
        (
            FORMAT,
            round(at * 1000),
            channel,
            campaign,
            list(tags),
            priority,
            category,
            snapshot_version,
            rows,
        )
    )
    try:
        (client or get_redis()).xadd(
            stream_key(),
            {"d": packed},
            maxlen=settings.GATEKEEPER_LEDGER_BUFFER_MAX,
            approximate=True,
        )
    except redis.RedisError as exc:
        logger.warning("%d decisions could not be written to the ledger: %s", len(rows), exc)
        return False
    return True


def ledger_rows(packed: bytes) -> list[tuple[Any, ...]]:
    """A stream entry's decisions as rows of COLUMNS."""
    fmt, at_ms, channel, campaign, tags, priority, category, version, rows = msgspec.msgpack.decode(
        packed
    )
    if fmt != FORMAT:
        raise ValueError(f"ledger entry of format {fmt}; this version reads {FORMAT}")
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    return [
        (
            at,
            user_id,
            channel,
            campaign,
            tags,
            priority,
            segment,
            version,
            reason,
            rule_id,
            message_id,
            category,
        )
        for user_id, message_id, segment, reason, rule_id in rows
    ]


@dataclass
class Drained:
    entries: int = 0  # stream entries taken
    rows: int = 0  # decisions written
    skipped: int = 0  # stream entries already written by a drainer that died before acking
    unreadable: int = 0  # stream entries no drainer can read (dropped, logged)


def _consumer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _group(client: RedisClient, key: str) -> None:
    try:
        client.xgroup_create(key, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def ledger_drain(*, count: int = 200, client: RedisClient | None = None) -> Drained:
    """Move up to `count` stream entries (gate calls) into the database, exactly once. Entries
    a dead drainer left pending are taken first."""
    client = client or get_redis()
    key = stream_key()
    _group(client, key)
    consumer = _consumer()
    claimed: Any = client.xautoclaim(key, GROUP, consumer, CLAIM_IDLE_MS, "0-0", count=count)
    entries: list[Any] = list(claimed[1]) if claimed else []
    if len(entries) < count:
        read: Any = client.xreadgroup(GROUP, consumer, {key: ">"}, count=count - len(entries))
        for _, found in read or []:  # [[key, [(id, fields), ...]]] (RESP2)
            entries.extend(found)
    report = Drained(entries=len(entries))
    if not entries:
        return report
    ids = [_text(entry_id) for entry_id, _ in entries]
    with transaction.atomic():
        done = set(
            LedgerBatch.objects.filter(stream_id__in=ids).values_list("stream_id", flat=True)
        )
        rows: list[tuple[Any, ...]] = []
        for (_, fields), text_id in zip(entries, ids, strict=True):
            if text_id in done:
                report.skipped += 1
                continue
            try:
                rows.extend(ledger_rows((fields or {}).get(b"d") or b""))
            except (msgspec.DecodeError, ValueError, TypeError) as exc:
                # Written by no gate of this version (or cut short): kept out, and marked
                # written, so that it does not hold back the good entries around it for ever.
                logger.error(
                    "Ledger stream entry %s cannot be read and is dropped: %s", text_id, exc
                )
                report.unreadable += 1
        ledger_write(rows)
        LedgerBatch.objects.bulk_create(
            [LedgerBatch(stream_id=text_id) for text_id in ids if text_id not in done]
        )
        report.rows = len(rows)
    client.xack(key, GROUP, *ids)
    client.xdel(key, *ids)
    return report


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- the table ---------------------------------------------------------------------------------


def ledger_write(rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert decisions (rows of COLUMNS) in the current transaction: COPY on PostgreSQL, into
    the day partitions (made when missing), bulk inserts elsewhere."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        partitions_ensure({row[0].date() for row in rows})
        with connection.cursor() as cursor:
            sql = f"COPY {TABLE} ({', '.join(COLUMNS)}) FROM STDIN"
            with cursor.cursor.copy(sql) as copy:
                for row in rows:
                    copy.write_row((*row[:4], msgspec.json.encode(row[4]).decode(), *row[5:]))
        return
    LedgerEntry.objects.bulk_create(
        [LedgerEntry(**dict(zip(COLUMNS, row, strict=True))) for row in rows], batch_size=500
    )


def _partition(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def partitions_ensure(days: set[date]) -> None:
    """PostgreSQL: the day partitions of `days`, created when missing. Looked up each time (a
    catalog read per day written): a partition another process dropped, or a transaction that
    made one and rolled back, must not be taken for there."""
    with connection.cursor() as cursor:
        for day in sorted(days):
            name = _partition(day)
            cursor.execute("SELECT to_regclass(%s)", [name])
            if cursor.fetchone()[0] is not None:
                continue
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {TABLE} FOR VALUES FROM "
                f"('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
            )


def partitions_list() -> list[date]:
    """PostgreSQL: the days the ledger has partitions for, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [TABLE],
        )
        names = [name for (name,) in cursor.fetchall()]
    prefix = f"{TABLE}_p"
    return sorted(
        datetime.strptime(name[len(prefix) :], "%Y%m%d").date()
        for name in names
        if name.startswith(prefix)
    )


@dataclass
class Upkeep:
    dropped_days: list[date]
    deleted_rows: int


def ledger_upkeep(*, now: datetime | None = None) -> Upkeep:
    """Keep GATEKEEPER_LEDGER_DAYS days: on PostgreSQL, drop whole day partitions older than
    that and make the next two days' ahead of time; elsewhere delete the old rows in batches.
    Also forgets the ids of stream entries drained more than a day ago."""
    now = now or datetime.now(tz=UTC)
    keep_from = (now - timedelta(days=int(settings.GATEKEEPER_LEDGER_DAYS))).date()
    report = Upkeep(dropped_days=[], deleted_rows=0)
    if connection.vendor == "postgresql":
        today = now.date()
        partitions_ensure({today, today + timedelta(days=1), today + timedelta(days=2)})
        for day in partitions_list():
            if day < keep_from:
                with connection.cursor() as cursor:
                    cursor.execute(f"DROP TABLE IF EXISTS {_partition(day)}")
                report.dropped_days.append(day)
    else:
        cutoff = datetime.combine(keep_from, datetime.min.time(), tzinfo=UTC)
        while True:
            ids = list(
                LedgerEntry.objects.filter(at__lt=cutoff).values_list("pk", flat=True)[:10_000]
            )
            if not ids:
                break
            report.deleted_rows += LedgerEntry.objects.filter(pk__in=ids).delete()[0]
    LedgerBatch.objects.filter(drained_at__lt=now - timedelta(days=1)).delete()
    return report


def ledger_drain_all(
    *, rounds: int | None = None, seconds: float = 10.0, client: RedisClient | None = None
) -> int:
    """Drain until the stream is empty, `rounds` drains were made or `seconds` passed (beat's
    task; tests and commands that must see every decision). Returns the decisions written."""
    deadline = time.monotonic() + seconds
    written, made = 0, 0
    while True:
        report = ledger_drain(client=client)
        written, made = written + report.rows, made + 1
        if not report.entries or made == rounds or time.monotonic() > deadline:
            return written
