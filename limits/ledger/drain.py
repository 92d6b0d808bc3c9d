"""The send ledger's drain: the stream's entries (limits/ledger/stream.py) written into the
database exactly once, counted per hour, and kept GATEKEEPER_LEDGER_DAYS days.

`ledger_drain` (beat every 2 s) reads the stream as the consumer group `drain`, writes the
decisions in one transaction (COPY on PostgreSQL, bulk inserts on SQLite) together with the ids
of the stream entries written (`LedgerBatch`), then acknowledges and deletes the entries. A
drain whose transaction fails because the database (or Redis) failed under it gives its entries
back (made idle for CLAIM_IDLE_MS, so any drainer claims them at once), and every drain takes
its own pending entries first: the ledger is complete within a drain's period of the database
coming back. A failure that may come of the entries themselves leaves them to CLAIM_IDLE_MS, so
that they do not hold up the entries after them. A drainer that dies after reading gives nothing
back: its entries stay pending until they have been idle for CLAIM_IDLE_MS, then the next drain
claims them. One that dies after committing and before acknowledging leaves entries whose ids
are already in `LedgerBatch`: they are acknowledged without being written again. So each
decision is written exactly once, whoever takes its entry and however often.

What else the drain feeds (the event stream's batches, the studies' members and the outcome
events the company posts, which the stream carries too) registers itself as a listener
(limits/ledger/listeners.py) and is called in the same transaction: the drain imports none of
it. A listener's own entries are handed to it in the stream's order, after the decisions before
them are written (a batch that holds one first takes every older entry still pending elsewhere).
"""

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import repeat
from typing import Any

import msgspec
import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction

from gatekeeper.lib.instants import instant_ms, instant_or_now
from gatekeeper.lib.leases import RedisLease
from gatekeeper.lib.redis_client import REDIS_DOWN, RedisClient, get_redis
from limits.ledger.listeners import (
    Drained,
    DrainListener,
    Round,
    Taken,
    drain_listeners,
    entry_owner,
)
from limits.ledger.stream import Decided, Outcomes, arm_of_code, ledger_entry, stream_key
from limits.ledger.table import (
    KIND_TABLE,
    ROW_COLUMNS,
    VALUE_COLUMN,
    KindFields,
    kinds_find,
    kinds_forget,
    message_stored,
    row_time,
    values_inserted,
)
from limits.models.ledger import (
    LEDGER_OUTCOME_CODES,
    LedgerBatch,
    LedgerCount,
    LedgerEntry,
    LedgerKind,
)
from limits.reasons import SENDING, Outcome

logger = logging.getLogger(__name__)

GROUP = "drain"
CLAIM_IDLE_MS = 60_000  # a pending entry this long unacknowledged belongs to a dead drainer
FAILED = "failed"  # the consumer holding entries whose write failed, not for want of the database
# Failures of the database or Redis themselves, gone when they are back: a drain that met one
# hands its entries on at once.
_PASSING = (OperationalError, InterfaceError, *REDIS_DOWN)
TABLE = LedgerEntry._meta.db_table
COUNTS = LedgerCount._meta.db_table


