"""The event stream: every gate decision the ledger keeps, every send outcome, and every change
of the suppression list and of people's preferences, in one order, for the company's systems
(a warehouse loader pulls them, `GET /api/v1/stream/`; webhooks are posted them).

Fed by the drain, not by the gate: in the transaction that writes a round of the ledger's
stream, the drain adds a `StreamBatch` per run of events it wrote (a range of ledger rows, the
rows that took an outcome, a range of a journal). A batch names no one and holds no event: an
event is read from the row it points at when it is asked for, so it says what the row says
then, and an erasure or the ledger's upkeep that removes the row removes its events. The gate
pays nothing for the stream.

Order. Batches commit in the order of their ids: the drain that makes them runs one at a time
(the drainer's lock in Redis, and on PostgreSQL an advisory lock of the transaction's, should
that lock have run out), and the journals commit in the order of their ids too (their writers
take a lock row first). So a reader that has read batch N has seen every batch before it, and a
position, `<batch>.<key>` (the last event read: its row's id, or its place in an outcome batch),
is a resumable cursor. Events before the stream existed (journal changes made before its first
drain, decisions written before it) are not in it.

Event ids: `d<row>` a decision, `o<row>.<outcome>` its outcome, `s<change>` a suppression
change, `p<change>` a preferences change; the same event always has the same id, so a consumer
that sees one twice (delivery is at least once) drops the second.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
from django.db import connection
from django.utils import timezone

from limits.ledger.table import kinds_read, message_of
from limits.models import (
    LEDGER_OUTCOMES,
    LedgerEntry,
    PreferenceChange,
    StreamBatch,
    SuppressionChange,
)

Source = StreamBatch.Source
EVENT_TYPES = ("decision", "outcome", "suppression", "preferences")
PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
LOOK_MAX = 100_000  # rows one read looks at, whatever its filters keep: then it returns
OUTCOME_REF = np.dtype([("row", ">i8"), ("code", "u1")])
TABLE = LedgerEntry._meta.db_table
DRAIN_LOCK = 0x67_6B_73_74  # PostgreSQL advisory lock of the drain's transaction ("gkst")
JOURNALS: dict[int, type[SuppressionChange] | type[PreferenceChange]] = {
    Source.SUPPRESSION: SuppressionChange,
    Source.PREFERENCES: PreferenceChange,
}


@dataclass(frozen=True, order=True)
class Position:
    """A place in the stream: after the event `key` of batch `batch` (0: none of it read)."""

    batch: int
    key: int = 0

    def __str__(self) -> str:
        return f"{self.batch}.{self.key}"


START = Position(0, 0)
POSITION_WORDS = "a position the stream gave (`next`), `0` for its start, or `end` for its end"


def position_from_text(text: str) -> Position:
    """A position as the stream writes it; ValueError naming the problem otherwise."""
    if text == "0":
        return START
    if text == "end":
        return stream_end()
    batch, dot, key = text.partition(".")
    digits = all(p.isascii() and p.isdigit() and len(p) <= 18 for p in (batch, key))
    if dot and digits:
        return Position(int(batch), int(key))
    raise ValueError(f"{text!r} is not {POSITION_WORDS}")


def stream_end() -> Position:
    """The position after the last event there is now (where a new consumer starts when it
    wants only what comes next)."""
    last = StreamBatch.objects.order_by("-id").values_list("id", "source", "last", "refs").first()
    if last is None:
        return START
    batch, source, last_key, refs = last
    if source == Source.OUTCOMES:
        last_key = len(bytes(refs or b"")) // OUTCOME_REF.itemsize
    return Position(batch, last_key)


# --- writing (the drain, in its transaction) ---------------------------------------------------


def drain_serialized() -> None:
    """PostgreSQL: the drain's transaction waits for any other drain's to end, so that batches
    commit in the order of their ids even when the drainer's lock in Redis ran out under a
    drain that long (elsewhere a database takes one writer at a time)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [DRAIN_LOCK])


def decisions_batched(first: int, last: int, since: datetime, until: datetime) -> None:
    """The ledger rows `first` to `last` (decided from `since` to `until`), just written."""
    if last >= first:
        StreamBatch.objects.create(
            source=Source.DECISIONS, first=first, last=last, since=since, until=until,
            made_at=timezone.now(),
        )  # fmt: skip


def outcomes_batched(taken: Sequence[tuple[int, int, datetime]]) -> None:
    """Rows that took an outcome: (row id, outcome code, the row's time), in the order they
    took it."""
    if not taken:
        return
    refs = np.array([(row, code) for row, code, _ in taken], dtype=OUTCOME_REF)
    times = [at for _, _, at in taken]
    StreamBatch.objects.create(
        source=Source.OUTCOMES, first=int(refs["row"].min()), last=int(refs["row"].max()),
        since=min(times), until=max(times), refs=refs.tobytes(),
        made_at=timezone.now(),
    )  # fmt: skip


