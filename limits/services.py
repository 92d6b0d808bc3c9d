"""Writes to caps and rules. Admin, REST API and commands change caps through `cap_set` and
rules through `rule_create`, `rule_update` and `rule_delete`; each change is recorded with who
made it, in the same transaction."""

from dataclasses import asdict, dataclass, field
from datetime import time
from typing import Any

import redis
from django.core.exceptions import ValidationError
from django.db import transaction

from gatekeeper.lib.integers import INT32_MAX, NotAWholeNumber, whole_number
from limits.channels import noun, scope_label, validate_scope
from limits.limiter import get_limiter
from limits.models import Cap, CapChange, QuietHours, QuietHoursChange, QuotaReset, Rule, RuleChange
from limits.quiet import QuietFields, minutes_from_text, quiet_as_json, quiet_problems
from limits.quota import Unavailable, user_quota
from limits.rules import RuleFields, rule_as_json, rule_problems, window_seconds_of
from limits.selectors import policy_cache
from segments.models import Segment


class ClassicRule(ValidationError):
    """A classic cap's rule changes only with its cap."""


def _who(user: Any) -> Any:
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def _record(rule: Rule, action: str, before: Any, after: Any, user: Any, via: str) -> None:
    RuleChange.objects.create(
        rule=rule if action != RuleChange.Action.DELETED else None,
        rule_name=rule.name,
        action=action,
        before=before,
        after=after,
        changed_by=_who(user),
        via=via,
    )


def _apply(rule: Rule, fields: RuleFields, segment: Segment | None) -> None:
    rule.name = fields.name.strip()
    rule.segment = segment
    rule.channel = fields.channel
    rule.match = fields.match
    rule.tag = fields.tag if fields.match == "tag" else ""
    rule.window_kind = fields.window_kind
    rule.window_seconds = fields.window_seconds if fields.window_kind == "rolling" else None
    rule.window_unit = fields.window_unit if fields.window_kind == "calendar" else ""
    rule.limit = fields.limit
    rule.reserve_below_priority = fields.reserve_below_priority
    rule.reserve_slots = fields.reserve_slots
    rule.enabled = fields.enabled


def rule_fields(rule: Rule) -> RuleFields:
    """A stored rule's editable fields (the base of a partial change)."""
    return RuleFields(
        name=rule.name,
        segment=rule.segment.slug if rule.segment is not None else None,
        channel=rule.channel,
        match=rule.match,
        tag=rule.tag,
        window_kind=rule.window_kind,
        window_seconds=rule.window_seconds,
        window_unit=rule.window_unit,
        limit=rule.limit,
        reserve_below_priority=rule.reserve_below_priority,
        reserve_slots=rule.reserve_slots,
        enabled=rule.enabled,
    )


def _checked(fields: RuleFields) -> Segment | None:
    """The rule's segment; ValidationError by field for anything wrong with the rule."""
    slugs = list(Segment.objects.values_list("slug", flat=True))
    problems = rule_problems(fields, segments=slugs)
    if problems:
        raise ValidationError(problems)
    return Segment.objects.get(slug=fields.segment) if fields.segment is not None else None


def rule_create(*, fields: RuleFields, user: Any = None, via: str = "admin") -> Rule:
    """A new rule, governing every process within GATEKEEPER_CAPS_TTL_SECONDS."""
    segment = _checked(fields)
    with transaction.atomic():
        rule = Rule(created_by=_who(user), changed_by=_who(user))
        _apply(rule, fields, segment)
        rule.save()
        _record(rule, RuleChange.Action.CREATED, None, rule_as_json(rule), user, via)
    transaction.on_commit(policy_cache().invalidate)
    return rule


