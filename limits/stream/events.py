"""The event stream: every gate decision the ledger keeps, every send outcome, every change of
the suppression list and of people's preferences, and every address a provider said is dead, in
one order, for the company's systems (a warehouse loader pulls them, `GET /api/v1/stream/`;
webhooks are posted them).

Fed by the drain, not by the gate: in the transaction that writes a round of the ledger's
stream, the drain adds a `StreamBatch` per run of events it wrote (a range of ledger rows, the
rows that took an outcome, a range of a journal). A batch names no one and holds no event: an
event is read from the row it points at when it is asked for, so it says what the row says
then, and an erasure or the ledger's upkeep that removes the row removes its events. The gate
pays nothing for the stream.

Order. Batches commit in the order of their ids: the drain that makes them runs one at a time
(the drainer's lock in Redis, and on PostgreSQL an advisory lock of the transaction's, should
that lock have run out), and the journals commit in the order of their ids too (their writers
take a lock row first).

Journals. The suppression list's and preferences' journals are this app's; another app's table
that is written the same way (ids committed in order, under a lock row) is read as a journal
too once that app registers it (`journal_register`, in its `ready()`), as the places of
personal data are: the worker's dead addresses are, so that the stream imports nothing of the
worker (the apps' order is worker, then limits). So a reader that has read batch N has seen every
batch before it, and a position, `<batch>.<key>` (the last event read: its row's id, or its place in
an outcome batch), is a resumable cursor. Events before the stream existed (journal changes made
before its first drain, decisions written before it) are not in it.

Event ids: `d<row>` a decision, `o<row>.<outcome>` its outcome, `s<change>` a suppression
change, `p<change>` a preferences change, `a<row>` a dead address; the same event always has the
same id, so a consumer that sees one twice (delivery is at least once) drops the second.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import numpy as np
from django.db import connection, models
from django.db.models import F, Func, IntegerField
from django.db.models.functions import Coalesce
from django.utils import timezone

from gatekeeper.lib.instants import instant_text
from gatekeeper.lib.problems import Problem
from limits.ledger.listeners import Drained, DrainListener, Round
from limits.ledger.table import kinds_read, outranked_of, row_time
from limits.models.ledger import LEDGER_OUTCOMES, LedgerEntry
from limits.models.people import PreferenceChange, SuppressionChange
from limits.models.stream import StreamBatch

Source = StreamBatch.Source
LEDGER_OUTCOME_BYTES = [name.encode() for name in LEDGER_OUTCOMES]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EVENT_TYPES = ("decision", "outcome", "suppression", "preferences", "dead_address")
CAMPAIGN_TYPES = frozenset({"decision", "outcome", "dead_address"})  # events that have a campaign
PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
LOOK_MAX = 100_000  # rows one read looks at, whatever its filters keep: then it returns
OUTCOME_REF = np.dtype([("row", ">i8"), ("code", "u1")])
TABLE = LedgerEntry._meta.db_table
DRAIN_LOCK = 0x67_6B_73_74  # PostgreSQL advisory lock of the drain's transaction ("gkst")

# A journal's events after a change id and up to another: each as (its id, channel, campaign,
# the event); None where it has none.
JournalEvents = Iterable[tuple[int, str | None, str | None, dict[str, Any]]]


@dataclass(frozen=True)
class Journal:
    """A table the stream takes by ranges of ids, each round the ones committed since the last:
    its writers take a lock row first, so that its ids commit in order."""

    source: int  # its batches' StreamBatch.Source
    event_type: str  # its events' type (one of EVENT_TYPES)
    model: type[models.Model]
    read: Callable[[int, int], JournalEvents]  # its events of ids after one and up to another


def _suppressions(after: int, upto: int) -> JournalEvents:
    changes = SuppressionChange.objects.filter(id__gt=after, id__lte=upto).order_by("id")
    return [(c.id, c.channel, None, _suppression(c)) for c in changes]


def _preference_changes(after: int, upto: int) -> JournalEvents:
    changes = PreferenceChange.objects.filter(id__gt=after, id__lte=upto).order_by("id")
    return [(c.pk, None, None, _preferences(c)) for c in changes]


JOURNALS: dict[int, Journal] = {
    Source.SUPPRESSION: Journal(
        Source.SUPPRESSION, "suppression", SuppressionChange, _suppressions
    ),
    Source.PREFERENCES: Journal(
        Source.PREFERENCES, "preferences", PreferenceChange, _preference_changes
    ),
}


def journal_register(journal: Journal) -> None:
    """Have the stream take another app's journal (its `ready()` calls this; again is the
    same). A source or type the stream does not know is a mistake of the code: refused."""
    if journal.source not in Source.values or journal.source in _LEDGER_SOURCES:
        raise ValueError(f"{journal.source!r} is not a journal's source of StreamBatch")
    if journal.event_type not in EVENT_TYPES:
        raise ValueError(f"{journal.event_type!r} is not one of EVENT_TYPES")
    JOURNALS[journal.source] = journal
    _SOURCE_TYPE[journal.source] = journal.event_type


@dataclass(frozen=True, order=True)
class Position:
    """A place in the stream: after the event `key` of batch `batch` (0: none of it read)."""

    batch: int
    key: int = 0

    def __str__(self) -> str:
        return f"{self.batch}.{self.key}"


START = Position(0, 0)
POSITION_WORDS = "a position the stream gave (`next`), `0` for its start, or `end` for its end"
POSITION_PATTERN = r"^(0|end|[0-9]{1,18}\.[0-9]{1,18})$"


def position_from_text(text: str, *, field: str = "") -> Position:
    """A position as the stream writes it; a Problem (a ValueError) naming `field` otherwise."""
    if text == "0":
        return START
    if text == "end":
        return stream_end()
    batch, dot, key = text.partition(".")
    digits = all(p.isascii() and p.isdigit() and len(p) <= 18 for p in (batch, key))
    if dot and digits:
        return Position(int(batch), int(key))
    raise Problem(f"{text!r} is not {POSITION_WORDS}", field=field)


def type_problem(value: str) -> str | None:
    """What is wrong with an event type a reader or an endpoint names, if anything."""
    if value in EVENT_TYPES:
        return None
    return f"{value[:40]!r} is not an event type: one of {', '.join(EVENT_TYPES)}."


def stream_end() -> Position:
    """The position after the last event there is now (where a new consumer starts when it
    wants only what comes next)."""
    last = _sized().order_by("-id").first()
    return START if last is None else Position(last.id, _batch_end(last))


def _sized() -> Any:
    """Batches without their refs (an outcome batch's can be megabytes), with the refs' size."""
    size = Func(F("refs"), function="LENGTH", output_field=IntegerField())
    return StreamBatch.objects.defer("refs").annotate(refs_bytes=Coalesce(size, 0))


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
    """Every journal's changes (the suppression list's, preferences', the registered ones')
    committed since the stream last took them, as a batch each. The first time, the stream
    starts at a journal's end (a batch of nothing marks where). Returns the changes taken."""
    taken = 0
    for source, journal in list(JOURNALS.items()):
        mark = StreamBatch.objects.filter(source=source).order_by("-id").values_list("last").first()
        newest = (
            journal.model._default_manager.order_by("-id").values_list("id", flat=True).first() or 0
        )
        if mark is None:
            StreamBatch.objects.create(source=source, first=newest + 1, last=newest, made_at=now)
            continue
        if newest > mark[0]:
            StreamBatch.objects.create(source=source, first=mark[0] + 1, last=newest, made_at=now)
            taken += newest - mark[0]
    return taken