def _consumer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _group(client: RedisClient, key: str) -> None:
    try:
        client.xgroup_create(key, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def ledger_drain(
    *, count: int = 200, client: RedisClient | None = None, consumer: str | None = None
) -> Drained:
    """Move up to `count` stream entries (gate calls, send outcomes, outcome events) into the
    database, exactly once. This drainer's own entries still pending (a run of its that failed)
    are taken first, then those a dead drainer left (idle CLAIM_IDLE_MS), then new ones.
    `consumer`: the drainer's name in the group (default: this process's, host and pid)."""
    client = client or get_redis()
    key = stream_key()
    consumer = consumer or _consumer()
    entries = _entries_taken(client, key, consumer, count)
    report = Drained(entries=len(entries))
    if not entries:
        with transaction.atomic():
            listeners = drain_listeners()
            for listener in listeners:
                listener.begun()
            for listener in listeners:
                listener.written(Round(now=datetime.now(tz=UTC)), report)
        return report
    ids = [_text(entry_id) for entry_id, _ in entries]
    try:
        _entries_written(entries, ids, report)
        pipe = client.pipeline(transaction=False)  # one round trip; one slot (the stream's key)
        pipe.xack(key, GROUP, *ids)
        pipe.xdel(key, *ids)
        pipe.execute()
    except BaseException as exc:
        _given_back(client, key, consumer, ids, exc)
        raise
    return report


def _entry_order(entry_id: Any) -> tuple[int, int]:
    ms, _, seq = _text(entry_id).partition("-")
    return int(ms), int(seq or 0)


def _read(client: RedisClient, key: str, consumer: str, since: str, count: int) -> list[Any]:
    read: Any = client.xreadgroup(GROUP, consumer, {key: since}, count=count)
    return [entry for _, found in read or [] for entry in found]  # [[key, [(id, fields)]]]


def _entries_taken(client: RedisClient, key: str, consumer: str, count: int) -> list[Any]:
    """The entries a drain takes, oldest first: its own pending ones (ID 0: those a failed run
    of this drainer read and did not acknowledge), then a dead drainer's idle for
    CLAIM_IDLE_MS (or given back by a failed drain), then new ones; `count` in all. A batch
    holding outcome events also takes every older entry pending elsewhere (_earlier_taken)."""
    try:
        entries = _read(client, key, consumer, "0", count)
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        _group(client, key)  # the first drain, or Redis lost its data
        entries = []
    if len(entries) < count:
        claimed: Any = client.xautoclaim(
            key, GROUP, consumer, CLAIM_IDLE_MS, "0-0", count=count - len(entries)
        )
        entries.extend(claimed[1] if claimed else [])
    if len(entries) < count:
        entries.extend(_read(client, key, consumer, ">", count - len(entries)))
    owned = [entry_id for entry_id, fields in entries if entry_owner(fields) is not None]
    if owned:
        entries.extend(_earlier_taken(client, key, consumer, entries, max(owned, key=_entry_order)))
    return sorted(entries, key=lambda entry: _entry_order(entry[0]))


def _earlier_taken(
    client: RedisClient, key: str, consumer: str, entries: Sequence[Any], newest: Any
) -> list[Any]:
    """The entries older than `newest` (the batch's newest entry of a listener's own) still
    pending with any drainer (or with this one, beyond `count`) and not in `entries`: claimed
    whatever their idle time, so that the decisions before it are written (and fed to the
    listeners) before it is. A live drainer that had them loses nothing: of two drains of
    one entry the second to commit finds it written (LedgerBatch) and only acknowledges it.
    Entries whose write failed on their own (FAILED's) are not waited for: they would fail the
    events' batch with them."""
    have = {_text(entry_id) for entry_id, _ in entries}
    wanted: list[Any] = []
    start = "-"
    while True:
        page: Any = client.xpending_range(key, GROUP, min=start, max=newest, count=1_000)
        wanted += [
            _text(p["message_id"])
            for p in page
            if _text(p["message_id"]) not in have and _text(p["consumer"]) != FAILED
        ]
        if len(page) < 1_000:
            break
        start = "(" + _text(page[-1]["message_id"])
    if not wanted:
        return []
    claimed: Any = client.xclaim(key, GROUP, consumer, 0, wanted)
    return [(entry_id, fields) for entry_id, fields in claimed or [] if entry_id is not None]


def _given_back(
    client: RedisClient, key: str, consumer: str, ids: Sequence[str], error: BaseException
) -> None:
    """A drain that failed hands its entries on. When the database (or Redis) failed under it
    (the connection lost or refused, a lock or a disk: `_PASSING`), they are made idle for
    CLAIM_IDLE_MS (XCLAIM ... IDLE): the next drain, of this process or another, takes them at
    once. Any other failure may come of the entries themselves (a value the table refuses, a
    bug): they go to the consumer FAILED, off this drainer's own pending entries, and are taken
    again only once idle for CLAIM_IDLE_MS, as a dead drainer's, while new entries go on being
    drained. Only logged when Redis cannot take them (its own next run takes them anyway, or
    any drain a minute later)."""
    passing = isinstance(error, _PASSING)
    try:
        if passing:
            client.xclaim(key, GROUP, consumer, 0, list(ids), idle=CLAIM_IDLE_MS, justid=True)
        else:
            client.xclaim(key, GROUP, FAILED, 0, list(ids), justid=True)
    except REDIS_DOWN as exc:
        logger.warning("A failed drain could not hand its %d entries on: %s", len(ids), exc)
    if not passing:
        logger.error(
            "A drain of %d entries failed (%s: %s): tried again in %d s",
            len(ids), type(error).__name__, error, CLAIM_IDLE_MS // 1000,
        )  # fmt: skip


def _entries_written(entries: Sequence[Any], ids: Sequence[str], report: Drained) -> None:
    """Write the entries (their ids `ids`) in one transaction: decisions and their counts, send
    outcomes, what the listeners make of them (the event stream's batches, the studies' members
    and outcome events), and the ids in LedgerBatch."""
    with transaction.atomic():
        listeners = drain_listeners()
        for listener in listeners:
            listener.begun()  # the event stream's: batches commit in the order of their ids
        done = set(
            LedgerBatch.objects.filter(stream_id__in=ids).values_list("stream_id", flat=True)
        )
        calls: list[Decided] = []
        outcomes: list[Outcomes] = []
        after: list[int] = []  # per outcome entry: the calls before it in the stream
        steps: list[tuple[DrainListener | None, Any]] = []  # decisions, listeners' entries
        for (_, fields), text_id in zip(entries, ids, strict=True):
            if text_id in done:
                report.skipped += 1
                continue
            try:
                owner: DrainListener | None = entry_owner(fields)
                if owner is not None:
                    steps.append((owner, owner.entry(fields[str(owner.field).encode()])))
                    continue
                entry = ledger_entry((fields or {}).get(b"d") or b"")
            except (msgspec.DecodeError, ValueError, TypeError) as exc:
                # Written by no gate of this version (or cut short): kept out, and marked
                # written, so that it does not hold back the good entries around it for ever.
                logger.error(
                    "Ledger stream entry %s cannot be read and is dropped: %s", text_id, exc
                )
                report.unreadable += 1
                continue
            if isinstance(entry, Outcomes):
                outcomes.append(entry)
                after.append(len(calls))
            else:
                calls.append(entry)
                steps.append((None, entry))
        # Outcomes whose decisions this round writes too are written with them (most of a
        # blast's: a chunk's outcomes follow its decisions within a second); the others update
        # the rows an earlier round wrote.
        known, outcomes, report.outcomes = outcomes_merged(calls, outcomes, after)
        first = ledger_write(calls, known)
        counts_add(calls)
        # After the decisions: an entry's outcomes follow its decisions in the stream.
        if outcomes and connection.vendor == "postgresql":
            # For the rest of this transaction: the outcomes' lookups' estimated cost (every
            # partition's index probed per outcome) passes the JIT's threshold, and compiling
            # them costs ten times running them.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL jit = off")
        taken: list[Taken] = []
        for found in outcomes:
            matched = outcomes_write(found, taken, before_id=first or None)
            report.outcomes += matched
            report.unmatched += max(len(found.rows) - matched, 0)
        report.rows = report_rows(calls)
        done_round = Round(
            now=datetime.now(tz=UTC), calls=calls, steps=steps, first=first, rows=report.rows,
            known=_known_taken(calls, known, first), taken=taken,
        )  # fmt: skip
        for listener in listeners:
            listener.written(done_round, report)
        LedgerBatch.objects.bulk_create(
            [LedgerBatch(stream_id=text_id) for text_id in ids if text_id not in done]
        )


def report_rows(calls: Sequence[Decided]) -> int:
    return sum(len(call.users) for call in calls)


def _known_taken(
    calls: Sequence[Decided], known: Sequence[dict[int, str]], first: int
) -> list[Taken]:
    """The outcomes written with their rows, as the event stream takes them: (row id, code,
    the row's time); the rows' ids run from `first` in the order written."""
    taken = []
    start = first
    for call, found in zip(calls, known, strict=True):
        for k in sorted(found):
            if found[k]:
                taken.append((start + k, LEDGER_OUTCOME_CODES[found[k]], call.at))
        start += len(call.users)
    return taken


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- the table ---------------------------------------------------------------------------------


def outcomes_merged(
    calls: Sequence[Decided], outcomes: Sequence[Outcomes], after: Sequence[int] | None = None
) -> tuple[list[dict[int, str]], list[Outcomes], int]:
    """The send outcomes that fall on decisions of `calls` (rows outcomes_sql would update once
    written: a decision that sent (SENDING) of the user and message on the channel, at or after the
    outcome's `since`, and before the outcome in the stream: `after[k]`, the calls before
    outcome k, all of them when not given): per call, its rows' outcomes; the outcomes left for
    rows written before; and how many times a row took one (as outcomes_write counts).
    `released` keeps an outcome already known, as outcomes_sql. A send given back and then
    admitted again under the same message id keeps its second decision's outcome apart: what
    became of the first is not what became of the second."""
    known: list[dict[int, str]] = [{} for _ in calls]
    if not outcomes:
        return known, [], 0
    admitted: dict[tuple[str, int, str], list[tuple[int, int]]] = {}
    for c, call in enumerate(calls):
        for k, (user_id, message_id, _, reason, _) in enumerate(call.rows()):
            if reason in SENDING:
                admitted.setdefault((call.channel, user_id, message_id), []).append((c, k))
    left: list[Outcomes] = []
    taken = 0
    for place, found in enumerate(outcomes):
        before = len(calls) if after is None else after[place]
        rest = []
        for user_id, message_id, outcome in found.rows:
            rows = [
                (c, k)
                for c, k in admitted.get((found.channel, user_id, message_id), ())
                if c < before and calls[c].at_ms >= found.since_ms
            ]
            if not rows:
                rest.append((user_id, message_id, outcome))
            taken += len(rows)
            for c, k in rows:
                if outcome != Outcome.RELEASED or not known[c].get(k):
                    known[c][k] = outcome
        if rest:
            left.append(Outcomes(since_ms=found.since_ms, channel=found.channel, rows=rest))
    return known, left, taken


def ledger_write(calls: Sequence[Decided], outcomes: Sequence[dict[int, str]] = ()) -> int:
    """Insert gate calls' decisions in the current transaction (limits/ledger/table.py: each a
    row naming its kind): COPY on PostgreSQL, into the day partitions (made when missing), bulk
    inserts elsewhere. `outcomes`: per call, the outcomes of its rows already known
    (outcomes_merged). Returns the first row's id: the rows' ids follow on from it in the
    order of `calls` and their rows (the event stream points at them by id); 0 for none.

    The ids are consecutive: one drain writes at a time (drain_serialized), and on PostgreSQL
    it takes them from the table's sequence as one block, each row written with its own."""
    if not calls:
        return 0
    known = list(outcomes) or [{} for _ in calls]
    kinds = _kinds(calls)
    if connection.vendor == "postgresql":
        partitions_ensure({call.at.date() for call in calls})
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'id'), "
                "nextval(pg_get_serial_sequence(%s, 'id')) + %s - 1)",
                [TABLE, TABLE, report_rows(calls)],
            )
            first = int(cursor.fetchone()[0]) - report_rows(calls) + 1
            # The outranked decisions' value only when a call has one: the rows of every other
            # drain are written as they were before rounds.
            valued = any(call.by for call in calls)
            columns = (*ROW_COLUMNS, VALUE_COLUMN) if valued else ROW_COLUMNS
            sql = f"COPY {TABLE} (id, {', '.join(columns)}) FROM STDIN"
            with cursor.cursor.copy(sql) as copy:
                start = first
                for call, found, kind in zip(calls, known, kinds, strict=True):
                    copy.write(_copy_text(call, found, kind, start, valued=valued))
                    start += len(call.users)
        return first
    written = LedgerEntry.objects.bulk_create(
        [
            LedgerEntry(
                at=call.at,
                user_id=user_id,
                kind_id=kind[(segment, reason, rule_id, arm, zone, by)],
                outcome=found.get(k, ""),
                message_id=message_stored(call.campaign, user_id, message_id),
                value=call.values[k] if by else None,
            )
            for call, found, kind in zip(calls, known, kinds, strict=True)
            for k, ((user_id, message_id, segment, reason, rule_id), arm, zone, by) in enumerate(
                zip(
                    call.rows(),
                    call.arm_codes(),
                    call.zone_names(),
                    call.outranked_by(),
                    strict=True,
                )
            )
        ],
        batch_size=500,
    )
    ids = [row.pk for row in written]
    if ids[-1] - ids[0] != len(ids) - 1:  # another writer's rows among them: never, one drains
        raise RuntimeError(f"the ledger's new rows' ids are not consecutive: {ids[0]}..{ids[-1]}")
    return int(ids[0])