def rule_update(
    *, rule: Rule, changes: dict[str, Any], user: Any = None, via: str = "admin"
) -> Rule:
    """Change some of a rule's fields (`changes`: RuleFields names); the rule is checked whole.
    A classic cap's rule is refused: it changes with its cap (cap_set)."""
    if rule.cap_id is not None:
        raise ClassicRule({"non_field_errors": [_classic_message(rule)]})
    with transaction.atomic():
        locked = Rule.objects.select_for_update().get(pk=rule.pk)
        # The changes on the row as it is now, not as the caller read it: two changes of
        # different fields at once both stay.
        fields = RuleFields(**{**asdict(rule_fields(locked)), **changes})
        segment = _checked(fields)
        before = rule_as_json(locked)
        _apply(locked, fields, segment)
        locked.changed_by = _who(user)
        after = rule_as_json(locked)
        if after != before:
            locked.save()
            _record(locked, RuleChange.Action.CHANGED, before, after, user, via)
    transaction.on_commit(policy_cache().invalidate)
    return locked


def rule_delete(*, rule: Rule, user: Any = None, via: str = "admin") -> None:
    if rule.cap_id is not None:
        raise ClassicRule({"non_field_errors": [_classic_message(rule)]})
    with transaction.atomic():
        _record(rule, RuleChange.Action.DELETED, rule_as_json(rule), None, user, via)
        rule.delete()
    transaction.on_commit(policy_cache().invalidate)


def _classic_message(rule: Rule) -> str:
    segment = rule.segment.slug if rule.segment is not None else ""
    return (
        f"'{rule.name}' is a classic cap: change it with the cap grid or "
        f"PUT /api/v1/limits/{segment}/{rule.channel}/."
    )


def classic_rule_name(segment: Segment, channel: str, which: str) -> str:
    return f"{segment.name}: {which} cap on {scope_label(channel)}"


def _classic_sync(cap: Cap, user: Any, via: str) -> None:
    """Make the cap's two rules (rolling 24 h and 7 d, every send) match its limits."""
    for which, value in (("daily", cap.daily), ("weekly", cap.weekly)):
        seconds = window_seconds_of(which)
        rule = Rule.objects.filter(cap=cap, window_seconds=seconds).first()
        if value is None:
            if rule is not None:
                _record(rule, RuleChange.Action.DELETED, rule_as_json(rule), None, user, via)
                rule.delete()
            continue
        if rule is None:
            rule = Rule(cap=cap, created_by=_who(user))
            before = None
        else:
            before = rule_as_json(rule)
        rule.name = classic_rule_name(cap.segment, cap.channel, which)
        rule.segment = cap.segment
        rule.channel = cap.channel
        rule.match = Rule.Match.ANY
        rule.window_kind = Rule.WindowKind.ROLLING
        rule.window_seconds = seconds
        rule.limit = value
        rule.changed_by = _who(user)
        after = rule_as_json(rule) if before is not None else None
        if before is None or after != before:
            rule.save()
            action = RuleChange.Action.CREATED if before is None else RuleChange.Action.CHANGED
            _record(rule, action, before, rule_as_json(rule), user, via)


