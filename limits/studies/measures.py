"""What happens to the users of a study (a cap experiment, or the global control group), kept a
day and a bucket at a time for the experiments report (limits/studies/lift.py,
limits/studies/report.py).

**Who is in a study.** A user enters a study with their first marketing decision while it runs
(whatever the decision: a held-out user's `holdout`, a suppressed one's): an intention-to-treat
cohort of the people the company's marketing tried to reach, the same way in every arm, so arms
are compared on like people. An experiment's users are in the arm the gate put them in (the
ledger keeps it with each decision). The control group (study 0) compares the held-out users
with a treatment sample of the same size: the users whose hash under the group's salt lies just
above the share (from `share` to twice it), drawn like the group, so the two are alike but for
the marketing. Users of the group's excluded segments are in neither. Each member is one row
(`StudyMember`: study, user, arm, bucket, the day they entered), written by the ledger's drain
in the transaction that writes their decisions, so nothing is counted twice.

**What is kept.** Per study, UTC day, arm and bucket (`StudyDay`): users who entered, marketing
sends admitted, unsubscribes and complaints (from the suppression list, as they are added);
and per event name (`StudyEvent`): the outcome events the company posts (POST
/api/v1/events/), their count and value. An event or an unsubscribe counts for each study its
user is a member of that runs at its time (from the day they entered). Events are not kept one
by one: only their ids' hashes, for GATEKEEPER_EVENTS_DEDUP_DAYS, so that a repeat counts once.

**When an event is counted.** Members are written by the drain, seconds (more behind a large
campaign) after their decisions; an event posted in between must still find them. So posted
events take the decisions' way: events_taken appends them to the ledger's Redis stream, behind
every decision already made, and the drain counts them (events_counted) in the stream's order,
in the transaction that writes the members of the decisions before them. An event thus counts
for every study its user entered with a decision made before it was posted, however far the
drain lags; not for one they enter with a later decision (it reached Gatekeeper before they
were ever in the study). Its id's hash is kept in the same transaction: a repeat, posted again
or taken again by a drain that retries, counts no second time.

A change of the control group's share or salt starts its report afresh (its members and days
are dropped): who is in it changed.
"""

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgspec
import numpy as np
from django.conf import settings
from django.db import connection

from gatekeeper.lib.redis_client import RedisClient, get_redis
from limits.engine.assignment import CONTROL_GROUP, HELD, SAMPLE, HoldoutView, bound, keyed_hashes
from limits.ledger.stream import arm_of_code, stream_key
from limits.ledger.table import values_inserted
from limits.models.studies import EventSeen, Experiment, StudyDay, StudyEvent, StudyMember
from limits.reasons import Category, Reason
from limits.studies.lift import BUCKETS

_DAYS = StudyDay._meta.db_table
_EVENTS = StudyEvent._meta.db_table
_MEMBERS = StudyMember._meta.db_table
_SEEN = EventSeen._meta.db_table


def buckets_of(user_ids: Sequence[int] | Any, study: int) -> Any:
    """Each user's bucket in `study` (limits.studies.lift.BUCKETS of them), independent of arms."""
    hashes = keyed_hashes(user_ids, f"gatekeeper-study-buckets:{study}")
    return (hashes % np.uint64(BUCKETS)).astype(np.int64)


def control_arms(user_ids: Sequence[int] | Any, segments: Sequence[str], group: HoldoutView) -> Any:
    """Per user, HELD, SAMPLE, or -1 for neither (the control group's excluded segments, and
    everyone beyond twice the share)."""
    hashes = keyed_hashes(user_ids, group.salt)
    arms = np.full(len(hashes), -1, dtype=np.int64)
    arms[hashes < np.uint64(bound(min(1.0, 2 * group.share)))] = SAMPLE
    arms[hashes < np.uint64(bound(group.share))] = HELD
    if group.exclude_segments:
        for k, segment in enumerate(segments):
            if segment in group.exclude_segments:
                arms[k] = -1
    return arms


def _upsert(cursor: Any, table: str, keys: Sequence[str], columns: Sequence[str],
            rows: Mapping[tuple[Any, ...], Sequence[float]]) -> None:  # fmt: skip
    """Add `rows` ({key values: column values}) into `table`'s counters."""
    if not rows:
        return
    adapt = connection.ops.adapt_datefield_value
    values = [  # in key order: two writers of the same rows take their locks alike
        tuple(adapt(v) if isinstance(v, date) else v for v in key) + tuple(rows[key])
        for key in sorted(rows)
    ]
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in columns)
    values_inserted(
        cursor,
        f"INSERT INTO {table} ({', '.join((*keys, *columns))})",
        values,
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {added}",
    )


