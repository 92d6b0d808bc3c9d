"""Writes of caps, cap rules, quiet hours, topics and quota resets. Admin, REST API and commands
change caps through `cap_set` and `cap_delete` (the kind `CAPS`), rules, quiet hours and topics
through their authored kinds (`RULES.create`, `RULES.update`, `RULES.delete`, and the same of
`QUIET_HOURS` and `TOPICS`); each goes through the one write path (limits/policy/authored.py),
recorded in the one history with who made it, in the same transaction."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import transaction

from gatekeeper.lib.accounts import Actor, account_acting
from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.integers import INT32_MAX, NotAWholeNumber, whole_number
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.channels import noun, scope_label, validate_scope
from limits.engine.limiter import get_limiter
from limits.engine.quiet import (
    QUIET_SHOWN,
    QuietFields,
    quiet_apply,
    quiet_as_json,
    quiet_json_describe,
    quiet_problems,
    quiet_read,
    quiet_value_words,
)
from limits.engine.topics import (
    TOPIC_SHOWN,
    TopicFields,
    topic_apply,
    topic_as_json,
    topic_json_describe,
    topic_problems,
    topic_read,
    topic_value_words,
)
from limits.models.policy import Cap, QuietHours, QuotaReset, Rule, Topic
from limits.policy.authored import Action, AuthoredKind, Kind, SettingKind, deleted
from limits.policy.quota import Unavailable, user_quota
from limits.policy.rules import (
    RULE_SHOWN,
    RuleFields,
    rule_apply,
    rule_as_json,
    rule_json_describe,
    rule_problems,
    rule_read,
    rule_value_words,
    window_seconds_of,
)
from segments.models import Segment


class ClassicRule(Conflict):
    """A classic cap's rule changes only with its cap (REST: 409)."""


def _not_classic(rule: Rule) -> None:
    if rule.cap_id is not None:
        raise ClassicRule(_classic_message(rule))


# Cap rules and quiet hours: created, changed and deleted through limits.policy.authored
# (`RULES.create`, `QUIET_HOURS.update`, ...), each change checked whole and recorded with who made
# it.
RULES: AuthoredKind[Rule, RuleFields] = AuthoredKind(
    kind=Kind.RULE,
    noun="rule",
    model=Rule,
    fields=RuleFields,
    read=rule_read,
    problems=rule_problems,
    apply=rule_apply,
    as_json=rule_as_json,
    describe=rule_json_describe,
    value_words=rule_value_words,
    shown=RULE_SHOWN,
    guard=_not_classic,  # a classic cap's rule changes with its cap (cap_set)
)


QUIET_HOURS: AuthoredKind[QuietHours, QuietFields] = AuthoredKind(
    kind=Kind.QUIET_HOURS,
    noun="quiet hours",
    model=QuietHours,
    fields=QuietFields,
    read=quiet_read,
    problems=quiet_problems,
    apply=quiet_apply,
    as_json=quiet_as_json,
    describe=quiet_json_describe,
    value_words=quiet_value_words,
    shown=QUIET_SHOWN,
)


# Topics (limits/engine/topics.py): their slug is set when made and never changed (sends and
# people's preferences name it), which the REST body and the admin form see to.
TOPICS: AuthoredKind[Topic, TopicFields] = AuthoredKind(
    kind=Kind.TOPIC,
    noun="topic",
    model=Topic,
    fields=TopicFields,
    read=topic_read,
    problems=topic_problems,
    apply=topic_apply,
    as_json=topic_as_json,
    describe=topic_json_describe,
    value_words=topic_value_words,
    shown=TOPIC_SHOWN,
)


def _classic_message(rule: Rule) -> str:
    segment = rule.segment.slug if rule.segment is not None else ""
    return (
        f"'{rule.name}' is a classic cap: change it with the cap grid or "
        f"PUT /api/v1/limits/{segment}/{rule.channel}/."
    )


