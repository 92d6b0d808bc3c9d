"""A draft of the policy: rules, quiet hours and classic caps added, changed or deleted without
being saved, and the policy table they would make (what a backtest replays the ledger under).

Each change is checked by what the one write path checks (limits.policy.services: the kind's
`problems` and `guard`, the cap's bounds), so a draft is refused exactly where saving it would
be; a problem is named by its place in the body (`changes.rules[2].limit`). Nothing is written.

Rules keep their ids, and a rule a draft adds gets one from DRAFT_RULE_IDS up (in the order
added), far above any row's, so that a backtest names the rules that made a difference the
same way under both policies. Added rules and a cap's new rules come after the others, as a
saved rule would (the rules list is in id order).
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

import msgspec
from django.core.exceptions import ValidationError as ModelValidationError
from django.db import transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from gatekeeper.lib.conflicts import Conflict
from limits.channels import channel_problem
from limits.engine.quiet import QuietFields, QuietView, minutes_from_text, quiet_read
from limits.engine.table import PolicyTable, RuleView
from limits.models.policy import QuietHours, Rule, SettingChange
from limits.policy.authored import AuthoredKind
from limits.policy.bodies import (
    DraftBody,
)
from limits.policy.rules import (
    rule_changes_given,
    rule_fields_of_json,
    rule_read,
    rule_view_of,
    window_seconds_of,
)
from limits.policy.selectors import policy_read
from limits.policy.services import QUIET_HOURS, RULES, cap_set, classic_rule_fields
from segments.models import Segment

DRAFT_RULE_IDS = 1 << 53  # a draft's added rules: this id and up


@dataclass
class _Entry:
    """A rule or a quiet-hours entry as the draft has it (id 0: added, not numbered yet)."""

    id: int
    fields: Any  # the kind's fields (RuleFields, QuietFields)
    classic: tuple[str, str] | None = None  # the (segment, channel) of a classic cap's rule


def _body_fields(given: dict[str, Any]) -> dict[str, Any]:
    """A change's body without what names the change (`op`, `id`): the fields it gives."""
    return {name: value for name, value in given.items() if name not in ("op", "id")}


@dataclass(frozen=True)
class _Drafted:
    """How a kind's draft changes become its fields: an added entry's whole fields, and a
    change's fields (those it gives), from the body's JSON."""

    kind: AuthoredKind[Any, Any]
    made: Callable[[dict[str, Any]], Any]
    changes: Callable[[dict[str, Any]], dict[str, Any]]


_RULES = _Drafted(RULES, made=rule_fields_of_json, changes=rule_changes_given)
_QUIET = _Drafted(
    QUIET_HOURS, made=lambda given: QuietFields(**_body_fields(given)), changes=_body_fields
)


@dataclass
class Draft:
    """A draft applied: the table it makes and the rules it added (by id)."""

    table: PolicyTable
    added: dict[int, str] = field(default_factory=dict)  # draft rule id: its name
    # How far back a replay must read sends: the longer retention of the two policies.
    keep: timedelta = timedelta(0)

    def is_draft_rule(self, rule_id: int) -> bool:
        return rule_id >= DRAFT_RULE_IDS


class _Problems:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.found: dict[str, list[str]] = {}

    def add(self, where: str, message: str) -> None:
        self.found.setdefault(f"{self.prefix}{where}", []).append(message)

    def merge(self, where: str, problems: dict[str, list[str]]) -> None:
        for name, messages in problems.items():
            for message in messages:
                self.add(f"{where}.{name}", message)


def draft_applied(
    changes: DraftBody, *, table: PolicyTable | None = None, prefix: str = "changes."
) -> Draft:
    """The policy table (`table`, else the one in force, read from the database) with the
    draft's changes applied in order. rest_framework's ValidationError naming every problem
    by its place (`prefix` + `rules[0].limit`), before anything is made."""
    base = table if table is not None else policy_read()
    problems = _Problems(prefix)
    names = dict(Segment.objects.values_list("slug", "name"))
    slugs = list(names)
    rules = _rules_applied(changes, problems, slugs)
    quiet = _quiet_applied(changes, problems, slugs)
    classic = dict(base.classic)
    for k, cap in enumerate(changes.caps):
        where = f"caps[{k}]"
        if cap.segment not in slugs:
            problems.add(f"{where}.segment", f"No segment '{cap.segment}'.")
            continue
        if (why := channel_problem(cap.channel, scope=True)) is not None:
            problems.add(f"{where}.channel", why)
            continue
        classic[(cap.segment, cap.channel)] = (cap.daily, cap.weekly)
        named = names.get(cap.segment, cap.segment)
        _cap_rules(
            rules, cap.segment, named, cap.channel, {"daily": cap.daily, "weekly": cap.weekly}
        )
    if problems.found:
        raise ValidationError(problems.found)
    added: dict[int, str] = {}
    next_id = DRAFT_RULE_IDS
    views: list[RuleView] = []
    for rule in rules:
        if rule.id == 0:
            rule.id, next_id = next_id, next_id + 1
        if rule.id >= DRAFT_RULE_IDS:
            added[rule.id] = rule.fields.name
        if rule.fields.enabled:
            views.append(rule_view_of(rule.fields, id=rule.id, classic=rule.classic is not None))
    drafted = replace(base, rules=tuple(views), quiet=tuple(quiet), classic=classic)
    keep = timedelta(milliseconds=max(base.retention_ms, drafted.retention_ms))
    return Draft(table=drafted, added=added, keep=keep)