class StreamListener(DrainListener):
    """The event stream as the drain feeds it (registered in the app's `ready()`): a batch per
    run of events each round wrote, committed in the order of their ids."""

    def begun(self) -> None:
        drain_serialized()

    def written(self, done: Round, report: Drained) -> None:
        if done.calls:
            ats = [call.at for call in done.calls]
            decisions_batched(done.first, done.first + done.rows - 1, min(ats), max(ats))
        outcomes_batched(done.known)
        outcomes_batched(done.taken)
        report.changes = journals_batched(done.now)

    def upkeep(self, now: datetime, cutoff: datetime) -> None:
        # The batches as long as the rows they point at.
        StreamBatch.objects.filter(made_at__lt=cutoff).delete()


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """Which events a reader wants: by type, channel and campaign (empty: every one). A
    channel filter keeps the events of those channels, suppressions of every channel (`all`)
    and preference changes (they concern every channel); a campaign filter keeps only the
    decisions, outcomes and dead addresses of those campaigns."""

    types: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()
    campaigns: frozenset[str] = frozenset()

    def keeps(self, kind: str, channel: str | None, campaign: str | None) -> bool:
        """Whether an event of this type, channel (None: of none) and campaign passes."""
        if self.types and kind not in self.types:
            return False
        if self.channels and channel not in (None, "all") and channel not in self.channels:
            return False
        return not self.campaigns or campaign in self.campaigns

    def wants(self, source: int) -> bool:
        """Whether any event of a batch from `source` can pass (a batch of none is not read)."""
        kind = _SOURCE_TYPE.get(source)
        if kind is None:  # a journal no app registered in this process: nothing to read
            return False
        if self.campaigns and kind not in CAMPAIGN_TYPES:
            return False
        return not self.types or kind in self.types