def classic_rule_name(segment_name: str, channel: str, which: str) -> str:
    return f"{segment_name}: {which} cap on {scope_label(channel)}"


def classic_rule_fields(
    *, segment: str, segment_name: str, channel: str, which: str, limit: int, enabled: bool = True
) -> RuleFields:
    """The one rule for what a classic cap's `which` ("daily", "weekly") limit is as a rule:
    every send on its channel of the segment's users, over a rolling 24 hours or 7 days."""
    return RuleFields(
        name=classic_rule_name(segment_name, channel, which),
        segment=segment,
        channel=channel,
        match="any",
        tag="",
        window_kind="rolling",
        window_seconds=window_seconds_of(which),
        window_unit="",
        limit=limit,
        reserve_below_priority=None,
        reserve_slots=None,
        enabled=enabled,
    )


def _classic_sync(cap: Cap, user: Actor, via: str) -> None:
    """Make the cap's two rules (rolling 24 h and 7 d, every send) match its limits, each
    change written through the rules' kind (a classic rule's guard is the caller's own)."""
    for which, value in (("daily", cap.daily), ("weekly", cap.weekly)):
        seconds = window_seconds_of(which)
        rule = Rule.objects.filter(cap=cap, window_seconds=seconds).first()
        if value is None:
            if rule is not None:
                RULES.write(Action.DELETED, locate=_as_is(rule), change=deleted, user=user,
                            via=via)  # fmt: skip
            continue

        def synced(row: Rule | None, which: str = which, value: int = value) -> Rule:
            before = rule_as_json(row) if row is not None else None
            fields = classic_rule_fields(
                segment=cap.segment.slug,
                segment_name=cap.segment.name,
                channel=cap.channel,
                which=which,
                limit=value,
                enabled=row.enabled if row is not None else True,
            )
            row = row or Rule(cap=cap, created_by=account_acting(user))
            rule_apply(row, fields, cap.segment)
            row.changed_by = account_acting(user)
            if before is None or rule_as_json(row) != before:
                row.save()
            return row

        RULES.write(None, locate=_as_is(rule), change=synced, user=user, via=via)


_Row = TypeVar("_Row", Rule, Cap)


def _as_is(row: _Row | None) -> Callable[[], _Row | None]:
    """A `locate` of a row already found (under the caller's lock)."""
    return lambda: row


def cap_as_json(cap: Cap) -> dict[str, Any]:  # type: ignore[explicit-any]
    """A cap as its history keeps it: its scope and limits, as the REST API names them."""
    return {
        "segment": cap.segment.slug,
        "channel": cap.channel,
        "daily": cap.daily,
        "weekly": cap.weekly,
    }


def _limits_text(values: Any) -> str:  # type: ignore[explicit-any]
    values = values or {}
    return " / ".join(
        "none" if values.get(key) is None else f"{values[key]:,}" for key in ("daily", "weekly")
    )


def cap_change_words(action: str, before: Any, after: Any) -> str:  # type: ignore[explicit-any]
    """A cap's change in words: what it reads as now, or that it is gone."""
    if action == Action.DELETED:
        return f"Deleted (it was {_limits_text(before)} in 24 h / 7 d)."
    reads = cap_describe(channel=after["channel"], daily=after["daily"], weekly=after["weekly"])
    if action == Action.CREATED:
        return f"Created: {reads}."
    return f"24 h / 7 d: {_limits_text(before)} → {_limits_text(after)}: {reads}."


CAPS: SettingKind[Cap] = SettingKind(
    kind=Kind.CAP, model=Cap, as_json=cap_as_json, worded=cap_change_words
)