# A decision's segment, reason, rule id, arm code, the zone its request named and the job that
# outranked it (0: none).
Own = tuple[str, str, int | None, int, str, int]


def _kinds(calls: Sequence[Decided]) -> list[dict[Own, int]]:
    """Per call, its kinds' ids by (segment, reason, rule id, arm code, zone, outranking job),
    found or added a day at a time."""
    wanted: dict[date, set[KindFields]] = {}
    per_call: list[dict[Own, KindFields]] = []
    for call in calls:
        head = (call.channel, call.campaign, tuple(call.tags), call.priority, call.category,
                call.version)  # fmt: skip
        columns = (call.segments, call.reasons, call.rules, call.arm_codes(), call.zone_names(),
                   call.outranked_by())  # fmt: skip
        owns = set(zip(*columns, strict=True))
        fields = {}
        for own in owns:
            segment, reason, rule_id, code, zone, by = own
            experiment, place = arm_of_code(code) or (None, None)
            fields[own] = KindFields(
                *head, segment, reason, rule_id, call.topic, experiment, place, zone, by or None
            )
        wanted.setdefault(call.at.date(), set()).update(fields.values())
        per_call.append(fields)
    ids = {day: kinds_find(day, found) for day, found in wanted.items()}
    return [
        {own: ids[call.at.date()][fields] for own, fields in found.items()}
        for call, found in zip(calls, per_call, strict=True)
    ]


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(
    call: Decided, outcomes: dict[int, str], kinds: dict[Own, int], first: int,
    *, valued: bool = False,
) -> str:  # fmt: skip
    """A gate call's rows in COPY's text format (the time formatted once): about five times
    cheaper than a row at a time. `outcomes`: by row, those already known; `kinds`: the
    call's kinds' ids by (segment, reason, rule id, arm code, zone, outranking job); `first`:
    its first row's id; `valued`: each row ends with its value (VALUE_COLUMN: an outranked
    decision's, NULL on the others)."""
    head = f"\t{call.at.isoformat()}\t"
    codes = LEDGER_OUTCOME_CODES
    ends: Iterable[str] = repeat("", len(call.users))
    if valued:
        values = call.values or [0.0] * len(call.users)
        ends = [f"\t{value!r}" if by else "\t\\N"
                for by, value in zip(call.outranked_by(), values, strict=True)]  # fmt: skip
    return "".join(
        [
            str(first + k) + head + str(user_id) + "\t"
            + str(kinds[(segment, reason, rule_id, arm, zone, by)]) + "\t"
            + str(codes[outcomes.get(k, "")]) + "\t"
            + _copy_message(message_stored(call.campaign, user_id, message_id)) + end + "\n"
            for k, ((user_id, message_id, segment, reason, rule_id), arm, zone, by, end)
            in enumerate(zip(call.rows(), call.arm_codes(), call.zone_names(),
                             call.outranked_by(), ends, strict=True))
        ]
    )  # fmt: skip