EVERY = Filters()  # no filter: every event

_SOURCE_TYPE: dict[int, str] = {
    Source.DECISIONS: "decision",
    Source.OUTCOMES: "outcome",
    Source.SUPPRESSION: "suppression",
    Source.PREFERENCES: "preferences",
}
_LEDGER_SOURCES = (Source.DECISIONS, Source.OUTCOMES)


@dataclass
class Page:
    encoded: list[bytes]  # the events, each as JSON
    next: Position  # where the next read starts
    more: bool  # whether there was more to read after `next` when this was read

    @property
    def events(self) -> list[dict[str, Any]]:
        return [msgspec.json.decode(event) for event in self.encoded]

    def json(self, **more: Any) -> bytes:
        """`{"events": [...], <more>}` as JSON."""
        rest = b"".join(b"," + msgspec.json.encode(k) + b":" + msgspec.json.encode(v)
                        for k, v in more.items())  # fmt: skip
        return b'{"events":[' + b",".join(self.encoded) + b"]" + rest + b"}"


def stream_read(
    after: Position = START, limit: int = PAGE_DEFAULT, filters: Filters = EVERY
) -> Page:
    """Up to `limit` events after `after`, in stream order. Looks at no more than LOOK_MAX rows
    (a filter that keeps few of them returns fewer events, and `next` past those it looked
    at): a reader asks again from `next` while `more`."""
    events: list[bytes] = []
    keys: list[int] = []  # each event's key in its batch
    position, looked = after, 0
    for batch in _batches_from(max(after.batch, 1)):
        if batch.id != after.batch:
            position = Position(batch.id, 0)
        if not filters.wants(batch.source):
            position = Position(batch.id, _batch_end(batch))
            continue
        while len(events) < limit and looked < LOOK_MAX:
            wanted = limit - len(events)
            # What is left to read; more with filters, which drop some of what is read.
            span = min(LOOK_MAX - looked, wanted if filters == EVERY else 4 * wanted + 100)
            found, key, seen = _read(batch, position.key, span)
            looked += seen
            for place, kind, channel, campaign, event in found:
                if filters is EVERY or filters.keeps(kind, channel, campaign):
                    events.append(event)
                    keys.append(place)
            position = Position(batch.id, key)
            if key >= _batch_end(batch):
                break
        if len(events) >= limit or looked >= LOOK_MAX:
            break
    if len(events) >= limit and events:
        # A last read's extra events are left for the next page, which starts after the last
        # one given (in the batch the last read was of).
        del events[limit:]
        position = Position(position.batch, keys[limit - 1])
    return Page(encoded=events, next=position, more=position < stream_end())