def cap_set(
    *,
    segment: Segment,
    channel: str,
    daily: int | None,
    weekly: int | None,
    user: Actor = None,
    via: str = "admin",
) -> Cap:
    """Create or change the cap of (segment, channel) and record the change in its history.

    Raises ValidationError naming the field for an unknown channel or a negative limit.
    A weekly cap below the daily one is allowed (the weekly cap then governs) but flagged by
    `cap_warnings`.
    """
    validate_scope(channel)
    for name, value in (("daily", daily), ("weekly", weekly)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ValidationError({name: f"{name} must be empty (no cap) or a whole number >= 0."})

    def locate() -> Cap | None:
        # The segment's row lock serializes edits of its caps: two requests creating the same
        # cap at once make one cap and two history rows, not an IntegrityError.
        Segment.objects.select_for_update().filter(pk=segment.pk).first()
        return Cap.objects.select_for_update().filter(segment=segment, channel=channel).first()

    changed = []  # whether the cap was made or its limits changed: its rules follow then only

    def limits_set(cap: Cap | None) -> Cap:
        if cap is None:
            changed.append(True)
            return Cap.objects.create(segment=segment, channel=channel, daily=daily, weekly=weekly)
        if (cap.daily, cap.weekly) != (daily, weekly):
            changed.append(True)
            cap.daily, cap.weekly = daily, weekly
            cap.save(update_fields=["daily", "weekly", "updated_at"])
        return cap

    with transaction.atomic():
        cap = CAPS.write(None, locate=locate, change=limits_set, user=user, via=via)
        assert cap is not None
        if changed:
            _classic_sync(cap, user, "cap")
    return cap


def cap_delete(cap: Cap, *, user: Actor = None, via: str = "admin") -> None:
    """Delete a cap and its two rules, each recorded in the history."""

    with transaction.atomic():
        # The locks first, in cap_set's order (the segment, then the cap): a cap_set at the same
        # moment cannot add a rule the loop below would miss, and the two never wait on each
        # other's rows in opposite orders.
        Segment.objects.select_for_update().filter(pk=cap.segment_id).first()
        locked = Cap.objects.select_for_update().select_related("segment").get(pk=cap.pk)
        for rule in Rule.objects.filter(cap=locked).select_related("segment"):
            RULES.write(Action.DELETED, locate=_as_is(rule), change=deleted, user=user,
                        via="cap")  # fmt: skip
        CAPS.write(Action.DELETED, locate=_as_is(locked), change=deleted, user=user, via=via)


def cap_warnings(*, daily: int | None, weekly: int | None) -> list[str]:
    """Plain-language warnings about a pair of limits that is allowed but probably a mistake."""
    warnings = []
    if daily is not None and weekly is not None and weekly < daily:
        warnings.append(
            f"The weekly cap ({weekly}) is below the daily cap ({daily}): "
            f"no user can ever get more than {weekly} in a day."
        )
    return warnings


def cap_describe(*, channel: str, daily: int | None, weekly: int | None) -> str:
    """'at most 3 emails in any 24 hours and 10 in any 7 days'; 'at most 1 email ...'."""
    if daily == 0 or weekly == 0:
        return (
            "no marketing messages at all"
            if channel == "all"
            else f"no marketing {noun(channel, 2)}"
        )
    parts = []
    if daily is not None:
        parts.append(f"at most {daily:,} {noun(channel, daily)} in any 24 hours")
    if weekly is not None:
        parts.append(
            f"{weekly:,} in any 7 days"
            if parts
            else f"at most {weekly:,} {noun(channel, weekly)} in any 7 days"
        )
    return " and ".join(parts) if parts else f"no cap on {noun(channel, 2)}"


def cap_from_text(raw: str | None, label: str) -> int | None:
    """A cap typed in a form: empty means no cap; otherwise the one rule for whole numbers,
    0 to 2,147,483,647. Raises ValidationError whose message starts with `label`."""
    text = (raw or "").strip()
    if not text:
        return None
    try:
        return whole_number(text, maximum=INT32_MAX, what=label)
    except NotAWholeNumber as exc:
        raise ValidationError(str(exc)) from None


def cap_text(cap: Cap | None) -> dict[str, str]:
    """A cap's limits as a form shows them ("" for no cap)."""
    daily = None if cap is None else cap.daily
    weekly = None if cap is None else cap.weekly
    return {
        "daily": "" if daily is None else str(daily),
        "weekly": "" if weekly is None else str(weekly),
    }


@dataclass
class GridSave:
    """What a save of a segment's cap grid did: the readings of the scopes it changed, or the
    problems per scope (then nothing was saved), and what each cell should show again."""

    changed: list[str] = field(default_factory=list)
    errors: dict[str, list[str]] = field(default_factory=dict)
    values: dict[str, dict[str, str]] = field(default_factory=dict)
    shown: dict[str, dict[str, str]] = field(default_factory=dict)


def cap_grid_save(
    *,
    segment: Segment,
    typed: dict[str, dict[str, str]],
    seen: dict[str, dict[str, str]],
    user: Actor = None,
) -> GridSave:
    """Save a segment's cap grid: per scope, the cells as `typed` and as they were `seen` when
    the form was loaded. A cell the user left alone is not written; one that someone else
    changed since it was loaded is a conflict (nothing saved, the new value shown); a bad value
    saves nothing. All scopes are written in one transaction, each through `cap_set`."""
    stored = {cap.channel: cap for cap in Cap.objects.filter(segment=segment)}
    result = GridSave()
    parsed: dict[str, tuple[int | None, int | None]] = {}
    for scope, cells in typed.items():
        now = cap_text(stored.get(scope))
        was = {f: seen.get(scope, now).get(f, now[f]) for f in ("daily", "weekly")}
        result.values[scope], result.shown[scope] = dict(cells), dict(was)
        try:
            daily = cap_from_text(cells["daily"], f"{scope} daily")
            weekly = cap_from_text(cells["weekly"], f"{scope} weekly")
        except ValidationError as exc:
            result.errors.setdefault(scope, []).extend(exc.messages)
            continue
        if cells == was:
            continue  # left alone
        if now != was:
            reads = cap_describe(
                channel=scope,
                daily=cap_from_text(now["daily"], scope),
                weekly=cap_from_text(now["weekly"], scope),
            )
            result.errors.setdefault(scope, []).append(
                f"{scope} was changed by someone else while you edited: it is now '{reads}'. "
                "Check it and save again."
            )
            result.values[scope] = result.shown[scope] = dict(now)  # the next save starts here
            continue
        parsed[scope] = (daily, weekly)
    if result.errors:
        return result
    with transaction.atomic():
        for scope, (daily, weekly) in parsed.items():
            cap_set(
                segment=segment, channel=scope, daily=daily, weekly=weekly, user=user, via="admin"
            )
            result.changed.append(
                f"{scope}: {cap_describe(channel=scope, daily=daily, weekly=weekly)}"
            )
    return result


def quota_reset(*, user_id: int, reason: str, user: Actor = None) -> QuotaReset:
    """Forget a user's send log, every channel (an audited admin action): records
    who, when, why and what was used, in the same transaction as the reset, so a failed reset
    leaves no record and a record always means the reset happened. Raises Unavailable."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "Say why the quota is reset (kept in the audit log)."})
    quota = user_quota(user_id)
    usage = {
        scope: {"daily": values["daily"]["used"], "weekly": values["weekly"]["used"]}
        for scope, values in quota["scopes"].items()
    }
    with transaction.atomic():
        record = QuotaReset.objects.create(
            user_id=user_id,
            segment_slug=quota["segment"],
            usage=usage,
            reason=reason[:300],
            reset_by=account_acting(user),
        )
        try:
            get_limiter().reset(user_id)
        except REDIS_DOWN as exc:  # the audit row is rolled back with the transaction
            raise Unavailable(f"Redis is not answering ({exc}); nothing was reset.") from exc
    return record
