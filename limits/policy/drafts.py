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

from collections.abc import Iterable
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
from limits.policy.bodies import (
    DraftBody,
    DraftQuietAdd,
    DraftQuietChange,
    DraftRuleAdd,
    DraftRuleChange,
)
from limits.policy.rules import (
    RuleFields,
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
class _Rule:
    id: int
    fields: RuleFields
    classic: tuple[str, str] | None  # the (segment, channel) of a classic cap's rule


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
    rules: list[_Rule], segment: str, name: str, channel: str, limits: dict[str, int | None]
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
            rules.append(_Rule(id=0, fields=fields, classic=(segment, channel)))
        else:
            rules[at] = _Rule(id=rules[at].id, fields=fields, classic=(segment, channel))


def _rules_applied(changes: DraftBody, problems: _Problems, slugs: list[str]) -> list[_Rule]:
    rows = list(Rule.objects.select_related("segment", "cap__segment").order_by("id"))
    rules = [
        _Rule(
            id=row.pk,
            fields=rule_read(row),
            classic=(row.cap.segment.slug, row.cap.channel) if row.cap is not None else None,
        )
        for row in rows
    ]
    by_row = {row.pk: row for row in rows}
    for k, change in enumerate(changes.rules):
        where = f"rules[{k}]"
        given: dict[str, Any] = msgspec.to_builtins(change)
        if isinstance(change, DraftRuleAdd):
            fields = rule_fields_of_json(given)
            found = RULES.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                rules.append(_Rule(id=0, fields=fields, classic=None))
            continue
        at = _found(rules, change.id, problems, where, "rule")
        if at is None:
            continue
        row = by_row.get(change.id)
        if row is not None and (why := _guarded(row)) is not None:
            problems.add(f"{where}.id", why)
            continue
        if isinstance(change, DraftRuleChange):
            fields = RuleFields(**{**asdict(rules[at].fields), **rule_changes_given(given)})
            found = RULES.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                rules[at].fields = fields
        else:
            del rules[at]
    return rules


def _guarded(row: Rule) -> str | None:
    try:
        RULES.guard(row)
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


@dataclass
class _Quiet:
    id: int
    fields: QuietFields


def _quiet_applied(changes: DraftBody, problems: _Problems, slugs: list[str]) -> list[QuietView]:
    rows = list(QuietHours.objects.select_related("segment").order_by("id"))
    entries = [_Quiet(id=row.pk, fields=quiet_read(row)) for row in rows]
    for k, change in enumerate(changes.quiet_hours):
        where = f"quiet_hours[{k}]"
        given: dict[str, Any] = msgspec.to_builtins(change)
        given.pop("op", None)
        if isinstance(change, DraftQuietAdd):
            fields = QuietFields(**given)
            found = QUIET_HOURS.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                entries.append(_Quiet(id=0, fields=fields))
            continue
        at = _found(entries, change.id, problems, where, "quiet hours")
        if at is None:
            continue
        if isinstance(change, DraftQuietChange):
            given.pop("id", None)
            fields = QuietFields(**{**asdict(entries[at].fields), **given})
            found = QUIET_HOURS.problems(fields, segments=slugs)
            if found:
                problems.merge(where, found)
            else:
                entries[at].fields = fields
        else:
            del entries[at]
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


def draft_save(changes: DraftBody, *, user: Any = None, via: str = "admin") -> list[int]:
    """Apply the draft's changes through the one write path, in order, in one transaction (a
    problem found then rolls back every change); the ids of the setting changes recorded."""
    with transaction.atomic():
        mark = SettingChange.objects.aggregate(m=Max("id"))["m"] or 0
        for change in changes.rules:
            given: dict[str, Any] = msgspec.to_builtins(change)
            if isinstance(change, DraftRuleAdd):
                RULES.create(fields=rule_fields_of_json(given), user=user, via=via)
                continue
            row = RULES.find(change.id)
            if row is None:
                raise ValidationError({"id": [f"No rule {change.id}."]})
            if isinstance(change, DraftRuleChange):
                RULES.update(row=row, changes=rule_changes_given(given), user=user, via=via)
            else:
                RULES.delete(row=row, user=user, via=via)
        for quiet in changes.quiet_hours:
            given = msgspec.to_builtins(quiet)
            given.pop("op", None)
            if isinstance(quiet, DraftQuietAdd):
                QUIET_HOURS.create(fields=QuietFields(**given), user=user, via=via)
                continue
            entry = QUIET_HOURS.find(quiet.id)
            if entry is None:
                raise ValidationError({"id": [f"No quiet hours {quiet.id}."]})
            given.pop("id", None)
            if isinstance(quiet, DraftQuietChange):
                QUIET_HOURS.update(row=entry, changes=given, user=user, via=via)
            else:
                QUIET_HOURS.delete(row=entry, user=user, via=via)
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
