"""The send ledger's table: how a decision is stored, and how it is read back whole.

A decision's row (`LedgerEntry`) keeps only what is its own: when, the user, the message id,
what became of the send (a two-byte code, limits.models.ledger.LEDGER_OUTCOMES), on an
outranked decision what the send that outranked it was worth to the user (`value`: NULL, no
byte, on every other) and its **kind** (`LedgerKind`): the fields it shares with the other
decisions of its gate call and of every call like it (channel, campaign, tags, priority,
category, snapshot version, topic) together with its segment, reason, deciding rule, experiment
arm, the time zone its request named and the send job that outranked it in a round. A blast
of a million decisions names a few dozen kinds (a round's outranked ones, one per winning job),
so those fields cost nothing per row. And the message id is not stored when it is the
campaign's own, `<campaign>:<user id>`, as send jobs name their sends: it is put back when
read.

So a row is about 60 bytes on PostgreSQL, and 90 with its index (docs/ledger.md, "Storage"),
where it was 194 with every field on every row.

Readers take rows through `decisions()` (the kind's fields and the message id put back) and
never read `LedgerEntry` alone; the drain writes them through `kinds_find` and
`message_stored`. This module is the only one that knows the layout.
"""

import hashlib
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any, NamedTuple, cast

import msgspec
from django.db import connection, transaction
from django.db.models import Case, CharField, F, JSONField, QuerySet, Value, When
from django.db.models.functions import Cast, Coalesce, Concat, JSONObject

from limits.models.ledger import LedgerEntry, LedgerKind

KIND_TABLE = LedgerKind._meta.db_table
ROW_COLUMNS = ("at", "user_id", "kind_id", "outcome", "message_id")  # as COPY writes a row
VALUE_COLUMN = "value"  # and after them, when a row of the COPY is outranked
KINDS_CACHED_MAX = 50_000  # kinds a drainer remembers before it forgets them all


class KindFields(NamedTuple):
    """A kind's fields, in the order its digest reads them (never to be reordered: the
    digest of a kind already stored must not change)."""

    channel: str
    campaign: str
    tags: tuple[str, ...]
    priority: int
    category: str
    snapshot_version: str
    segment: str
    reason: str
    rule_id: int | None
    topic: str = ""  # came after the others: left out of the digest when none
    experiment: int | None = None  # and these after it: left out when none
    arm: int | None = None
    zone: str = ""  # the zone the request named, after them: left out when none
    # The send job that outranked the decisions in a round, after them all: left out when none.
    outranked_by: int | None = None


def kind_digest(fields: KindFields) -> str:
    """The key a kind is found by: SHA-1 of its fields as a JSON array (without the topic, the
    experiment and the arm when it has none, as kinds were found before they existed). A kind
    outranked by a job digests every field (those it has not as null or empty); one that was
    not, but has a zone, every field but that job; one without either is digested as before
    zones were kept."""
    values = list(fields)
    if fields.outranked_by is not None:
        return hashlib.sha1(msgspec.json.encode(values)).hexdigest()
    values = values[:-1]
    if fields.zone:
        return hashlib.sha1(msgspec.json.encode(values)).hexdigest()
    values = values[:-1]
    if fields.experiment is None:
        values = values[:-2] if fields.topic else values[:-3]
    return hashlib.sha1(msgspec.json.encode(values)).hexdigest()


def message_stored(campaign: str, user_id: int, message_id: str) -> str | None:
    """What a row keeps of its message id: nothing (NULL) when it is the campaign's own."""
    return None if message_id == f"{campaign}:{user_id}" else message_id


def message_of(campaign: str, user_id: int, stored: str | None) -> str:
    """A row's message id, from what it keeps (message_stored's inverse)."""
    return f"{campaign}:{user_id}" if stored is None else stored


def outranked_of(job: int | None, value: float | None) -> dict[str, Any] | None:
    """A decision's `outranked_by` from its kind's job and its row's value: `{"job", "value"}`,
    or None when no job outranked it."""
    return None if job is None else {"job": job, "value": value}


# The kinds this process found or added, by day and digest: known after their transaction
# committed, so that a rolled-back drain leaves no id here that the table does not hold.
_known: dict[tuple[date, str], int] = {}