def decisions_noted(calls: Iterable[Any], group: HoldoutView | None) -> None:
    """In the drain's transaction: the members the decisions of `calls` (limits.ledger.stream
    Decided entries) bring into studies, and their admitted marketing sends per day. `group`:
    the control group as it stands (None: none)."""
    seen: dict[tuple[int, int], tuple[int, int, date]] = {}  # -> arm, bucket, first day
    days: dict[tuple[Any, ...], list[int]] = {}  # (study, day, arm, bucket) -> entered, sends
    for call in calls:
        if call.category != Category.MARKETING or (not call.arms and group is None):
            continue  # nobody of this call is in a study: nothing per decision
        day = call.at.date()
        users = call.users
        codes = np.asarray(call.arm_codes(), dtype=np.int64)
        held = control_arms(users, call.segments, group) if group is not None else None
        inside = codes != 0 if held is None else (codes != 0) | (held >= 0)
        buckets: dict[int, Any] = {}
        for k in np.flatnonzero(inside).tolist():
            user_id = users[k]
            memberships = []
            if codes[k]:
                memberships.append(arm_of_code(int(codes[k])) or (0, 0))
            if held is not None and held[k] >= 0:
                memberships.append((CONTROL_GROUP, int(held[k])))
            for study, arm in memberships:
                found = seen.get((study, user_id))
                if found is None:
                    if study not in buckets:
                        buckets[study] = buckets_of(users, study).tolist()
                    found = seen[(study, user_id)] = (arm, buckets[study][k], day)
                if call.reasons[k] == Reason.ALLOWED:
                    days.setdefault((study, day, found[0], found[1]), [0, 0])[1] += 1
    if not seen:
        return
    with connection.cursor() as cursor:
        for study, user_id in _members_added(cursor, seen):
            arm, bucket, day = seen[(study, user_id)]
            days.setdefault((study, day, arm, bucket), [0, 0])[0] += 1
        _upsert(cursor, _DAYS, ("study", "day", "arm", "bucket"), ("entered", "sends"), days)


def _members_added(
    cursor: Any, seen: Mapping[tuple[int, int], tuple[int, int, date]]
) -> list[tuple[int, int]]:
    """Insert the members not yet in; (study, user id) of those that were not."""
    tail = "ON CONFLICT (study, user_id) DO NOTHING RETURNING study, user_id"
    if connection.vendor == "postgresql":
        # Columns as arrays: one statement whatever the count, nothing for the driver to split.
        columns: list[list[Any]] = [[], [], [], [], []]
        for (study, user_id), (arm, bucket, day) in seen.items():
            for column, value in zip(columns, (study, user_id, arm, bucket, day), strict=True):
                column.append(value)
        cursor.execute(
            f"INSERT INTO {_MEMBERS} (study, user_id, arm, bucket, entered) SELECT * FROM "
            "unnest(%s::integer[], %s::bigint[], %s::smallint[], %s::smallint[], %s::date[]) "
            + tail,
            columns,
        )
        return [tuple(row) for row in cursor.fetchall()]
    adapt = connection.ops.adapt_datefield_value
    rows = [
        (study, user_id, arm, bucket, adapt(day))
        for (study, user_id), (arm, bucket, day) in seen.items()
    ]
    return [(row[0], row[1]) for row in values_inserted(cursor, f"INSERT INTO {_MEMBERS} "
            "(study, user_id, arm, bucket, entered)", rows, tail)]  # fmt: skip


def _memberships(user_ids: set[int], studies: set[int]) -> dict[int, list[StudyMember]]:
    found: dict[int, list[StudyMember]] = {}
    if not user_ids or not studies:
        return found
    ids = sorted(user_ids)
    for start in range(0, len(ids), 5_000):
        part = ids[start : start + 5_000]
        for member in StudyMember.objects.filter(study__in=studies, user_id__in=part):
            found.setdefault(member.user_id, []).append(member)
    return found


def _studies_at(instants: Iterable[datetime]) -> dict[datetime, set[int]]:
    """The studies running at each of `instants`: the experiments then started and not yet
    ended or stopped, and the control group (every experiment read once)."""
    spans = list(Experiment.objects.values_list("pk", "starts_at", "ends_at", "stopped_at"))
    found: dict[datetime, set[int]] = {}
    for at in instants:
        live = {CONTROL_GROUP}
        for pk, starts, ends, stopped in spans:
            if starts <= at < ends and (stopped is None or at < stopped):
                live.add(pk)
        found[at] = live
    return found


