"""The gate's console pages: the dashboard (with the sends waiting, by hour of release, the
refused sends of the last 30 days from the ledger, with their CSV download, and the topics
people switched off and back on) and the what-if of a draft change of caps for one more send of
a campaign, tags and priority, with what people's own preferences would block."""

import time
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.admin import AdminSite
from django.core.exceptions import ValidationError
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
)
from django.urls import URLPattern

from gatekeeper.lib.console import ConsoleLink, ago, page, render, require
from gatekeeper.lib.instants import INSTANT_FORMAT, InstantField
from gatekeeper.lib.integers import WholeNumberField
from gatekeeper.lib.permissions import VIEW_REPORTS, VIEW_SEND_JOBS
from limits.channels import channels, scopes
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES
from limits.ledger.reports import (
    DEFAULT_DAYS,
    GROUPS,
    decisions_csv,
    decisions_query,
    decisions_report,
    refused_history,
    report_columns,
    report_filename,
)
from limits.models.policy import Cap, Topic
from limits.people.preference_switches import topic_switches
from limits.policy.quota import Unavailable
from limits.policy.rules import TAGS_MAX, tags_problem
from limits.policy.selectors import topics_read
from limits.policy.services import cap_from_text, cap_text
from limits.reasons import COLOURS, REFUSED, Reason
from segments.index import get_index, index_status
from segments.models import Segment
from segments.selectors import snapshot_live_version
from segments.store import StoreError
from worker import admin_backtests
from worker import stats as decision_stats
from worker.models import JOB_CAMPAIGN_MAX, SendJob
from worker.plan import plan_later_counted, plan_what_if, scheduled_jobs
from worker.processes import processes_list
from worker.selectors import (
    WHAT_IF_LIMIT,
    dashboard_stats,
    draft_table,
    waiting_by_hour,
    what_if,
    what_if_file_audience,
    what_if_segment_audience,
)
from worker.services import plan_current

NO_TOPIC = "(no topic)"  # a send that names no topic, in the what-if's table

LINKS = [
    ConsoleLink(
        "Dashboard",
        "dashboard",
        "segments.view_segment",
        "Who got how much today, and who was refused.",
    ),
    ConsoleLink(
        "What if…",
        "what_if",
        "limits.view_cap",
        "Try a change of caps on an audience before making it.",
    ),
    ConsoleLink(
        "Backtests",
        "backtests",
        "worker.view_backtest",
        "Changes of rules, quiet hours and caps tried on the last 30 days of sends.",
    ),
    ConsoleLink(
        "The plan",
        "plan",
        "worker.view_sendjob",
        "The scheduled jobs ahead: what each will send, who loses a send to whom, and what if "
        "one moved.",
    ),
]


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "dashboard/", dashboard, "dashboard"),
        page(site, "dashboard/decisions.csv", decisions_csv_download, "decisions_csv"),
        page(site, "what-if/", what_if_page, "what_if"),
        page(site, "plan/", plan_page, "plan"),
        *admin_backtests.urls(site),
    ]


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
        max_length=JOB_CAMPAIGN_MAX,
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
    # What people said is read by those who may read their preferences (the user lookup's right).
    switches_shown = request.user.has_perm("limits.view_preference")
    switches = _switches() if switches_shown else None
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
        "switches": {
            "days": [day.isoformat() for day in switches["days"]],
            "off": [{"label": t["name"], "values": t["off"]} for t in switches["topics"]],
            "on": [{"label": t["name"], "values": t["on"]} for t in switches["topics"]],
        }
        if switches
        else None,
        "palette": {str(reason): colour for reason, colour in COLOURS.items()},
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
        switches=switches,
        switches_shown=switches_shown,
        chart_data=chart_data,
        problems=problems,
    )


