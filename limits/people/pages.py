"""A user's lookup in the console (zone and local time, quiet hours per
channel, classic caps, every rule's figures, recent sends, the timeline of decisions from the
ledger, their preferences) with the audited quota reset."""

import contextlib
import datetime as dt
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.urls import reverse
from django.utils import timezone

from gatekeeper.lib.console import ago, render, require
from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import WholeNumberField
from gatekeeper.lib.permissions import ERASE_USERS, EXPORT_PERSONAL_DATA
from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.channels import scope_label
from limits.ledger.history import position_from_text, user_history
from limits.ledger.stream import ledger_enabled
from limits.models.people import PreferenceChange
from limits.models.policy import Topic
from limits.people.preferences import preferences_read, preferences_words
from limits.policy.quota import Unavailable, user_quiet_hours, user_quota, user_recent_sends
from limits.policy.selectors import topics_read
from limits.policy.services import quota_reset as quota_reset_service
from limits.reasons import ADMITTED
from segments.models import Segment


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


def _next_slot(usage: dict[str, Any], now: dt.datetime) -> str:
    """When this scope lets one more send through, in words."""
    if 0 in (usage["daily"]["limit"], usage["weekly"]["limit"]):
        return "never: the cap is 0"
    wait = usage["next_slot_in"]
    if wait is None or wait <= 0:
        return "a slot is free now"
    return _wait_words(wait, now)


def _rule_next_slot(rule: dict[str, Any], now: dt.datetime, time_zone: str) -> str:
    """When a rule lets one more send through, in words (and in the user's own time)."""
    if rule["limit"] == 0:
        return "never: the limit is 0"
    wait = rule["next_slot_in"]
    if rule["remaining"] > 0 or wait is None or wait <= 0:
        return "a slot is free now"
    return _wait_words(wait, now, time_zone)


def _wait_words(wait: float, now: dt.datetime, time_zone: str | None = None) -> str:
    """ "in 3 h 10 min (2026-11-24 21:40 UTC)", with the user's own time when `time_zone`."""
    at = (now + dt.timedelta(seconds=wait)).astimezone(dt.UTC)
    local = ""
    if time_zone is not None:
        with contextlib.suppress(UnknownTimeZone):  # an unknown zone: UTC alone
            local = f", {at.astimezone(zone(time_zone)):%H:%M} their time"
    return f"in {ago(wait)} ({at:%Y-%m-%d %H:%M} UTC{local})"


def _user_zone(quota: dict[str, Any], now: dt.datetime) -> dict[str, str]:
    """The user's zone, where it comes from, and their local time now."""
    name = quota["time_zone"]
    own = Segment.objects.filter(slug=quota["segment"]).values_list("time_zone", flat=True).first()
    source = "their segment's" if own else "the default (GATEKEEPER_DEFAULT_TIME_ZONE)"
    try:
        local = now.astimezone(zone(name))
    except UnknownTimeZone:
        return {"name": name, "source": source, "local": "unknown: the zone is not known here"}
    return {"name": name, "source": source, "local": f"{local:%Y-%m-%d %H:%M} ({local:%Z})"}


def _at_words(instant: float, time_zone: str, now: dt.datetime) -> str:
    """An instant soon (epoch seconds, as the quota's quiet hours give it), in the user's own
    time and in UTC: "08:17 their time (06:17 UTC, in 7 h 17 min)"."""
    at = dt.datetime.fromtimestamp(instant, dt.UTC)
    try:
        local = f"{at.astimezone(zone(time_zone)):%Y-%m-%d %H:%M} their time"
    except UnknownTimeZone:
        local = "unknown zone"
    return f"{local} ({at:%H:%M} UTC, in {ago(instant - now.timestamp())})"


def _quiet_rows(user_id: int, quota: dict[str, Any], now: dt.datetime) -> list[dict[str, Any]]:
    """Per channel: the quiet hours that apply to the user and whether they hold now."""
    rows = user_quiet_hours(user_id, segment=quota["segment"], zone=quota["time_zone"], now=now)
    for row in rows:
        row["label"] = scope_label(row["channel"])
        if row["quiet_now"]:
            row["until_text"] = _at_words(row["until"], quota["time_zone"], now)
            row["release_text"] = _at_words(row["release"], quota["time_zone"], now)
    return rows


TIMELINE_PAGE = 50  # decisions from the ledger per page of a user's timeline


def _timeline(user_id: int, before: str | None, now: dt.datetime) -> dict[str, Any]:
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
        decision["ago"] = ago((now - decision["at"]).total_seconds())
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
        timeline = _timeline(user_id, request.GET.get("before"), timezone.now())
        if request.user.has_perm("limits.view_preference"):
            said = _preferences(user_id)
        try:
            quota = user_quota(user_id)
            sends = user_recent_sends(user_id)
        except Unavailable as exc:
            problem = str(exc)
        else:
            now = timezone.now()
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
                send["ago"] = ago(now.timestamp() - send["at"])
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