def outcomes_noted(user_ids: Sequence[int], *, kind: str, at: datetime) -> None:
    """Unsubscribes or complaints (`kind`) of users at `at`, counted for each running study
    they are members of (in the caller's transaction)."""
    column = {"unsubscribed": "unsubscribes", "complained": "complaints"}.get(kind)
    if column is None or not user_ids:
        return
    studies = _studies_at([at])[at]
    members = _memberships(set(user_ids), studies)
    day = at.astimezone(UTC).date()
    rows: dict[tuple[Any, ...], list[float]] = {}
    for user_id in user_ids:
        for m in members.get(user_id, ()):
            if m.entered <= day:
                rows.setdefault((m.study, day, m.arm, m.bucket), [0])[0] += 1
    with connection.cursor() as cursor:
        _upsert(cursor, _DAYS, ("study", "day", "arm", "bucket"), (column,), rows)


@dataclass(frozen=True, slots=True)
class Event:
    """An outcome event as the company posts it."""

    event_id: str
    user_id: int
    name: str
    at: datetime
    value: float = 0.0


FUTURE_SLACK = timedelta(hours=1)  # clocks differ: an event this far ahead is taken


def event_problems(events: Sequence[Event], *, now: datetime) -> dict[str, list[str]]:
    """What is wrong with posted events, by field (`events.3.at`): an event from the future,
    or older than GATEKEEPER_EVENTS_DEDUP_DAYS (a repeat of it could not be told apart)."""
    days = int(settings.GATEKEEPER_EVENTS_DEDUP_DAYS)
    oldest = now - timedelta(days=days)
    problems: dict[str, list[str]] = {}
    for n, event in enumerate(events):
        if event.at > now + FUTURE_SLACK:
            problems[f"events.{n}.at"] = ["In the future: an outcome is posted once it happened."]
        elif event.at < oldest:
            problems[f"events.{n}.at"] = [
                f"More than {days} days ago (GATEKEEPER_EVENTS_DEDUP_DAYS): a repeat of it could "
                "no longer be told apart."
            ]
        if len(problems) >= 20:
            break
    return problems


def event_key(event_id: str) -> int:
    """An event id's 63-bit hash (a signed 64-bit column takes it)."""
    digest = hashlib.blake2b(event_id.encode(), digest_size=8, person=b"gk-event").digest()
    return int.from_bytes(digest, "big") >> 1


# The ledger stream's field of an entry of outcome events (its own entries' field is "d"), and
# the events an entry holds at most (a request's 10,000 make ten: a drain's round stays small).
EVENTS_FIELD = "e"
EVENTS_PER_ENTRY = 1_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PostedEvents(msgspec.Struct, array_like=True, frozen=True):
    """A ledger stream entry of outcome events, as events_taken packs it (msgpack), a column at
    a time: each event's id as its hash (event_key), user, name, time (microseconds since
    1970, UTC) and value."""

    keys: list[int]
    users: list[int]
    names: list[str]
    at_us: list[int]
    values: list[float]

    def rows(self) -> Iterable[tuple[int, int, str, datetime, float]]:
        """(key, user id, name, time, value) per event."""
        for key, user, name, at_us, value in zip(
            self.keys, self.users, self.names, self.at_us, self.values, strict=True
        ):
            yield key, user, name, _EPOCH + timedelta(microseconds=at_us), value


_POSTED = msgspec.msgpack.Decoder(PostedEvents)


def events_entry(packed: bytes) -> PostedEvents:
    """A stream entry of outcome events, its types checked. Raises msgspec.DecodeError (or
    ValueError) for what events_taken does not write."""
    entry = _POSTED.decode(packed)
    if not (
        len(entry.keys) == len(entry.users) == len(entry.names) == len(entry.at_us)
        == len(entry.values)
    ):  # fmt: skip
        raise ValueError("an entry of outcome events has columns of different lengths")
    return entry


def _seen(keys: Sequence[int]) -> set[int]:
    found: set[int] = set()
    for start in range(0, len(keys), 5_000):
        part = keys[start : start + 5_000]
        found.update(EventSeen.objects.filter(key__in=part).values_list("key", flat=True))
    return found