def _switches() -> dict[str, Any] | None:
    """The topics people switched off and back on over the refused chart's days, with the
    topics' names."""
    switches = topic_switches(topics=topics_read(), days=DEFAULT_DAYS)
    if switches is not None:
        names = dict(Topic.objects.values_list("slug", "name"))
        for line in (*switches["topics"], *switches["rows"]):
            line["name"] = names.get(line["slug"], line["slug"])
    return switches


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
            topic_names = dict(Topic.objects.values_list("slug", "name"))
            for line in result["preferences"]:
                slug = line["topic"]
                line["name"] = NO_TOPIC if slug is None else topic_names.get(slug, slug)
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


# --- the plan --------------------------------------------------------------------------------


class PlanMoveForm(forms.Form):
    """A what-if move of one scheduled job: nothing is saved."""

    job = forms.TypedChoiceField(coerce=int, choices=(), label="Job")
    start_at = InstantField(
        label="Starting at", help_text=f"{INSTANT_FORMAT}: where it would move."
    )

    def __init__(self, *args: Any, jobs: list[SendJob], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["job"].choices = [  # type: ignore[attr-defined]
            (job.pk, f"#{job.pk} {job.campaign} ({job.channel}, {job.start_at:%a %d %b %H:%M} UTC)")
            for job in jobs
        ]


def _bars(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's predicted decisions as a stacked bar's parts (sent, held, each refusal), with
    their share of its recipients."""
    total = max(1, job["recipients"])
    parts = [("sent", job["sent"], Reason.ALLOWED), ("held", job["held"], Reason.QUIET_HOURS)]
    parts += [(reason, n, Reason(reason)) for reason, n in sorted(job["refused"].items())]
    return [
        {"label": label, "count": n, "share": 100 * n / total, "colour": COLOURS.get(key, "#999")}
        for label, n, key in parts
        if n
    ]


def plan_page(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, *VIEW_SEND_JOBS)
    jobs = scheduled_jobs()
    current = plan_current(jobs)
    planned = current["jobs"]
    names = {job.pk: job for job in jobs}
    days: dict[str, list[dict[str, Any]]] = {}
    for job in planned:
        start = datetime.fromisoformat(job["start_at"])
        days.setdefault(f"{start:%A %d %B %Y}", []).append(
            {**job, "start": start, "bars": _bars(job), "known": job["job"] in names}
        )
    form = PlanMoveForm(request.POST or None, jobs=jobs)
    moved: dict[str, Any] | None = None
    problem = ""
    if request.method == "POST" and form.is_valid():
        try:
            moved = plan_what_if(form.cleaned_data["job"], form.cleaned_data["start_at"])
        except (ValueError, Unavailable) as exc:
            problem = str(exc)
    comparison = []
    if moved is not None:
        after = {job["job"]: job for job in moved["after"]}
        for job in moved["before"]:
            later = after[job["job"]]
            comparison.append(
                {
                    "job": job["job"],
                    "campaign": job["campaign"],
                    "start_before": datetime.fromisoformat(job["start_at"]),
                    "start_after": datetime.fromisoformat(later["start_at"]),
                    "sent_before": job["sent"],
                    "sent_after": later["sent"],
                    "difference": later["sent"] - job["sent"],
                }
            )
    with_later: list[dict[str, Any]] = []
    later_problem = ""
    if request.GET.get("later") == "counted":
        try:
            counted = {job["job"]: job for job in plan_later_counted()}
        except (ValueError, Unavailable) as exc:
            later_problem = str(exc)
        else:
            for job in planned:
                other = counted.get(job["job"])
                if other is not None:
                    with_later.append(
                        {
                            "job": job["job"],
                            "campaign": job["campaign"],
                            "priority": job["priority"],
                            "sent": job["sent"],
                            "sent_later_counted": other["sent"],
                            "difference": other["sent"] - job["sent"],
                            "taken_by": other["taken_by"],
                        }
                    )
    return render(
        request,
        site,
        "plan.html",
        "The plan",
        later=with_later,
        later_asked=request.GET.get("later") == "counted",
        later_problem=later_problem,
        current=current,
        made=(
            datetime.fromisoformat(current["computed_at"]) if current.get("computed_at") else None
        ),
        days=days,
        overlaps=current["overlaps"],
        losers=[job for job in planned if job["taken_by"]],
        form=form,
        comparison=comparison,
        problem=problem,
    )