def _copy_message(stored: str | None) -> str:
    return "\\N" if stored is None else stored.translate(_COPY_ESCAPES)


def counts_add(calls: Sequence[Decided]) -> None:
    """Count gate calls' decisions into LedgerCount, per UTC hour, channel, campaign, segment
    and reason, in the current transaction."""
    counted: Counter[tuple[Any, ...]] = Counter()
    for call in calls:
        hour = call.at.replace(minute=0, second=0, microsecond=0)
        per_call = Counter(zip(call.segments, call.reasons, strict=True))
        for (segment, reason), n in per_call.items():
            counted[(hour, call.channel, call.campaign, segment, reason)] += n
    if not counted:
        return
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        values_inserted(
            cursor,
            f"INSERT INTO {COUNTS} (hour, channel, campaign, segment, reason, count)",
            [(adapt(hour), *key, n) for (hour, *key), n in counted.items()],
            f"ON CONFLICT (hour, channel, campaign, segment, reason) "
            f"DO UPDATE SET count = {COUNTS}.count + excluded.count",
        )


# What an outcome's row is: a decision that sent (limits.reasons.SENDING) of its user and
# message on its channel, made at or after the outcome entry's `since`. `released` (quota given
# back) keeps an outcome already written: a failed send is released after its failure is known.
_ROW = (
    "(e.message_id = v.column2 OR (e.message_id IS NULL "
    "AND k.campaign || ':' || e.user_id = v.column2)) AND k.channel = %s "
    f"AND k.reason IN ({', '.join(repr(str(reason)) for reason in SENDING)}) AND e.at >= %s"
)
_RELEASED = LEDGER_OUTCOME_CODES[Outcome.RELEASED]