def events_taken(events: Sequence[Event], *, client: RedisClient | None = None) -> dict[str, int]:
    """Take posted outcome events (already checked: event_problems) for counting: append them
    to the ledger's Redis stream, behind every decision made before them, where the drain
    counts them (events_counted). Returns `accepted` (taken) and `repeated` (ids already
    counted, or twice in `events`: not taken). An id posted again before the drain counted it
    the first time is taken again, and the drain counts it once.

    One round trip (the entries pipelined, one key). Raises what the Redis client raises
    (gatekeeper.lib.redis_client.REDIS_DOWN) when Redis does not take them: a retry of the
    whole request then counts each event once, whatever part of it was taken."""
    by_key: dict[int, Event] = {}
    for event in events:
        by_key.setdefault(event_key(event.event_id), event)
    seen = _seen(list(by_key))
    fresh = [(key, event) for key, event in by_key.items() if key not in seen]
    if fresh:
        pipe = (client or get_redis()).pipeline(transaction=False)
        for start in range(0, len(fresh), EVENTS_PER_ENTRY):
            packed = msgspec.msgpack.encode(_packed(fresh[start : start + EVENTS_PER_ENTRY]))
            pipe.xadd(
                stream_key(),
                {EVENTS_FIELD: packed},
                maxlen=settings.GATEKEEPER_LEDGER_BUFFER_MAX,
                approximate=True,
            )
        pipe.execute()
    return {"accepted": len(fresh), "repeated": len(events) - len(fresh)}


def _packed(events: Sequence[tuple[int, Event]]) -> PostedEvents:
    """Events with their ids' keys, as a stream entry holds them."""
    return PostedEvents(
        keys=[key for key, _ in events],
        users=[e.user_id for _, e in events],
        names=[e.name for _, e in events],
        at_us=[(e.at - _EPOCH) // timedelta(microseconds=1) for _, e in events],
        values=[float(e.value) for _, e in events],
    )


def events_record(events: Sequence[Event]) -> dict[str, int]:
    """Count outcome events at once, in the caller's transaction, against the members written
    so far, each id once: for a caller that drained the ledger first (the demo's seed). The API
    takes events with events_taken, which waits for nothing and misses no member the drain has
    still to write. Returns `accepted` (new), `repeated` (seen before, or twice in `events`)
    and `counted` (of the new, those of a user in a running study)."""
    counted = events_counted([_packed([(event_key(e.event_id), e) for e in events])])
    return {"accepted": counted.new, "repeated": counted.repeated, "counted": counted.counted}


@dataclass
class Counted:
    """What events_counted did: events `new` (counted once, into every study of theirs or
    none), `repeated` (ids already counted: nothing), `counted` (of the new, those of a user
    in some running study)."""

    new: int = 0
    repeated: int = 0
    counted: int = 0


def events_counted(entries: Sequence[PostedEvents]) -> Counted:
    """In the caller's transaction (the drain's): count the outcome events of `entries` into
    their users' studies, each event id once (within GATEKEEPER_EVENTS_DEDUP_DAYS), against the
    members written so far (the drain's: those of every decision before the entries in the
    stream)."""
    adapt = connection.ops.adapt_datefield_value
    by_key: dict[int, tuple[int, str, datetime, float]] = {}
    taken = 0
    for entry in entries:
        for key, user, name, at, value in entry.rows():
            by_key.setdefault(key, (user, name, at, value))
            taken += 1
    report = Counted()
    if not by_key:
        return report
    with connection.cursor() as cursor:
        new = {
            key
            for (key,) in values_inserted(
                cursor,
                f"INSERT INTO {_SEEN} (key, day)",
                [(key, adapt(at.date())) for key, (_, _, at, _) in by_key.items()],
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                per=1_000,
            )
        }
        fresh = [by_key[key] for key in new]
        live = _studies_at({at for _, _, at, _ in fresh})
        members = _memberships(
            {user for user, _, _, _ in fresh}, set().union(*live.values()) if live else set()
        )
        rows: dict[tuple[Any, ...], list[float]] = {}
        for user, name, at, value in fresh:
            day = at.date()
            mine = [m for m in members.get(user, ()) if m.study in live[at] and m.entered <= day]
            for m in mine:
                row = rows.setdefault((m.study, day, m.arm, m.bucket, name), [0, 0.0])
                row[0] += 1
                row[1] += value
            report.counted += bool(mine)
        _upsert(
            cursor, _EVENTS, ("study", "day", "arm", "bucket", "name"), ("count", "value"), rows
        )
    report.new = len(new)
    report.repeated = taken - len(new)
    return report


def events_prune(*, now: datetime | None = None) -> int:
    """Forget event ids older than GATEKEEPER_EVENTS_DEDUP_DAYS (upkeep); how many."""
    now = now or datetime.now(UTC)
    before = now.date() - timedelta(days=settings.GATEKEEPER_EVENTS_DEDUP_DAYS)
    deleted, _ = EventSeen.objects.filter(day__lt=before).delete()
    return deleted
