"""Writes to caps. Admin, REST API and commands all change caps through `cap_set`."""

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from gatekeeper.lib.integers import INT32_MAX, NotAWholeNumber, whole_number
from limits.channels import validate_scope
from limits.models import Cap, CapChange
from limits.selectors import caps_cache
from segments.models import Segment


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
            changed_by=user if user is not None and user.is_authenticated else None,
            via=via,
        )
    # This process sees its own edit at once; the others within the cache TTL.
    transaction.on_commit(caps_cache().invalidate)
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


NOUNS = {
    "email": ("email", "emails"),
    "push": ("push message", "push messages"),
    "all": ("marketing message", "marketing messages"),
}


def _noun(channel: str, count: int) -> str:
    one, many = NOUNS.get(channel, (f"{channel} message", f"{channel} messages"))
    return one if count == 1 else many


def cap_describe(*, channel: str, daily: int | None, weekly: int | None) -> str:
    """'at most 3 emails in any 24 hours and 10 in any 7 days'; 'at most 1 email ...'."""
    if daily == 0 or weekly == 0:
        return (
            "no marketing messages at all"
            if channel == "all"
            else f"no marketing {_noun(channel, 2)}"
        )
    parts = []
    if daily is not None:
        parts.append(f"at most {daily:,} {_noun(channel, daily)} in any 24 hours")
    if weekly is not None:
        parts.append(
            f"{weekly:,} in any 7 days"
            if parts
            else f"at most {weekly:,} {_noun(channel, weekly)} in any 7 days"
        )
    return " and ".join(parts) if parts else f"no cap on {_noun(channel, 2)}"


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
