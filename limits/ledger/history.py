"""A user's decision history, read from the send ledger's table: newest first, a page at
a time, for `GET /api/v1/users/<id>/history/` and the admin's user lookup.

Pages are keyset-paginated on (at, id), never by offset or COUNT(*): on PostgreSQL the ledger is
partitioned by day with an index on user_id, and a query that filters on user_id and orders by
at descending reads the user's few rows of each day from that index, the newest days first,
and stops after the page. `id` only breaks ties between decisions of the same millisecond (one gate
call writes one `at` for the whole batch); on PostgreSQL it is unique only together with `at`, which
the position always carries.
"""

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q

from gatekeeper.lib.ids import DATABASE_MAX
from gatekeeper.lib.problems import Problem
from limits.engine.table import arm_of_rule_id
from limits.ledger.table import message_of, outranked_of
from limits.models.ledger import LedgerEntry
from limits.models.policy import Rule
from limits.models.studies import ExperimentArm
from limits.policy.rules import rule_describe, rule_fields_of_json, rule_view_of
from limits.policy.selectors import rule_view

PAGE_DEFAULT = 50
PAGE_MAX = 500

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_US = (datetime.max.replace(tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)

# Where a page ends: the last decision's time in microseconds since 1970 (UTC) and its id,
# "1763800000123000.4521". Any digits are taken (a value past the year 9999 or a 64-bit id
# reads as the largest there is), so that every string of this form is a valid position, as
# the schema says.
POSITION = re.compile(r"([0-9]{1,20})\.([0-9]{1,20})")
POSITION_WORDS = "Take it from a page's `next`: microseconds since 1970 (UTC), a dot, an id."

# `from` and `to`: a UTC day, or an instant with its UTC offset (ISO 8601). The form is checked
# by this pattern (the schema states the same one), the calendar by datetime.
DAY = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
INSTANT = re.compile(
    rf"{DAY}(?:T[0-9]{{2}}:[0-9]{{2}}(?::[0-9]{{2}}(?:\.[0-9]{{1,6}})?)?(?:Z|[+-][0-9]{{2}}:[0-9]{{2}}))?"
)
INSTANT_WORDS = (
    "A UTC day (2026-11-24) or an instant with its UTC offset (2026-11-24T08:30:00Z, "
    "2026-11-24T09:30:00+01:00)."
)


@dataclass(frozen=True)
class Position:
    """A decision's place in the newest-first order: a page ends at one, the next starts
    after it."""

    at: datetime
    id: int

    def text(self) -> str:
        return f"{(self.at - EPOCH) // timedelta(microseconds=1)}.{self.id}"


def position_from_text(text: str, *, field: str = "") -> Position:
    """A position as `Position.text` writes it; a Problem (a ValueError, with the words)
    naming `field` for any other text."""
    found = POSITION.fullmatch(text)
    if found is None:
        raise Problem(f"Not a page position. {POSITION_WORDS}", field=field)
    micros = min(int(found[1]), LATEST_US)
    return Position(at=EPOCH + timedelta(microseconds=micros), id=min(int(found[2]), DATABASE_MAX))


def instant_from_text(text: str, *, end: bool = False) -> datetime:
    """`from` or `to` as an aware UTC datetime. A day is its start, or with `end` the start of
    the next day (so that `to` takes the whole day in); an instant is itself. ValueError (with
    the words) for anything else: no offset, no such date, out of range."""
    if not INSTANT.fullmatch(text):
        raise ValueError(f"'{text[:40]}' is not a day or an instant. {INSTANT_WORDS}")
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            if end:
                if day == date.max:
                    return datetime.max.replace(tzinfo=UTC)
                day += timedelta(days=1)
            return datetime.combine(day, time(), tzinfo=UTC)
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"'{text}' is not a date and time there is: {exc}.") from None


def interval_from_text(since: str | None, until: str | None) -> tuple[Any, Any]:
    """`?from=` and `?to=` (either may be missing: None) as instant_from_text reads them, `to`
    after `from`; a ValidationError naming the field otherwise."""
    bounds = []
    for field, value, end in (("from", since, False), ("to", until, True)):
        try:
            bounds.append(None if value is None else instant_from_text(value, end=end))
        except ValueError as exc:
            raise ValidationError({field: [str(exc)]}) from None
    start, stop = bounds
    if start is not None and stop is not None and stop <= start:
        raise ValidationError({"to": [f"Ends before it starts: {until} is not after {since}."]})
    return start, stop


@dataclass
class HistoryPage:
    decisions: list[dict[str, Any]]
    next: Position | None  # where the next (older) page starts; None: this one is the last