def _batches_from(first: int) -> Iterator[StreamBatch]:
    """The batches from `first` on, in order, read 100 at a time (plain reads: a server-side
    cursor would cost three round trips for the one or two a page reads)."""
    while True:
        some = list(_sized().filter(id__gte=first).order_by("id")[:100])
        yield from some
        if len(some) < 100:
            return
        first = some[-1].id + 1


def _batch_end(batch: Any) -> int:
    if batch.source == Source.OUTCOMES:
        return int(batch.refs_bytes) // OUTCOME_REF.itemsize
    return int(batch.last)


def _refs(batch_id: int, key: int, span: int) -> Any:
    """Places `key` to `key + span` of an outcome batch's refs, read as a slice in the
    database."""
    size = OUTCOME_REF.itemsize
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT substr(refs, %s, %s) FROM {StreamBatch._meta.db_table} WHERE id = %s",
            [key * size + 1, span * size, batch_id],
        )
        found = cursor.fetchone()
    return np.frombuffer(bytes(found[0] or b"") if found else b"", dtype=OUTCOME_REF)


# Events: each with its key in its batch, type, channel and campaign (None: it has none), JSON.
Found = list[tuple[int, str, str | None, str | None, bytes]]


def _read(batch: StreamBatch, key: int, span: int) -> tuple[Found, int, int]:
    """The events of `batch` after `key`, looking at up to `span` of its places: (the events
    with their keys, the key read up to, places looked at)."""
    lower = max(key, batch.first - 1)  # rows after this one (outcomes: places)
    upto = min(batch.last, lower + span)
    if batch.source == Source.DECISIONS:
        rows, kinds = _rows("id > %s AND id <= %s", [lower, upto], batch)
        instant = _Instants()
        found: Found = []
        for row in rows:
            kind = kinds[row[3]]
            found.append((row[0], "decision", kind["channel"], kind["campaign"],
                          _decision(row, kind, instant)))  # fmt: skip
        return found, upto, upto - lower
    if batch.source == Source.OUTCOMES:
        part = _refs(batch.id, key, span)
        if not len(part):
            return [], key, 0
        ids = part["row"].tolist()
        if connection.vendor == "postgresql":
            # One array parameter, not a thousand: the query is not spelled out per id.
            where, params = "id >= %s AND id <= %s AND id = ANY(%s)", [min(ids), max(ids), ids]
        else:
            where = "id >= %s AND id <= %s AND id IN (" + ", ".join(["%s"] * len(ids)) + ")"
            params = [min(ids), max(ids), *ids]
        rows, kinds = _rows(where, params, batch)
        by_id = {row[0]: row for row in rows}
        made, instant = instant_text(batch.made_at).encode(), _Instants()
        found = []
        for place, (row_id, code) in enumerate(zip(ids, part["code"].tolist(), strict=True)):
            hit = by_id.get(row_id)
            if hit is not None:
                kind = kinds[hit[3]]
                found.append((key + place + 1, "outcome", kind["channel"], kind["campaign"],
                              _outcome(hit, code, made, kind, instant)))  # fmt: skip
        return found, key + len(part), len(part)
    journal = JOURNALS[batch.source]
    return [
        (key, journal.event_type, channel, campaign, msgspec.json.encode(event))
        for key, channel, campaign, event in journal.read(lower, upto)
    ], upto, upto - lower  # fmt: skip


# id, time in microseconds since the epoch, user, kind, outcome code, stored message id, value
Row = tuple[int, int, int, int, int, str | None, float | None]


def _rows(
    where: str, params: list[Any], batch: StreamBatch
) -> tuple[list[Row], dict[int, dict[str, Any]]]:
    """Ledger rows (id, at, user, kind, outcome code, stored message id), in id order, read from
    the batch's days only (PostgreSQL reads only their partitions); and their kinds by id."""
    adapt = connection.ops.adapt_datetimefield_value
    # PostgreSQL gives the time as a number (a gate call's rows share it: formatted once each),
    # not a timestamp parsed per row.
    at = "(EXTRACT(EPOCH FROM at) * 1000000)::bigint" if connection.vendor == "postgresql" else "at"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, {at}, user_id, kind_id, outcome, message_id, value FROM {TABLE} "
            f"WHERE {where} AND at >= %s AND at <= %s ORDER BY id",
            [*params, adapt(batch.since), adapt(batch.until)],
        )
        rows = cursor.fetchall()
    kinds = kinds_read({row[3] for row in rows})
    if connection.vendor == "postgresql":
        return rows, kinds
    return [(r[0], _micros(row_time(r[1])), *r[2:]) for r in rows], kinds


