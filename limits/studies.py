"""What happens to the users of a study (a cap experiment, or the global control group), kept a
day and a bucket at a time for the experiments report (limits/lift.py, limits/study_report.py).

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

A change of the control group's share or salt starts its report afresh (its members and days
are dropped): who is in it changed.
"""

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection

from limits.assignment import HoldoutView, bound, keyed_hashes
from limits.ledger.stream import arm_of_code
from limits.ledger.table import values_inserted
from limits.lift import BUCKETS
from limits.models import EventSeen, Experiment, StudyDay, StudyEvent, StudyMember
from limits.reasons import Category, Reason

CONTROL_GROUP = 0  # the global control group's study id (experiments' are their ids)
HELD, SAMPLE = 0, 1  # its arms: held out, and the treatment sample
_DAYS = StudyDay._meta.db_table
_EVENTS = StudyEvent._meta.db_table
_MEMBERS = StudyMember._meta.db_table
_SEEN = EventSeen._meta.db_table


def buckets_of(user_ids: Sequence[int] | Any, study: int) -> Any:
    """Each user's bucket in `study` (limits.lift.BUCKETS of them), independent of arms."""
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


def events_record(events: Sequence[Event]) -> dict[str, int]:
    """Count outcome events into their users' studies, each event id once (within
    GATEKEEPER_EVENTS_DEDUP_DAYS). In the caller's transaction. Returns `accepted` (new),
    `repeated` (seen before, or twice in this batch) and `counted` (into some study)."""
    adapt = connection.ops.adapt_datefield_value
    by_key: dict[int, Event] = {}
    for event in events:
        by_key.setdefault(event_key(event.event_id), event)
    with connection.cursor() as cursor:
        new = {
            key
            for (key,) in values_inserted(
                cursor,
                f"INSERT INTO {_SEEN} (key, day)",
                [(key, adapt(e.at.astimezone(UTC).date())) for key, e in by_key.items()],
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                per=1_000,
            )
        }
        fresh = [by_key[key] for key in new]
        live = _studies_at({e.at for e in fresh})
        members = _memberships(
            {e.user_id for e in fresh}, set().union(*live.values()) if live else set()
        )
        rows: dict[tuple[Any, ...], list[float]] = {}
        counted = 0
        for event in fresh:
            day = event.at.astimezone(UTC).date()
            mine = [m for m in members.get(event.user_id, ()) if m.study in live[event.at]]
            for m in mine:
                if m.entered <= day:
                    row = rows.setdefault((m.study, day, m.arm, m.bucket, event.name), [0, 0.0])
                    row[0] += 1
                    row[1] += event.value
            counted += any(m.entered <= day for m in mine)
        _upsert(
            cursor, _EVENTS, ("study", "day", "arm", "bucket", "name"), ("count", "value"), rows
        )
    return {"accepted": len(new), "repeated": len(events) - len(new), "counted": counted}


def events_prune(*, now: datetime | None = None) -> int:
    """Forget event ids older than GATEKEEPER_EVENTS_DEDUP_DAYS (upkeep); how many."""
    now = now or datetime.now(UTC)
    before = now.date() - timedelta(days=settings.GATEKEEPER_EVENTS_DEDUP_DAYS)
    deleted, _ = EventSeen.objects.filter(day__lt=before).delete()
    return deleted


def control_group_reset() -> None:
    """Start the control group's report afresh (its share or salt changed)."""
    for model in (StudyMember, StudyDay, StudyEvent):
        model.objects.filter(study=CONTROL_GROUP).delete()