def outcomes_sql(rows: int, vendor: str) -> str:
    """The query that finds the rows of `rows` outcomes (parameters: user, message and the
    outcome's place per outcome, then the channel and `since`): per row found, the outcome's
    place, where the row is (its partition and ctid on PostgreSQL, its id elsewhere) and its
    outcome's code now. outcomes_write then updates the rows by where they are.

    On PostgreSQL each outcome's row is found by its own lookup on the user_id index. The
    plain join (`UPDATE ... FROM (VALUES ...)`) is planned from the partition's statistics, and
    a day partition the drain has just filled has none: its filters are then guessed to keep
    one row, and the join is planned as a nested loop that reads the whole partition once per
    outcome (measured: 27 s for 500 outcomes on 200,000 rows, 8.5 ms once the partition was
    analyzed). The lookup is kept a lookup whatever the statistics: a LATERAL subquery the
    planner cannot merge into the join (its OFFSET 0)."""
    values = ", ".join(["(%s, %s, %s)"] * rows)
    if vendor == "postgresql":
        return (
            f"SELECT v.column3, f.part, f.place, f.outcome, f.id, f.at FROM (VALUES {values}) "
            f"AS v CROSS JOIN LATERAL (SELECT e.tableoid::regclass::text AS part, "
            f"e.ctid::text AS place, e.outcome, e.id, e.at FROM {TABLE} e JOIN {KIND_TABLE} k "
            f"ON k.id = e.kind_id WHERE e.user_id = v.column1 AND {_ROW} OFFSET 0) AS f"
        )
    return (
        f"SELECT v.column3, NULL, e.id, e.outcome, e.id, e.at FROM (VALUES {values}) AS v "
        f"JOIN {TABLE} e ON e.user_id = v.column1 JOIN {KIND_TABLE} k ON k.id = e.kind_id "
        f"WHERE {_ROW}"
    )