def _micros(at: datetime) -> int:
    return (at - EPOCH) // timedelta(microseconds=1)


class _Instants:
    """_instant of a time in microseconds, as bytes, remembering the last: a gate call's
    decisions share their time."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.text = b""

    def __call__(self, at: int) -> bytes:
        if at != self.at:
            self.at, self.text = at, instant_text(EPOCH + timedelta(microseconds=at)).encode()
        return self.text


# What a kind's events share, as JSON, made once per kind (a blast names a few dozen) and kept
# in the kind's dict (table.kinds_read's: forgotten with it): an event is its own few fields
# written around them.
_SHARED = ("channel", "campaign", "reason", "rule_id", "segment", "tags", "priority", "category",
           "topic", "zone", "snapshot_version", "experiment", "arm")  # fmt: skip


def _tail(kind: dict[str, Any], what: str) -> bytes:
    found: bytes | None = kind.get(f"_{what}")
    if found is None:
        if what == "campaign":  # as it is written inside a JSON string, for a message id
            found = msgspec.json.encode(kind["campaign"])[1:-1]
        else:
            names = _SHARED if what == "decision" else ("channel", "campaign")
            found = b"," + msgspec.json.encode({k: kind[k] for k in names})[1:-1]
        kind[f"_{what}"] = found
    return found


def _message(kind: dict[str, Any], user_id: int, stored: str | None) -> bytes:
    """A row's message id as a JSON string (message_of's, without building it when it is the
    campaign's own)."""
    if stored is None:
        return b'"%s:%d"' % (_tail(kind, "campaign"), user_id)
    return msgspec.json.encode(stored)


def _decision(row: Row, kind: dict[str, Any], instant: Callable[[int], bytes]) -> bytes:
    row_id, at, user_id, _, _, stored, value = row
    return b'{"id":"d%d","type":"decision","at":"%s","user_id":%d,"message_id":%s%s,%s}' % (
        row_id,
        instant(at),
        user_id,
        _message(kind, user_id, stored),
        _tail(kind, "decision"),
        _outranked(kind, value),
    )


def _outranked(kind: dict[str, Any], value: float | None) -> bytes:
    """A decision's `outranked_by` member: the job of its kind and the value of its row, or
    null."""
    job = kind["outranked_by"]
    if job is None:
        return b'"outranked_by":null'
    return b'"outranked_by":' + msgspec.json.encode(outranked_of(job, value))


def _outcome(
    row: Row, code: int, made: bytes, kind: dict[str, Any], instant: Callable[[int], bytes]
) -> bytes:
    row_id, at, user_id, _, _, stored, _ = row
    outcome = LEDGER_OUTCOME_BYTES[code]
    return (
        b'{"id":"o%d.%s","type":"outcome","at":"%s","decision":"d%d","decided_at":"%s",'
        b'"user_id":%d,"message_id":%s,"outcome":"%s"%s}'
        % (row_id, outcome, made, row_id, instant(at), user_id,
           _message(kind, user_id, stored), outcome, _tail(kind, "outcome"))
    )  # fmt: skip


def _suppression(change: SuppressionChange) -> dict[str, Any]:
    return {
        "id": f"s{change.id}",
        "type": "suppression",
        "at": instant_text(change.at),
        "user_id": change.user_id,
        "channel": change.channel,
        "action": change.action,
        "reason": change.reason,
        "source": change.source,
    }


def _preferences(change: PreferenceChange) -> dict[str, Any]:
    return {
        "id": f"p{change.pk}",
        "type": "preferences",
        "at": instant_text(change.changed_at),
        "user_id": change.user_id,
        "source": change.source,
        "preferences": change.after,
    }
