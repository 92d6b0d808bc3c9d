"""The gate's console pages: the dashboard (with the sends waiting, by hour of release, and the
refused sends of the last 30 days from the ledger, with their CSV download), a
user's lookup (zone and local time, quiet hours per channel, classic caps, every rule's figures,
recent sends, the timeline of decisions from the ledger) and the audited quota reset, and the what-if of a draft change of caps for one
more send of a campaign, tags and priority."""

import contextlib
import datetime as dt
import time
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import ValidationError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse

from gatekeeper.lib.console import ConsoleLink, ago, page, render, require
from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import WholeNumberField
from gatekeeper.lib.permissions import VIEW_REPORTS
from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.channels import channels, scope_label, scopes
from limits.history import position_from_text, user_history
from limits.ledger import ledger_enabled
from limits.models import Cap
from limits.policy import ADMITTED, DEFAULT_PRIORITY, PRIORITIES, REFUSED
from limits.reports import (
    DEFAULT_DAYS,
    GROUPS,
    day_series,
    decisions_csv,
    decisions_query,
    decisions_report,
    report_columns,
    report_days,
    report_filename,
)
from limits.rules import TAGS_MAX, tags_problem
from limits.services import cap_from_text, cap_text
from segments.index import get_index, index_status
from segments.models import Segment
from segments.selectors import snapshot_live_version
from segments.store import StoreError
from worker import stats as decision_stats
from worker.models import CAMPAIGN_MAX
from worker.processes import processes_list
from worker.selectors import (
    WHAT_IF_LIMIT,
    Unavailable,
    dashboard_stats,
    draft_table,
    user_quiet_hours,
    user_quota,
    user_recent_sends,
    waiting_by_hour,
    what_if,
    what_if_file_audience,
    what_if_segment_audience,
)
from worker.services import quota_reset as quota_reset_service

# As many tags as a gate call may carry.

LINKS = [
    ConsoleLink(
        "Dashboard",
        "dashboard",
        "segments.view_segment",
        "Who got how much today, and who was refused.",
    ),
    ConsoleLink(
        "Look up a user",
        "user_lookup",
        "limits.view_cap",
        "A user's segment, quota and recent sends.",
    ),
    ConsoleLink(
        "What if…",
        "what_if",
        "limits.view_cap",
        "Try a change of caps on an audience before making it.",
    ),
]


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "dashboard/", dashboard, "dashboard"),
        page(site, "dashboard/decisions.csv", decisions_csv_download, "decisions_csv"),
        page(site, "users/", user_lookup, "user_lookup"),
        page(site, "users/<int:user_id>/reset/", quota_reset, "quota_reset"),
        page(site, "what-if/", what_if_page, "what_if"),
    ]


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


