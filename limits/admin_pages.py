"""The limits app's console pages: a segment's cap grid (channels and `all` x daily / weekly),
with plain-language readings and the history, saved through `limits.services.cap_grid_save`; a
user's lookup (zone and local time, quiet hours per channel, classic caps, every rule's figures,
recent sends, the timeline of decisions from the ledger) with the audited quota reset, the
person's export as a file and their erasure; and the index's links to the cap rules and the
quiet hours (their pages are limits.admin's)."""

import contextlib
import datetime as dt
import time
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, reverse

from gatekeeper.lib.console import ConsoleLink, ago, page, render, require
from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import WholeNumberField
from gatekeeper.lib.permissions import ERASE_USERS, EXPORT_PERSONAL_DATA
from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.channels import scope_label, scopes
from limits.ledger.history import position_from_text, user_history
from limits.ledger.personal import person_export, places
from limits.ledger.stream import ledger_enabled
from limits.models import Cap, CapChange, PreferenceChange, Rule, Topic
from limits.preferences import preferences_read, preferences_words
from limits.quota import Unavailable, user_quiet_hours, user_quota, user_recent_sends
from limits.reasons import ADMITTED
from limits.selectors import topics_read
from limits.services import (
    cap_describe,
    cap_from_text,
    cap_grid_save,
    cap_text,
    cap_warnings,
    erasure_start,
)
from limits.services import quota_reset as quota_reset_service
from segments.models import Segment

LINKS = [
    ConsoleLink(
        "Look up a user",
        "user_lookup",
        "limits.view_cap",
        "A user's segment, quota and recent sends.",
    ),
    ConsoleLink(
        "Cap rules",
        "limits_rule_changelist",
        "limits.view_rule",
        "Every rule in plain words, and the ones that never decide.",
    ),
    ConsoleLink(
        "Quiet hours",
        "limits_quiethours_changelist",
        "limits.view_quiethours",
        "When each segment gets no marketing, on the user's own clock.",
    ),
]  # the grid is reached from each segment


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "segments/segment/<int:segment_id>/caps/", cap_grid, "cap_grid"),
        page(site, "users/", user_lookup, "user_lookup"),
        page(site, "users/<int:user_id>/reset/", quota_reset, "quota_reset"),
        page(site, "users/<int:user_id>/export/", person_download, "person_export"),
        page(site, "users/<int:user_id>/erase/", person_erase, "person_erase"),
    ]


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
    history = CapChange.objects.filter(segment_slug=segment.slug).select_related("changed_by")
    return render(
        request,
        site,
        "cap_grid.html",
        f"Caps of {segment.name}",
        segment=segment,
        rows=rows,
        can_edit=can_edit,
        history=history[:25],
        segments=Segment.objects.order_by("priority"),
        rules=Rule.objects.filter(segment=segment, cap__isnull=True).count(),
        rules_url=f"{reverse('admin:limits_rule_changelist')}?segment__id__exact={segment.pk}",
        can_see_rules=request.user.has_perm("limits.view_rule"),
    )


class UserLookupForm(forms.Form):
    user_id = forms.CharField(label="User id")  # replaced in __init__: the bound is a setting

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user_id"] = WholeNumberField(
            maximum=max_user_id(), what="User id", label="User id"
        )


class QuotaResetForm(forms.Form):
    reason = forms.CharField(
        max_length=300, help_text="Kept in the audit log with your name and the time."
    )


def _next_slot(usage: dict[str, Any], now: float) -> str:
    """When this scope lets one more send through, in words."""
    if 0 in (usage["daily"]["limit"], usage["weekly"]["limit"]):
        return "never: the cap is 0"
    wait = usage["next_slot_in"]
    if wait is None or wait <= 0:
        return "a slot is free now"
    return _wait_words(wait, now)


def _rule_next_slot(rule: dict[str, Any], now: float, time_zone: str) -> str:
    """When a rule lets one more send through, in words (and in the user's own time)."""
    if rule["limit"] == 0:
        return "never: the limit is 0"
    wait = rule["next_slot_in"]
    if rule["remaining"] > 0 or wait is None or wait <= 0:
        return "a slot is free now"
    return _wait_words(wait, now, time_zone)