def journals_batched(now: datetime) -> int:
    """The suppression list's and preferences' changes committed since the stream last took
    them, as a batch each. The first time, the stream starts at the journals' end (a batch of
    nothing marks where). Returns the changes taken."""
    taken = 0
    for source, model in JOURNALS.items():
        mark = StreamBatch.objects.filter(source=source).order_by("-id").values_list("last").first()
        newest = model.objects.order_by("-id").values_list("id", flat=True).first() or 0
        if mark is None:
            StreamBatch.objects.create(source=source, first=newest + 1, last=newest, made_at=now)
            continue
        if newest > mark[0]:
            StreamBatch.objects.create(source=source, first=mark[0] + 1, last=newest, made_at=now)
            taken += newest - mark[0]
    return taken


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """Which events a reader wants: by type, channel and campaign (empty: every one). A
    channel filter keeps the events of those channels, suppressions of every channel (`all`)
    and preference changes (they concern every channel); a campaign filter keeps only the
    decisions and outcomes of those campaigns."""

    types: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()
    campaigns: frozenset[str] = frozenset()

    def keeps(self, event: dict[str, Any]) -> bool:
        if self.types and event["type"] not in self.types:
            return False
        if self.channels:
            channel = event.get("channel")
            if channel is not None and channel != "all" and channel not in self.channels:
                return False
        return not self.campaigns or event.get("campaign") in self.campaigns

    def wants(self, source: int) -> bool:
        """Whether any event of a batch from `source` can pass (a batch of none is not read)."""
        if self.campaigns and source not in (Source.DECISIONS, Source.OUTCOMES):
            return False
        return not self.types or _SOURCE_TYPE[source] in self.types


EVERY = Filters()  # no filter: every event

_SOURCE_TYPE: dict[int, str] = {
    Source.DECISIONS: "decision",
    Source.OUTCOMES: "outcome",
    Source.SUPPRESSION: "suppression",
    Source.PREFERENCES: "preferences",
}


@dataclass
class Page:
    events: list[dict[str, Any]]
    next: Position  # where the next read starts
    more: bool  # whether there was more to read after `next` when this was read


def stream_read(
    after: Position = START, limit: int = PAGE_DEFAULT, filters: Filters = EVERY
) -> Page:
    """Up to `limit` events after `after`, in stream order. Looks at no more than LOOK_MAX rows
    (a filter that keeps few of them returns fewer events, and `next` past those it looked
    at): a reader asks again from `next` while `more`."""
    events: list[dict[str, Any]] = []
    position, looked = after, 0
    batches = StreamBatch.objects.filter(id__gte=max(after.batch, 1)).order_by("id")
    for batch in batches.iterator(chunk_size=200):
        if batch.id != after.batch:
            position = Position(batch.id, 0)
        if not filters.wants(batch.source):
            position = Position(batch.id, _batch_end(batch))
            continue
        while len(events) < limit and looked < LOOK_MAX:
            span = min(LOOK_MAX - looked, 2 * (limit - len(events)) + 100)
            found, key, seen = _read(batch, position.key, span)
            looked += seen
            events.extend(e for e in found if filters.keeps(e))
            position = Position(batch.id, key)
            if key >= _batch_end(batch):
                break
        if len(events) >= limit or looked >= LOOK_MAX:
            break
    del events[limit:]  # a last read's extra (its position is then an event's, see below)
    if len(events) == limit and events:
        position = _position_of(events[-1], position)
    return Page(events=events, next=position, more=position < stream_end())


def _batch_end(batch: StreamBatch) -> int:
    if batch.source == Source.OUTCOMES:
        return len(bytes(batch.refs or b"")) // OUTCOME_REF.itemsize
    return batch.last


def _position_of(event: dict[str, Any], at: Position) -> Position:
    return Position(at.batch, event["_key"])