def cap_set(
    *,
    segment: Segment,
    channel: str,
    daily: int | None,
    weekly: int | None,
    user: Any = None,
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
    with transaction.atomic():
        # The segment's row lock serializes edits of its caps: two requests creating the same
        # cap at once make one cap and two history rows, not an IntegrityError.
        Segment.objects.select_for_update().filter(pk=segment.pk).first()
        cap = Cap.objects.select_for_update().filter(segment=segment, channel=channel).first()
        old_daily, old_weekly = (cap.daily, cap.weekly) if cap else (None, None)
        if cap is None:
            cap = Cap.objects.create(segment=segment, channel=channel, daily=daily, weekly=weekly)
        elif (cap.daily, cap.weekly) == (daily, weekly):
            return cap
        else:
            cap.daily, cap.weekly = daily, weekly
            cap.save(update_fields=["daily", "weekly", "updated_at"])
        CapChange.objects.create(
            cap=cap,
            segment_slug=segment.slug,
            channel=channel,
            old_daily=old_daily,
            old_weekly=old_weekly,
            new_daily=daily,
            new_weekly=weekly,
            changed_by=_who(user),
            via=via,
        )
        _classic_sync(cap, user, "cap")
    # This process sees its own edit at once; the others within the cache TTL.
    transaction.on_commit(policy_cache().invalidate)
    return cap


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
    user: Any = None,
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


# --- quiet hours -------------------------------------------------------------------------------


def quiet_fields(entry: QuietHours) -> QuietFields:
    """A stored entry's editable fields (the base of a partial change)."""
    return QuietFields(
        segment=entry.segment.slug if entry.segment is not None else None,
        channel=entry.channel,
        start=f"{entry.start:%H:%M}",
        end=f"{entry.end:%H:%M}",
        spread_minutes=entry.spread_minutes,
        enabled=entry.enabled,
    )


def _quiet_checked(fields: QuietFields) -> Segment | None:
    slugs = list(Segment.objects.values_list("slug", flat=True))
    problems = quiet_problems(fields, segments=slugs)
    if problems:
        raise ValidationError(problems)
    return Segment.objects.get(slug=fields.segment) if fields.segment is not None else None


def _quiet_apply(entry: QuietHours, fields: QuietFields, segment: Segment | None) -> None:
    entry.segment = segment
    entry.channel = fields.channel
    start, end = minutes_from_text(fields.start), minutes_from_text(fields.end)
    entry.start, entry.end = time(start // 60, start % 60), time(end // 60, end % 60)
    entry.spread_minutes = fields.spread_minutes
    entry.enabled = fields.enabled


def _quiet_record(
    entry: QuietHours, action: str, before: Any, after: Any, user: Any, via: str
) -> None:
    QuietHoursChange.objects.create(
        quiet_hours=entry if action != QuietHoursChange.Action.DELETED else None,
        label=str(entry)[:100],
        action=action,
        before=before,
        after=after,
        changed_by=_who(user),
        via=via,
    )


def quiet_create(*, fields: QuietFields, user: Any = None, via: str = "admin") -> QuietHours:
    """New quiet hours, governing every process within GATEKEEPER_CAPS_TTL_SECONDS."""
    segment = _quiet_checked(fields)
    with transaction.atomic():
        entry = QuietHours(created_by=_who(user), changed_by=_who(user))
        _quiet_apply(entry, fields, segment)
        entry.save()
        _quiet_record(entry, QuietHoursChange.Action.CREATED, None, quiet_as_json(entry), user, via)
    transaction.on_commit(policy_cache().invalidate)
    return entry


def quiet_update(
    *, entry: QuietHours, changes: dict[str, Any], user: Any = None, via: str = "admin"
) -> QuietHours:
    """Change some of an entry's fields (`changes`: QuietFields names); checked whole."""
    with transaction.atomic():
        locked = QuietHours.objects.select_for_update().get(pk=entry.pk)
        # The changes on the row as it is now, not as the caller read it (see rule_update).
        fields = QuietFields(**{**asdict(quiet_fields(locked)), **changes})
        segment = _quiet_checked(fields)
        before = quiet_as_json(locked)
        _quiet_apply(locked, fields, segment)
        locked.changed_by = _who(user)
        after = quiet_as_json(locked)
        if after != before:
            locked.save()
            _quiet_record(locked, QuietHoursChange.Action.CHANGED, before, after, user, via)
    transaction.on_commit(policy_cache().invalidate)
    return locked


def quiet_delete(*, entry: QuietHours, user: Any = None, via: str = "admin") -> None:
    with transaction.atomic():
        _quiet_record(entry, QuietHoursChange.Action.DELETED, quiet_as_json(entry), None, user, via)
        entry.delete()
    transaction.on_commit(policy_cache().invalidate)


def quota_reset(*, user_id: int, reason: str, user: Any = None) -> Any:
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
            reset_by=user if user is not None and user.is_authenticated else None,
        )
        try:
            get_limiter().reset(user_id)
        except redis.RedisError as exc:  # the audit row is rolled back with the transaction
            raise Unavailable(f"Redis is not answering ({exc}); nothing was reset.") from exc
    return record
