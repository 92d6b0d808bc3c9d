"""Writes to caps. Admin, REST API and commands all change caps through `cap_set`."""

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

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