def _read(batch: StreamBatch, key: int, span: int) -> tuple[list[dict[str, Any]], int, int]:
    """The events of `batch` after `key`, looking at up to `span` of its places: (the events,
    the key read up to, places looked at)."""
    lower = max(key, batch.first - 1)  # rows after this one (outcomes: places)
    upto = min(batch.last, lower + span)
    if batch.source == Source.DECISIONS:
        rows = _rows("id > %s AND id <= %s", [lower, upto], batch)
        return [_decision(row) for row in rows], upto, upto - lower
    if batch.source == Source.OUTCOMES:
        refs = np.frombuffer(bytes(batch.refs or b""), dtype=OUTCOME_REF)
        part = refs[key : key + span]
        by_id = {
            row[0]: row
            for row in _rows(
                "id >= %s AND id <= %s AND id IN (" + ", ".join(["%s"] * len(part)) + ")",
                [int(part["row"].min()), int(part["row"].max()), *map(int, part["row"])],
                batch,
            )
        } if len(part) else {}  # fmt: skip
        made = batch.made_at
        found = [
            _outcome(by_id[int(ref["row"])], int(ref["code"]), made, key + place + 1)
            for place, ref in enumerate(part)
            if int(ref["row"]) in by_id
        ]
        return found, key + len(part), len(part)
    looked = upto - lower
    if batch.source == Source.SUPPRESSION:
        changes = SuppressionChange.objects.filter(id__gt=lower, id__lte=upto).order_by("id")
        return [_suppression(change) for change in changes], upto, looked
    changed = PreferenceChange.objects.filter(id__gt=lower, id__lte=upto).order_by("id")
    return [_preferences(change) for change in changed], upto, looked


Row = tuple[int, datetime, int, int, int, str | None]


def _rows(where: str, params: list[Any], batch: StreamBatch) -> list[Row]:
    """Ledger rows (id, at, user, kind, outcome code, stored message id), in id order; read from
    the batch's days only (PostgreSQL reads only their partitions)."""
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, at, user_id, kind_id, outcome, message_id FROM {TABLE} "
            f"WHERE {where} AND at >= %s AND at <= %s ORDER BY id",
            [*params, adapt(batch.since), adapt(batch.until)],
        )
        rows = cursor.fetchall()
    kinds_read({row[3] for row in rows})
    if connection.vendor != "sqlite":
        return rows
    return [(r[0], row_time(r[1]), *r[2:]) for r in rows]


def row_time(value: Any) -> datetime:
    """A ledger row's time as a raw query reads it: SQLite gives it as a naive or text time."""
    if connection.vendor != "sqlite":
        return cast(datetime, value)
    ops: Any = connection.ops
    return cast(datetime, ops.convert_datetimefield_value(value, None, connection))


def _instant(at: datetime) -> str:
    spec = "milliseconds" if at.microsecond % 1000 == 0 else "microseconds"
    return at.isoformat(timespec=spec).replace("+00:00", "Z")


def _decision(row: Row) -> dict[str, Any]:
    row_id, at, user_id, kind_id, _, stored = row
    kind = kinds_read((kind_id,))[kind_id]
    return {
        "id": f"d{row_id}",
        "type": "decision",
        "at": _instant(at),
        "user_id": user_id,
        "channel": kind["channel"],
        "campaign": kind["campaign"],
        "message_id": message_of(kind["campaign"], user_id, stored),
        "reason": kind["reason"],
        "rule_id": kind["rule_id"],
        "segment": kind["segment"],
        "tags": kind["tags"],
        "priority": kind["priority"],
        "category": kind["category"],
        "topic": kind["topic"],
        "snapshot_version": kind["snapshot_version"],
        "experiment": kind["experiment"],
        "arm": kind["arm"],
        "_key": row_id,
    }


def _outcome(row: Row, code: int, made: datetime, key: int) -> dict[str, Any]:
    row_id, at, user_id, kind_id, _, stored = row
    kind = kinds_read((kind_id,))[kind_id]
    outcome = LEDGER_OUTCOMES[code]
    return {
        "id": f"o{row_id}.{outcome}",
        "type": "outcome",
        "at": _instant(made),
        "decision": f"d{row_id}",
        "decided_at": _instant(at),
        "user_id": user_id,
        "channel": kind["channel"],
        "campaign": kind["campaign"],
        "message_id": message_of(kind["campaign"], user_id, stored),
        "outcome": outcome,
        "_key": key,
    }


def _suppression(change: SuppressionChange) -> dict[str, Any]:
    return {
        "id": f"s{change.id}",
        "type": "suppression",
        "at": _instant(change.at),
        "user_id": change.user_id,
        "channel": change.channel,
        "action": change.action,
        "reason": change.reason,
        "source": change.source,
        "_key": change.id,
    }


def _preferences(change: PreferenceChange) -> dict[str, Any]:
    return {
        "id": f"p{change.pk}",
        "type": "preferences",
        "at": _instant(change.changed_at),
        "user_id": change.user_id,
        "source": change.source,
        "preferences": change.after,
        "_key": change.pk,
    }


def events_public(events: Collection[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events as they are given out (without the stream's own bookkeeping)."""
    return [{k: v for k, v in e.items() if k != "_key"} for e in events]