class WhatIfAudienceForm(forms.Form):
    segment = forms.ModelChoiceField(
        queryset=Segment.objects.filter(is_default=False).order_by("priority"),
        required=False,
        empty_label="(upload a list instead)",
        help_text="Everyone in this segment in the live snapshot.",
    )
    user_list = forms.FileField(
        required=False, help_text="Or a user-list file: one id a line, text or .gz."
    )
    channel = forms.ChoiceField(required=False, help_text="Empty: every channel.")
    campaign = forms.CharField(
        required=False,
        max_length=CAMPAIGN_MAX,
        help_text="The send's campaign, for rules that count each campaign on its own.",
    )
    tags = forms.CharField(
        required=False,
        help_text=f"The send's tags, comma separated (up to {TAGS_MAX}), for rules that count "
        "a tag: promo, newsletter.",
    )
    priority = WholeNumberField(
        maximum=PRIORITIES[1],
        minimum=PRIORITIES[0],
        what="Priority",
        required=False,
        initial=DEFAULT_PRIORITY,
        help_text=f"0 to 9 ({DEFAULT_PRIORITY} unless a campaign says otherwise); only rules "
        "that keep slots for important sends look at it.",
        widget=forms.TextInput(attrs={"inputmode": "numeric", "size": 3}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        channel = self.fields["channel"]
        channel.choices = [("", "every channel"), *((c, c) for c in channels())]  # type: ignore[attr-defined]

    def clean_tags(self) -> tuple[str, ...]:
        typed = [t.strip() for t in self.cleaned_data.get("tags", "").split(",")]
        tags = tuple(dict.fromkeys(t for t in typed if t))  # typed twice is meant once
        problem = tags_problem(tags)
        if problem is not None:
            raise ValidationError(f"Tags: {problem[1]}")
        return tags

    def clean_priority(self) -> int:
        priority = self.cleaned_data.get("priority")
        return DEFAULT_PRIORITY if priority is None else priority

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if bool(data.get("segment")) == bool(data.get("user_list")):
            raise ValidationError("Choose a segment or upload a list (one of the two).")
        return data


# --- dashboard -------------------------------------------------------------------------------

WAITING_HOURS = 48  # the dashboard's view ahead of the sends waiting for release
# The campaigns with the most refused sends get a colour each on the chart, the others one
# together ("other campaigns"): the palette's 8 colours, the last grey.
REFUSED_CAMPAIGNS_SHOWN = 7
NO_CAMPAIGN = "(no campaign)"


def refused_history() -> dict[str, Any] | None:
    """The refused sends of the last DEFAULT_DAYS UTC days (the decisions report's default
    range), per day, by reason and by campaign, from the ledger's counts; None when there were
    none. One query: grouped by day, campaign and reason, both charts are sums of it."""
    query = decisions_query({"reason": REFUSED, "group_by": ["day,campaign,reason"]})
    rows = decisions_report(query=query)
    days = report_days(query)
    by_reason = day_series(rows, days=days, by="reason")
    if not by_reason.total:
        return None
    by_campaign = day_series(rows, days=days, by="campaign", top=REFUSED_CAMPAIGNS_SHOWN)
    campaigns = [
        {"label": key or NO_CAMPAIGN, "values": values} for key, values in by_campaign.series
    ]
    if by_campaign.others is not None:
        campaigns.append({"label": "other campaigns", "values": by_campaign.others})
    return {
        "days": [day.isoformat() for day in days],
        "from": query.start.isoformat(),
        "to": query.end.isoformat(),
        "total": by_reason.total,
        "reasons": [{"label": key, "values": values} for key, values in by_reason.series],
        "campaigns": campaigns,
    }


def dashboard(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, *VIEW_REPORTS)  # the dashboard: its charts and the report's download
    index = get_index()
    problems: list[str] = []
    try:
        live = snapshot_live_version()
    except StoreError as exc:
        live, problems = None, [*problems, f"The snapshot store is not answering: {exc}"]
    try:
        decision_stats.flush()  # this process's own counts, written at most 1 s late
        stats = dashboard_stats(days=14)
        processes = processes_list()
    except Exception as exc:  # Redis down: show the page with what is known
        stats, processes = None, []
        problems.append(f"Redis is not answering, so no counts can be shown: {exc}")
    now = time.time()
    for entry in processes:
        entry["seen_ago"] = ago(now - entry["seen_at"])
        entry["up_for"] = ago(now - entry["started_at"])
        entry["behind"] = bool(live and entry.get("version") != live)
    sizes = []
    if index is not None:
        names = dict(Segment.objects.values_list("slug", "name"))
        total = index.total_users or 1
        sizes = [
            {
                "slug": slug,
                "name": names.get(slug, slug),
                "users": index.cardinalities.get(slug, 0),
                "share": 100 * index.cardinalities.get(slug, 0) / total,
            }
            for slug in index.segments
        ]
    waiting = waiting_by_hour(hours=WAITING_HOURS)
    refused = refused_history()
    chart_data = {
        "sizes": {"labels": [s["name"] for s in sizes], "values": [s["users"] for s in sizes]},
        "today": stats["today_by_segment"] if stats else None,
        "history": stats["history"] if stats else None,
        "waiting": {
            "labels": [f"{row['hour']:%a %H:00}" for row in waiting["hours"]],
            "values": [row["sends"] for row in waiting["hours"]],
        }
        if waiting["total"]
        else None,
        "refused": refused,
    }
    return render(
        request,
        site,
        "dashboard.html",
        "Dashboard",
        live_version=live,
        loaded=index_status(),
        processes=processes,
        stats=stats,
        sizes=sizes,
        waiting=waiting,
        waiting_hours=WAITING_HOURS,
        refused=refused,
        refused_days=DEFAULT_DAYS,
        refused_csv=urlencode(
            {"group_by": ",".join(GROUPS), "reason": REFUSED}, doseq=True, safe=","
        ),
        chart_data=chart_data,
        problems=problems,
    )


def decisions_csv_download(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    """The decisions report as CSV, as `GET /api/v1/reports/decisions/?format=csv` has it (the
    same query string, the same rows), with the dashboard's right."""
    require(request, *VIEW_REPORTS)
    try:
        query = decisions_query(dict(request.GET.lists()))
    except ValidationError as exc:
        problems = "\n".join(f"{field}: {' '.join(m)}" for field, m in exc.message_dict.items())
        return HttpResponseBadRequest(problems, content_type="text/plain; charset=utf-8")
    rows = decisions_report(query=query)
    response = HttpResponse(
        decisions_csv(rows, columns=report_columns(query)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{report_filename(query)}"'
    return response


# --- users -----------------------------------------------------------------------------------


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
    here = f"{reverse('admin:user_lookup')}?user_id={user_id}"
    return {
        "user_id": user_id,
        "decisions": page.decisions,
        "older": f"{here}&before={page.next.text()}#timeline" if page.next else None,
        "newest": f"{here}#timeline" if position is not None else None,
        "problem": problem,
        "ledger_on": ledger_enabled(),
        "page_size": TIMELINE_PAGE,
    }


def user_lookup(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, "limits.view_cap")
    form = UserLookupForm(request.GET or None)
    quota, sends, problem, user_zone = None, [], "", {}
    quiet: list[dict[str, Any]] = []
    timeline = None
    if form.is_valid():
        user_id = form.cleaned_data["user_id"]
        timeline = _timeline(user_id, request.GET.get("before"), time.time())
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
        problem=problem,
        can_reset=request.user.has_perm("limits.reset_quota"),
        can_see_rules=request.user.has_perm("limits.view_rule"),
    )


def quota_reset(request: HttpRequest, *, site: AdminSite, user_id: int) -> HttpResponse:
    require(request, "limits.reset_quota")
    if user_id > max_user_id():
        raise Http404(f"No user id above {max_user_id():,}.")
    lookup = f"{reverse('admin:user_lookup')}?user_id={user_id}"
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


# --- what-if ---------------------------------------------------------------------------------


def _send_words(data: dict[str, Any]) -> str:
    """The send a what-if tries: "of campaign 'spring', tagged promo, at priority 5"."""
    words = [f"of campaign '{data['campaign']}'"] if data["campaign"] else ["of no campaign"]
    if data["tags"]:
        words.append(f"tagged {', '.join(data['tags'])}")
    words.append(f"at priority {data['priority']}")
    return ", ".join(words)


def what_if_page(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, "limits.view_cap")
    segments = list(Segment.objects.order_by("priority"))
    current = {(c.segment_id, c.channel): c for c in Cap.objects.all()}
    posted = request.method == "POST"
    form = WhatIfAudienceForm(request.POST if posted else None, request.FILES if posted else None)
    draft: dict[tuple[str, str], tuple[int | None, int | None]] = {}
    grid = []
    errors: list[str] = []
    for segment in segments:
        cells = []
        for scope in scopes():
            names = (f"{segment.slug}|{scope}|daily", f"{segment.slug}|{scope}|weekly")
            stored = cap_text(current.get((segment.pk, scope)))
            now_values = (stored["daily"], stored["weekly"])
            shown = (
                tuple(request.POST.get(n, v).strip() for n, v in zip(names, now_values, strict=True))
                if posted
                else now_values
            )  # fmt: skip
            try:
                limits = (
                    cap_from_text(shown[0], f"{segment.name} {scope} daily"),
                    cap_from_text(shown[1], f"{segment.name} {scope} weekly"),
                )
                if shown != now_values:
                    draft[(segment.slug, scope)] = limits
            except ValidationError as exc:
                errors.extend(exc.messages)
            cells.append(
                {"scope": scope, "names": names, "values": shown, "changed": shown != now_values}
            )
        grid.append({"segment": segment, "cells": cells})
    result, problem, send_words = None, "", ""
    if posted and form.is_valid() and not errors:
        data = form.cleaned_data
        channel = data.get("channel") or None
        try:
            if data.get("segment"):
                ids, size = what_if_segment_audience(data["segment"].slug)
            else:
                ids, size = what_if_file_audience(data["user_list"], data["user_list"].name), 0
            result = what_if(
                ids=ids,
                draft=draft_table(draft),
                only_channels=[channel] if channel else None,
                audience_size=size or None,
                campaign=data["campaign"],
                tags=data["tags"],
                priority=data["priority"],
            )
        except Unavailable as exc:
            problem = str(exc)
        if result is not None:
            send_words = _send_words(data)
            segment_names = {s.slug: s.name for s in segments}
            for line in result["rows"]:
                line["name"] = segment_names.get(line["segment"], line["segment"])
                line["difference"] = line["refused_draft"] - line["refused_now"]
    return render(
        request,
        site,
        "what_if.html",
        "What if…",
        form=form,
        grid=grid,
        scopes=scopes(),
        errors=errors,
        draft=draft,
        result=result,
        send_words=send_words,
        problem=problem,
        limit=WHAT_IF_LIMIT,
    )