def outcomes_write(
    found: Outcomes, taken: list[Taken] | None = None, *, before_id: int | None = None
) -> int:
    """Write send outcomes on their rows (the admitting decisions of those messages at or after
    `found.since`; with `before_id`, only rows of a lower id: those written before the
    decisions that follow the outcome in the stream), in the current transaction. Returns how
    many times a row took one.

    Every row is found first (outcomes_sql, 500 outcomes a query), its outcome settled in the
    entry's order, then each row that changes is updated once, by where it is: a row is never
    looked up after it was updated (on PostgreSQL its place changes when updated). `taken`
    gets each row whose outcome changed: its id, new outcome's code and time (the event
    stream's)."""
    adapt = connection.ops.adapt_datetimefield_value
    matched = 0
    settled: dict[tuple[str | None, Any], list[Any]] = {}  # where: [now, then, id, at]
    with connection.cursor() as cursor:
        for start in range(0, len(found.rows), 500):
            part = found.rows[start : start + 500]
            cursor.execute(
                outcomes_sql(len(part), connection.vendor),
                [
                    *(v for i, (user, message, _) in enumerate(part) for v in (user, message, i)),
                    found.channel,
                    adapt(found.since),
                ],
            )
            for place, table, key, code, row, at in sorted(
                cursor.fetchall(), key=lambda hit: hit[0]
            ):
                if before_id is not None and row >= before_id:
                    continue
                state = settled.setdefault((table, key), [code, code, row, at])
                outcome = LEDGER_OUTCOME_CODES[part[place][2]]
                if outcome != _RELEASED or not state[1]:
                    state[1] = outcome
                matched += 1
        changed: dict[tuple[str | None, int], list[Any]] = {}
        for (table, key), (before, after, row, at) in settled.items():
            if after != before:
                changed.setdefault((table, after), []).append(key)
                if taken is not None:
                    taken.append((row, after, row_time(at)))
        for (table, code), keys in changed.items():
            for start in range(0, len(keys), 1000):
                some = keys[start : start + 1000]
                if table is None:
                    marks = ", ".join(["%s"] * len(some))
                    cursor.execute(
                        f"UPDATE {TABLE} SET outcome = %s WHERE id IN ({marks})", [code, *some]
                    )
                else:
                    cursor.execute(
                        f"UPDATE {table} SET outcome = %s WHERE ctid = ANY(%s::tid[])",
                        [code, some],
                    )
    return matched


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def partitions_ensure(days: set[date]) -> None:
    """PostgreSQL: the day partitions of `days`, created when missing. Looked up each time (a
    catalog read per day written): a partition another process dropped, or a transaction that
    made one and rolled back, must not be taken for there."""
    with connection.cursor() as cursor:
        for day in sorted(days):
            name = partition_name(day)
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
    cutoff = datetime.combine(keep_from, datetime.min.time(), tzinfo=UTC)
    report = Upkeep(dropped_days=[], deleted_rows=0)
    if connection.vendor == "postgresql":
        today = now.date()
        partitions_ensure({today, today + timedelta(days=1), today + timedelta(days=2)})
        for day in partitions_list():
            if day < keep_from:
                with connection.cursor() as cursor:
                    cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
                report.dropped_days.append(day)
    else:
        while True:
            ids = list(
                LedgerEntry.objects.filter(at__lt=cutoff).values_list("pk", flat=True)[:10_000]
            )
            if not ids:
                break
            report.deleted_rows += LedgerEntry.objects.filter(pk__in=ids).delete()[0]
    # The kinds no day kept uses any more (their rows went with their days).
    if LedgerKind.objects.filter(last_day__lt=keep_from).delete()[0]:
        kinds_forget()
    LedgerCount.objects.filter(hour__lt=cutoff).delete()
    LedgerBatch.objects.filter(drained_at__lt=now - timedelta(days=1)).delete()
    # What the listeners keep that has aged out (the outcome events' ids, for one).
    for listener in drain_listeners():
        listener.upkeep(now, cutoff)
    return report