def _wait_words(wait: float, now: float, time_zone: str | None = None) -> str:
    """ "in 3 h 10 min (2026-11-24 21:40 UTC)", with the user's own time when `time_zone`."""
    at = dt.datetime.fromtimestamp(now + wait, dt.UTC)
    local = ""
    if time_zone is not None:
        with contextlib.suppress(UnknownTimeZone):  # an unknown zone: UTC alone
            local = f", {at.astimezone(zone(time_zone)):%H:%M} their time"
    return f"in {ago(wait)} ({at:%Y-%m-%d %H:%M} UTC{local})"


def _user_zone(quota: dict[str, Any], now: float) -> dict[str, str]:
    """The user's zone, where it comes from, and their local time now."""
    name = quota["time_zone"]
    own = Segment.objects.filter(slug=quota["segment"]).values_list("time_zone", flat=True).first()
    source = "their segment's" if own else "the default (GATEKEEPER_DEFAULT_TIME_ZONE)"
    try:
        local = dt.datetime.fromtimestamp(now, zone(name))
    except UnknownTimeZone:
        return {"name": name, "source": source, "local": "unknown: the zone is not known here"}
    return {"name": name, "source": source, "local": f"{local:%Y-%m-%d %H:%M} ({local:%Z})"}


def _at_words(instant: float, time_zone: str, now: float) -> str:
    """An instant soon, in the user's own time and in UTC: "08:17 their time (06:17 UTC,
    in 7 h 17 min)"."""
    at = dt.datetime.fromtimestamp(instant, dt.UTC)
    try:
        local = f"{at.astimezone(zone(time_zone)):%Y-%m-%d %H:%M} their time"
    except UnknownTimeZone:
        local = "unknown zone"
    return f"{local} ({at:%H:%M} UTC, in {ago(instant - now)})"