def user_history(
    *,
    user_id: int,
    limit: int = PAGE_DEFAULT,
    before: Position | None = None,
    channel: str | None = None,
    campaign: str | None = None,
    reason: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> HistoryPage:
    """Up to `limit` of the user's decisions, newest first, older than `before`, of `channel`,
    `campaign` and `reason` when given, from `since` (inclusive) to `until` (exclusive). Each
    with its deciding rule's name and description while the rule exists, and on an outranked
    one the send job that outranked it, with its value and in words."""
    entries = LedgerEntry.objects.filter(user_id=user_id).select_related("kind")
    if channel is not None:
        entries = entries.filter(kind__channel=channel)
    if campaign is not None:
        entries = entries.filter(kind__campaign=campaign)
    if reason is not None:
        entries = entries.filter(kind__reason=reason)
    if since is not None:
        entries = entries.filter(at__gte=since)
    if until is not None:
        entries = entries.filter(at__lt=until)
    if before is not None:
        # `at <= ...` on its own too: it prunes the newer partitions; the OR only settles the
        # ties at that very instant.
        entries = entries.filter(at__lte=before.at).filter(
            Q(at__lt=before.at) | Q(at=before.at, id__lt=before.id)
        )
    rows = list(entries.order_by("-at", "-id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    rules = _rules({row.kind.rule_id for row in rows if row.kind.rule_id is not None})
    arms = _arms(rows)
    return HistoryPage(
        decisions=[_decision(row, rules, arms) for row in rows],
        next=Position(at=rows[-1].at, id=rows[-1].id) if more else None,
    )


def user_decisions(user_id: int) -> list[dict[str, Any]]:
    """Every decision the ledger keeps for the user, newest first, as user_history shows them
    (the export: the rows of 90 days are a few thousand at most)."""
    rows = list(
        LedgerEntry.objects.filter(user_id=user_id).select_related("kind").order_by("-at", "-id")
    )
    rules = _rules({row.kind.rule_id for row in rows if row.kind.rule_id is not None})
    arms = _arms(rows)
    return [_decision(row, rules, arms) for row in rows]


def _arms(rows: list[LedgerEntry]) -> dict[tuple[int, int], ExperimentArm]:
    """The experiments' arms the rows name, by (experiment id, place)."""
    wanted = {(row.kind.experiment, row.kind.arm) for row in rows if row.kind.experiment}
    if not wanted:
        return {}
    found = ExperimentArm.objects.filter(experiment_id__in={e for e, _ in wanted})
    return {(arm.experiment_id, arm.position): arm for arm in found}


def _arm_rules(ids: set[int]) -> dict[int, dict[str, Any]]:
    """The rules of experiments' arms among `ids` (below 0): id, name and words."""
    places = {i: arm_of_rule_id(i) for i in ids if i < 0}
    arms = ExperimentArm.objects.filter(pk__in={p[0] for p in places.values() if p})
    by_pk = {arm.pk: arm for arm in arms}
    found = {}
    for rule_id, place in places.items():
        arm = by_pk.get(place[0]) if place else None
        if arm is None or place is None or place[1] >= len(arm.rules):
            continue
        view = rule_view_of(rule_fields_of_json(arm.rules[place[1]]), id=rule_id)
        found[rule_id] = {
            "id": rule_id,
            "name": view.name,
            "description": f"Arm '{arm.name}' of experiment {arm.experiment_id}: "
            + rule_describe(view),
            "classic": False,
        }
    return found


def _rules(ids: set[int]) -> dict[int, dict[str, Any]]:
    """The rules among `ids` that still exist: id, name and the rule in plain words (an
    experiment's arm's too)."""
    if not ids:
        return {}
    found = Rule.objects.filter(pk__in=ids).select_related("segment")
    return _arm_rules(ids) | {
        rule.pk: {
            "id": rule.pk,
            "name": rule.name,
            "description": rule_describe(
                rule_view(rule),
                segment_name=rule.segment.name if rule.segment is not None else None,
            ),
            "classic": rule.cap_id is not None,
        }
        for rule in found
    }


def _decision(
    row: LedgerEntry,
    rules: dict[int, dict[str, Any]],
    arms: dict[tuple[int, int], ExperimentArm],
) -> dict[str, Any]:
    kind, rule, experiment = row.kind, None, None
    if kind.experiment:
        arm = arms.get((kind.experiment, kind.arm or 0))
        experiment = {"id": kind.experiment, "arm": arm.name if arm is not None else None}
    if kind.rule_id == 0:  # the person's own frequency (limits.engine.table.own_rule)
        rule = {
            "id": 0,
            "name": "Their own frequency",
            "description": "The most the person chose to get on this channel (their preferences).",
            "classic": False,
        }
    elif kind.rule_id is not None:
        # A deleted rule is still named by its id (its changes are kept: RuleChange).
        rule = rules.get(kind.rule_id) or {
            "id": kind.rule_id,
            "name": None,
            "description": None,
            "classic": None,
        }
    return {
        "at": row.at.astimezone(UTC),
        "channel": kind.channel,
        "campaign": kind.campaign,
        "category": kind.category,
        "tags": list(kind.tags or []),
        "priority": kind.priority,
        "topic": kind.topic or None,
        "zone": kind.zone or None,
        "segment": kind.segment or None,
        "snapshot_version": kind.snapshot_version or None,
        "reason": kind.reason,
        "rule": rule,
        "message_id": message_of(kind.campaign, row.user_id, row.message_id),
        "outcome": row.outcome or None,
        "experiment": experiment,
        "outranked_by": _outranked(kind.outranked_by, row.value),
    }


def _outranked(job: int | None, value: float | None) -> dict[str, Any] | None:
    """What outranked a decision in a round, with it in words; None when nothing did."""
    found = outranked_of(job, value)
    if found is None:
        return None
    words = f"Outranked by job {job}, worth {number_text(value or 0.0)} to them."
    return {**found, "description": words}


def number_text(value: float) -> str:
    """A number as people write it: 3.5, 3 (not 3.0), 0.25, 1200000 (no exponent)."""
    return format(Decimal(repr(value)).normalize(), "f")