def kinds_find(day: date, wanted: Iterable[KindFields]) -> dict[KindFields, int]:
    """The ids of the kinds `wanted`, each added when missing and marked used on `day` (its
    `last_day` moved forward), in the current transaction. Kinds this process already marked
    on `day` cost no query; the others one statement per 500."""
    found: dict[KindFields, int] = {}
    missing: dict[str, KindFields] = {}
    for fields in wanted:
        if fields in found:
            continue
        digest = kind_digest(fields)
        known = _known.get((day, digest))
        if known is not None:
            found[fields] = known
        else:
            missing[digest] = fields
    if not missing:
        return found
    added: dict[tuple[date, str], int] = {}
    adapt = connection.ops.adapt_datefield_value
    with connection.cursor() as cursor:
        returned = values_inserted(
            cursor,
            f"INSERT INTO {KIND_TABLE} (digest, channel, campaign, tags, priority, category, "
            f"snapshot_version, segment, reason, rule_id, topic, experiment, arm, zone, "
            f"outranked_by, last_day)",
            [
                (digest, *fields[:2], msgspec.json.encode(list(fields.tags)).decode(),
                 *fields[3:], adapt(day))
                for digest, fields in missing.items()
            ],
            f"ON CONFLICT (digest) DO UPDATE SET last_day = CASE WHEN excluded.last_day > "
            f"{KIND_TABLE}.last_day THEN excluded.last_day ELSE {KIND_TABLE}.last_day END "
            f"RETURNING id, digest",
        )  # fmt: skip
    for kind_id, digest in returned:
        found[missing[digest]] = kind_id
        added[(day, digest)] = kind_id

    def remember() -> None:
        if len(_known) + len(added) > KINDS_CACHED_MAX:
            _known.clear()
        _known.update(added)

    transaction.on_commit(remember)
    return found


def values_inserted(
    cursor: Any, head: str, rows: Sequence[Sequence[Any]], tail: str, *, per: int = 500
) -> list[tuple[Any, ...]]:
    """`<head> VALUES (...), ... <tail>` for `rows`, `per` rows a statement (the ledger's
    kinds and hourly counts); what the statements return (RETURNING), if anything."""
    returned: list[tuple[Any, ...]] = []
    for start in range(0, len(rows), per):
        part = rows[start : start + per]
        row = "(" + ", ".join(["%s"] * len(part[0])) + ")"
        cursor.execute(
            f"{head} VALUES {', '.join([row] * len(part))} {tail}",
            [value for values in part for value in values],
        )
        if cursor.description is not None:
            returned.extend(cursor.fetchall())
    return returned


# Kinds read back by id (the event stream's readers): a kind never changes once made.
_read: dict[int, dict[str, Any]] = {}


def kinds_read(ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Kinds' fields by id (a dict per kind), read from the database once per process."""
    missing = [i for i in ids if i not in _read]
    if missing:
        if len(_read) + len(missing) > KINDS_CACHED_MAX:
            _read.clear()
        for kind in LedgerKind.objects.filter(id__in=missing).values():
            _read[kind["id"]] = dict(kind)
    return _read


def kinds_forget() -> None:
    """Forget the kinds this process remembered (after the upkeep deleted some, and in
    tests that empty the table)."""
    _known.clear()
    _read.clear()


def kinds_analyze() -> None:
    """PostgreSQL: statistics taken on the kinds now, before a query that joins many rows to
    them (the rebuild's). Kinds made in the last minutes have none until autovacuum comes by,
    and without them a join on a kind's fields is guessed to keep one row in thousands, and
    planned as a read of whole days and a sort (0.7 s per 20,000 rows of a 5M-row day,
    against 11 ms read in user order from the index once the kinds were analyzed)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {KIND_TABLE}")


def decisions() -> QuerySet[LedgerEntry]:
    """The ledger's rows with their kind's fields and their message id put back, as
    annotations of the same names (`message` for the message id, `outranked_by` for the job
    that outranked the decision and its value, `{"job", "value"}`, or None): for values() and
    filters. Rows read as objects take `select_related("kind")`, `message_of` and
    `outranked_of` instead."""
    return LedgerEntry.objects.annotate(
        channel=F("kind__channel"),
        campaign=F("kind__campaign"),
        tags=F("kind__tags"),
        priority=F("kind__priority"),
        category=F("kind__category"),
        snapshot_version=F("kind__snapshot_version"),
        segment=F("kind__segment"),
        reason=F("kind__reason"),
        rule_id=F("kind__rule_id"),
        topic=F("kind__topic"),
        zone=F("kind__zone"),
        outranked_by=Case(
            When(
                kind__outranked_by__isnull=False,
                then=JSONObject(job=F("kind__outranked_by"), value=F("value")),
            ),
            output_field=JSONField(),
        ),
        message=Coalesce(
            "message_id",
            Concat(F("kind__campaign"), Value(":"), Cast("user_id", CharField())),
            output_field=CharField(),
        ),
    )


def row_time(value: Any) -> datetime:
    """A ledger row's time as a raw query reads it: SQLite gives it as a naive or text time."""
    if connection.vendor != "sqlite":
        return cast(datetime, value)
    ops: Any = connection.ops
    return cast(datetime, ops.convert_datetimefield_value(value, None, connection))