def _quiet_rows(user_id: int, quota: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """Per channel: the quiet hours that apply to the user and whether they hold now."""
    rows = user_quiet_hours(user_id, segment=quota["segment"], zone=quota["time_zone"], now=now)
    for row in rows:
        row["label"] = scope_label(row["channel"])
        if row["quiet_now"]:
            row["until_text"] = _at_words(row["until"], quota["time_zone"], now)
            row["release_text"] = _at_words(row["release"], quota["time_zone"], now)
    return rows


TIMELINE_PAGE = 50  # decisions from the ledger per page of a user's timeline


def _timeline(user_id: int, before: str | None, now: float) -> dict[str, Any]:
    """A page of the user's decisions from the ledger, newest first (older ones from `before`,
    a position a previous page gave), with the links to the next older page and back to the
    newest. The database alone: shown also when Redis or the snapshot is missing."""
    problem, position = "", None
    if before:
        try:
            position = position_from_text(before)
        except ValueError as exc:
            problem = f"{exc} The newest decisions are shown."
    page = user_history(user_id=user_id, limit=TIMELINE_PAGE, before=position)
    for decision in page.decisions:
        decision["ago"] = ago(now - decision["at"].timestamp())
        decision["admitted"] = decision["reason"] in ADMITTED
    here = _lookup_url(user_id)
    return {
        "user_id": user_id,
        "decisions": page.decisions,
        "older": f"{here}&before={page.next.text()}#timeline" if page.next else None,
        "newest": f"{here}#timeline" if position is not None else None,
        "problem": problem,
        "ledger_on": ledger_enabled(),
        "page_size": TIMELINE_PAGE,
    }


def _preferences(user_id: int) -> dict[str, Any]:
    """What the person said, in words, and their last changes (the database only)."""
    topics = topics_read()
    names = dict(Topic.objects.values_list("slug", "name"))
    changes = PreferenceChange.objects.filter(user_id=user_id).select_related("changed_by")
    return {
        "lines": preferences_words(preferences_read(user_id, topics=topics), names),
        "changes": list(changes.order_by("-id")[:10]),
    }


def user_lookup(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, "limits.view_cap")
    form = UserLookupForm(request.GET or None)
    quota, sends, problem, user_zone = None, [], "", {}
    quiet: list[dict[str, Any]] = []
    timeline = None
    said: dict[str, Any] | None = None
    if form.is_valid():
        user_id = form.cleaned_data["user_id"]
        timeline = _timeline(user_id, request.GET.get("before"), time.time())
        if request.user.has_perm("limits.view_preference"):
            said = _preferences(user_id)
        try:
            quota = user_quota(user_id)
            sends = user_recent_sends(user_id)
        except Unavailable as exc:
            problem = str(exc)
        else:
            now = time.time()
            user_zone = _user_zone(quota, now)
            quiet = _quiet_rows(user_id, quota, now)
            for scope, usage in quota["scopes"].items():
                usage["label"] = scope_label(scope)
                usage["next_slot_text"] = _next_slot(usage, now)
            for rule in quota["rules"]:
                rule["label"] = scope_label(rule["channel"])
                rule["next_slot_text"] = _rule_next_slot(rule, now, quota["time_zone"])
            for send in sends:
                send["when"] = dt.datetime.fromtimestamp(send["at"], dt.UTC)
                send["ago"] = ago(now - send["at"])
    return render(
        request,
        site,
        "user_lookup.html",
        "Look up a user",
        form=form,
        quota=quota,
        user_zone=user_zone,
        quiet=quiet,
        sends=sends,
        timeline=timeline,
        said=said,
        problem=problem,
        can_reset=request.user.has_perm("limits.reset_quota"),
        can_export=request.user.has_perms(EXPORT_PERSONAL_DATA),
        can_erase=request.user.has_perms(ERASE_USERS),
        can_see_rules=request.user.has_perm("limits.view_rule"),
    )


def quota_reset(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    require(request, "limits.reset_quota")
    _known_id(user_id)
    lookup = _lookup_url(user_id)
    form = QuotaResetForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            quota_reset_service(
                user_id=user_id, reason=form.cleaned_data["reason"], user=request.user
            )
        except Unavailable as exc:
            messages.error(request, f"Nothing was reset: {exc}")
        else:
            messages.success(
                request, f"User {user_id}'s quota is reset in every channel (audit logged)."
            )
        return HttpResponseRedirect(lookup)
    try:
        quota = user_quota(user_id)
    except Unavailable as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(lookup)
    return render(
        request,
        site,
        "quota_reset_confirm.html",
        f"Reset the quota of user {user_id}",
        user_id=user_id,
        quota=quota,
        form=form,
        lookup=lookup,
    )


def _known_id(user_id: int) -> None:
    if user_id > max_user_id():
        raise Http404(f"No user id above {max_user_id():,}.")


def _lookup_url(user_id: int) -> str:
    return f"{reverse('admin:user_lookup')}?user_id={user_id}"


def person_download(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    """Everything held about the person, as GET /api/v1/users/<id>/export/ answers it, as a
    file to hand them."""
    require(request, *EXPORT_PERSONAL_DATA)
    _known_id(user_id)
    try:
        document = person_export(user_id)
    except Unavailable as exc:
        messages.error(request, f"No export: {exc}")
        return HttpResponseRedirect(_lookup_url(user_id))
    response = JsonResponse(document, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="user-{user_id}.json"'
    return response


def person_erase(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    """Erase the person everywhere, once confirmed (limits/ledger/erasure.py)."""
    require(request, *ERASE_USERS)
    _known_id(user_id)
    if request.method == "POST":
        erasure = erasure_start(user_ids=[user_id], via="admin", by=request.user)
        messages.success(
            request,
            f"Erasure {erasure.pk} started: the person is refused on every channel within "
            "seconds, and their data goes from every place within a minute.",
        )
        return HttpResponseRedirect(reverse("admin:limits_erasure_change", args=[erasure.pk]))
    return render(
        request,
        site,
        "person_erase_confirm.html",
        f"Erase user {user_id} everywhere",
        user_id=user_id,
        places=[place for place in places() if place.erase is not None],
        lookup=_lookup_url(user_id),
    )
