"""A segment's cap grid in the console (channels and `all` x daily /
weekly), with plain-language readings and the history, saved through
`limits.engine.table.services.cap_grid_save`."""

from typing import Any

from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import reverse

from gatekeeper.lib.console import render, require
from limits.channels import scope_label, scopes
from limits.models.policy import Cap, Rule, SettingChange
from limits.policy.admin.base import history_url
from limits.policy.services import (
    CAPS,
    cap_describe,
    cap_from_text,
    cap_grid_save,
    cap_text,
    cap_warnings,
)
from segments.models import Segment


def cap_grid(request: HttpRequest, *, site: AdminSite, segment_id: int) -> HttpResponse:
    require(request, "limits.view_cap")
    segment = get_object_or_404(Segment, pk=segment_id)
    can_edit = request.user.has_perms(("limits.add_cap", "limits.change_cap"))
    stored = {cap.channel: cap_text(cap) for cap in Cap.objects.filter(segment=segment)}
    values = {scope: stored.get(scope, cap_text(None)) for scope in scopes()}
    # The values the form is based on travel in hidden fields, so a save can tell which cells
    # this user changed. After a failed save they stay what the user first saw.
    shown = {scope: dict(cells) for scope, cells in values.items()}
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        if not can_edit:
            raise PermissionDenied
        post = request.POST
        typed = {
            # a scope not on the form that was sent (a channel added since) stays unchanged
            scope: {f: post.get(f"{scope}-{f}", "").strip() for f in ("daily", "weekly")}
            for scope in scopes()
            if f"{scope}-daily" in post or f"{scope}-weekly" in post
        }
        seen = {
            scope: {f: post[f"{scope}-{f}-was"].strip() for f in ("daily", "weekly") if f"{scope}-{f}-was" in post}
            for scope in scopes()
        }  # fmt: skip
        saved = cap_grid_save(segment=segment, typed=typed, seen=seen, user=request.user)
        if not saved.errors:
            if saved.changed:
                messages.success(
                    request,
                    f"Saved caps of {segment.name}. {'; '.join(saved.changed)}. Running "
                    "workers apply them within seconds.",
                )
            else:
                messages.info(request, "Nothing changed.")
            return HttpResponseRedirect(request.path)
        messages.error(request, "Nothing was saved: fix the values marked below.")
        for scope in scopes():
            shown[scope].update(seen.get(scope, {}))
        values.update(saved.values)
        shown.update(saved.shown)
        errors = saved.errors
    rows = []
    for scope in scopes():
        try:
            daily = cap_from_text(values[scope]["daily"], "daily")
            weekly = cap_from_text(values[scope]["weekly"], "weekly")
            reading = cap_describe(channel=scope, daily=daily, weekly=weekly)
            warnings = cap_warnings(daily=daily, weekly=weekly)
        except ValidationError:
            reading, warnings = "", []
        rows.append(
            {
                "scope": scope,
                "label": scope_label(scope),
                "daily": values[scope]["daily"],
                "weekly": values[scope]["weekly"],
                "daily_was": shown[scope]["daily"],
                "weekly_was": shown[scope]["weekly"],
                "reading": reading,
                "warnings": warnings,
                "errors": errors.get(scope, []),
            }
        )
    history = [_cap_change(c) for c in cap_changes(segment)[:25]]
    return render(
        request,
        site,
        "cap_grid.html",
        f"Caps of {segment.name}",
        segment=segment,
        rows=rows,
        can_edit=can_edit,
        history=history,
        history_url=history_url("cap"),
        segments=Segment.objects.order_by("priority"),
        rules=Rule.objects.filter(segment=segment, cap__isnull=True).count(),
        rules_url=f"{reverse('admin:limits_rule_changelist')}?segment__id__exact={segment.pk}",
        can_see_rules=request.user.has_perm("limits.view_rule"),
    )


def cap_changes(segment: Segment) -> QuerySet[SettingChange]:
    """The changes of a segment's caps, newest first (from the one history)."""
    slug = segment.slug
    return SettingChange.objects.filter(
        Q(after__segment=slug) | Q(before__segment=slug), kind=CAPS.kind
    ).select_related("by")


def _cap_change(change: Any) -> dict[str, Any]:
    """A cap's change as the cap grid's history shows it."""
    before, after = change.before or {}, change.after or {}
    return {
        "changed_at": change.at,
        "changed_by": change.by,
        "channel": after.get("channel") or before.get("channel"),
        "old_daily": before.get("daily"),
        "old_weekly": before.get("weekly"),
        "new_daily": after.get("daily"),
        "new_weekly": after.get("weekly"),
        "via": change.via,
    }