@dataclass
class Backlog:
    entries: int  # stream entries not drained yet (gate calls, and send outcomes)
    lag_seconds: float  # how long the oldest of them has waited (0: none)


def drain_backlog(*, now: datetime | None = None, client: RedisClient | None = None) -> Backlog:
    """How far the drain is behind, for the operator: the stream's length and the age of its
    oldest entry. The drain deletes what it wrote, so every entry left is undrained, the oldest
    first; its id is the time Redis appended it (in ms). One round trip: XLEN and XRANGE of
    one entry. The age is read against this process's clock (`now`: tests)."""
    client = client or get_redis()
    pipe = client.pipeline(transaction=False)  # one slot: the stream's key
    pipe.xlen(stream_key())
    pipe.xrange(stream_key(), count=1)
    length, oldest = pipe.execute()
    if not oldest:
        return Backlog(entries=int(length), lag_seconds=0.0)
    appended_ms = int(_text(oldest[0][0]).partition("-")[0])
    lag_ms = instant_ms(instant_or_now(now)) - appended_ms
    return Backlog(entries=int(length), lag_seconds=max(0.0, lag_ms / 1000))


def drainer_key() -> str:
    return f"{stream_key()}:drainer"


def ledger_drain_all(
    *,
    rounds: int | None = None,
    seconds: float = 10.0,
    wait: float | None = None,
    client: RedisClient | None = None,
) -> int:
    """Drain until the stream is empty, `rounds` drains were made or `seconds` passed (beat's
    task; tests and commands that must see every decision). Returns the decisions written.

    One drainer at a time: drains that overlap (beat's ticks queued behind a blast, two
    workers taking them) would write the same hours' counts and the same days' rows and wait on
    each other's locks. The drainer holds a lock in Redis (`<stream>:drainer`, CLAIM_IDLE_MS
    long, renewed after each round); another waits `wait` seconds for it (at most `seconds`,
    which counts from the call, waiting included) and returns 0 if it is still held: the holder
    is draining. A round that outlasted the lock (another drainer may have taken it since) is
    the last: what it wrote is committed, and the drain returns it."""
    client = client or get_redis()
    deadline = time.monotonic() + seconds
    lease = RedisLease(drainer_key(), CLAIM_IDLE_MS / 1000, client=client)
    if not lease.take(wait=seconds if wait is None else min(wait, seconds)):
        return 0
    written, made = 0, 0
    try:
        while True:
            report = ledger_drain(client=client)
            written, made = written + report.rows, made + 1
            if not report.entries or made == rounds or time.monotonic() > deadline:
                return written
            if not lease.renew():  # its full time again for the next round
                return written  # the round outlasted it (the `finally` says so)
    finally:
        if not lease.release():  # held past its time by a drain that long: another may hold it
            logger.warning("The ledger drainer's lock expired while it drained")