def _cap_rules(
    rules: list[_Entry], segment: str, name: str, channel: str, limits: dict[str, int | None]
) -> None:
    """A classic cap set: its two rules (rolling 24 h and 7 d) as limits.policy.services makes
    them, replacing the ones it had (kept in place, with their ids)."""
    for which, value in limits.items():
        seconds = window_seconds_of(which)
        at = next(
            (
                k
                for k, rule in enumerate(rules)
                if rule.classic == (segment, channel) and rule.fields.window_seconds == seconds
            ),
            None,
        )
        if value is None:
            if at is not None:
                del rules[at]
            continue
        fields = classic_rule_fields(
            segment=segment,
            segment_name=name,
            channel=channel,
            which=which,
            limit=value,
        )
        if at is None:
            rules.append(_Entry(id=0, fields=fields, classic=(segment, channel)))
        else:
            rules[at] = _Entry(id=rules[at].id, fields=fields, classic=(segment, channel))


def _rules_applied(changes: DraftBody, problems: _Problems, slugs: list[str]) -> list[_Entry]:
    rows = list(Rule.objects.select_related("segment", "cap__segment").order_by("id"))
    rules = [
        _Entry(
            id=row.pk,
            fields=rule_read(row),
            classic=(row.cap.segment.slug, row.cap.channel) if row.cap is not None else None,
        )
        for row in rows
    ]
    _applied(_RULES, changes.rules, rules, {row.pk: row for row in rows}, problems, "rules", slugs)
    return rules


def _quiet_applied(changes: DraftBody, problems: _Problems, slugs: list[str]) -> list[QuietView]:
    rows = list(QuietHours.objects.select_related("segment").order_by("id"))
    entries = [_Entry(id=row.pk, fields=quiet_read(row)) for row in rows]
    by_row = {row.pk: row for row in rows}
    _applied(_QUIET, changes.quiet_hours, entries, by_row, problems, "quiet_hours", slugs)
    return [
        QuietView(
            id=entry.id,
            segment=entry.fields.segment,
            channel=entry.fields.channel,
            start=minutes_from_text(entry.fields.start),
            end=minutes_from_text(entry.fields.end),
            spread_minutes=entry.fields.spread_minutes,
        )
        for entry in entries
        if entry.fields.enabled
    ]


def _applied(
    drafted: _Drafted,
    changes: Sequence[Any],
    entries: list[_Entry],
    rows: dict[int, Any],
    problems: _Problems,
    name: str,
    slugs: list[str],
) -> None:
    """A kind's draft changes (`changes`, the body's list `name`) applied in order to its
    `entries` (the stored `rows` by id), each checked as the write path checks it: its
    problems, and the kind's guard of the row it changes or deletes."""
    kind = drafted.kind
    for k, change in enumerate(changes):
        where = f"{name}[{k}]"
        given: dict[str, Any] = msgspec.to_builtins(change)
        if given["op"] == "add":
            fields = drafted.made(given)
            found = kind.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                entries.append(_Entry(id=0, fields=fields))
            continue
        at = _found(entries, change.id, problems, where, kind.noun)
        if at is None:
            continue
        row = rows.get(change.id)
        if row is not None and (why := _guarded(kind, row)) is not None:
            problems.add(f"{where}.id", why)
            continue
        if given["op"] == "change":
            fields = kind.fields(**{**asdict(entries[at].fields), **drafted.changes(given)})
            found = kind.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                entries[at].fields = fields
        else:
            del entries[at]


def _guarded(kind: AuthoredKind[Any, Any], row: Any) -> str | None:
    try:
        kind.guard(row)
    except (Conflict, ModelValidationError) as refused:
        return str(refused.args[0]) if refused.args else str(refused)
    return None


def _found(
    items: Iterable[Any], row_id: int, problems: _Problems, where: str, noun: str
) -> int | None:
    for k, item in enumerate(items):
        if item.id == row_id:
            return k
    problems.add(f"{where}.id", f"No {noun} {row_id} (or the draft deleted it above).")
    return None


def draft_save(changes: DraftBody, *, user: Any = None, via: str = "admin") -> list[int]:
    """Apply the draft's changes through the one write path, in order, in one transaction (a
    problem found then rolls back every change); the ids of the setting changes recorded."""
    with transaction.atomic():
        mark = SettingChange.objects.aggregate(m=Max("id"))["m"] or 0
        _saved(_RULES, changes.rules, user=user, via=via)
        _saved(_QUIET, changes.quiet_hours, user=user, via=via)
        for cap in changes.caps:
            segment = Segment.objects.get(slug=cap.segment)
            cap_set(
                segment=segment,
                channel=cap.channel,
                daily=cap.daily,
                weekly=cap.weekly,
                user=user,
                via=via,
            )
        return list(
            SettingChange.objects.filter(id__gt=mark).order_by("id").values_list("id", flat=True)
        )


def _saved(drafted: _Drafted, changes: Sequence[Any], *, user: Any, via: str) -> None:
    kind = drafted.kind
    for change in changes:
        given: dict[str, Any] = msgspec.to_builtins(change)
        if given["op"] == "add":
            kind.create(fields=drafted.made(given), user=user, via=via)
            continue
        row = kind.find(change.id)
        if row is None:
            raise ValidationError({"id": [f"No {kind.noun} {change.id}."]})
        if given["op"] == "change":
            kind.update(row=row, changes=drafted.changes(given), user=user, via=via)
        else:
            kind.delete(row=row, user=user, via=via)
