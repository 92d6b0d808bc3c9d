"""The admin site marketers work in: Django's admin plus the pages that are not one model.

- Dashboard: live snapshot, which processes run which version, today's and 14 days' decisions
  by segment, channel and reason (Chart.js, vendored), segment sizes.
- Cap grid: one form per segment (channels and `all` x daily / weekly) with plain-language
  readings, saved through `cap_set` so every change lands in the history.
- Snapshots: published versions, "Build and publish", a confirmed "make live" (rollback).
- Build progress: a JSON endpoint the build page polls for its progress bar.
- User lookup: segment, quotas, recent sends; an audited, confirmed quota reset.
- What-if: a draft change of caps against an audience, as dry runs on today's Redis state.

Every page checks a Django permission (see gatekeeper/lib/groups.py), so a staff user without a
group sees none of them.
"""

import datetime as dt
import time
from typing import Any

import numpy as np
from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import INT32_MAX, NotAWholeNumber, WholeNumberField, whole_number
from limits.channels import ALL, channels, scopes
from limits.limiter import Limits
from limits.models import Cap, CapChange
from limits.services import cap_describe, cap_set, cap_warnings
from segments.index import get_index, index_status
from segments.models import Build, Segment
from segments.parsing import UserListError, iter_ids
from segments.publishing import BuildBusy, BuildInProgress, snapshot_rollback
from segments.selectors import snapshot_live_version, snapshot_versions
from segments.services import build_start
from segments.store import StoreError

WHAT_IF_MAX_BYTES = 100 * 2**20  # an uploaded what-if audience, compressed or not
WHAT_IF_MAX_IDS = 5_000_000


def _require(request: HttpRequest, *perms: str) -> None:
    if not request.user.has_perms(perms):
        raise PermissionDenied


def parse_limit(raw: str | None, label: str) -> int | None:
    """A cap field: empty means no cap; otherwise a whole number from 0 to 2^31-1."""
    text = (raw or "").strip()
    if not text:
        return None
    try:
        return whole_number(text, maximum=INT32_MAX, what=label)
    except NotAWholeNumber as exc:
        raise ValidationError(str(exc)) from None


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} days {seconds % 86400 // 3600} h"


def _cap_fields(cap: Cap | None) -> tuple[str, str]:
    """A cap's daily and weekly limits as form values ("" for no cap)."""
    if cap is None:
        return "", ""
    return ("" if cap.daily is None else str(cap.daily)), (
        "" if cap.weekly is None else str(cap.weekly)
    )


def _scope_label(scope: str) -> str:
    return "all channels together" if scope == ALL else scope


def _segments_text(entry: dict[str, Any]) -> str:
    return ", ".join(
        f"{slug}: {count:,}" for slug, count in entry["segments"].items() if count is not None
    )


def _next_slot(usage: dict[str, Any], now: float) -> str:
    """When this scope lets one more send through, in words."""
    if 0 in (usage["daily"]["limit"], usage["weekly"]["limit"]):
        return "never: the cap is 0"
    wait = usage["next_slot_in"]
    if wait is None or wait <= 0:
        return "a slot is free now"
    at = dt.datetime.fromtimestamp(now + wait, dt.UTC)
    return f"in {_ago(wait)} ({at:%Y-%m-%d %H:%M} UTC)"


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        channel = self.fields["channel"]
        channel.choices = [("", "every channel"), *((c, c) for c in channels())]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if bool(data.get("segment")) == bool(data.get("user_list")):
            raise ValidationError("Choose a segment or upload a list (one of the two).")
        return data


class GatekeeperAdminSite(admin.AdminSite):
    site_header = "Gatekeeper"
    site_title = "Gatekeeper"
    index_title = "Caps, segments and sends"
    index_template = "admin/gatekeeper/index.html"

    def get_urls(self) -> list[Any]:
        view = self.admin_view
        return [
            path("dashboard/", view(self.dashboard), name="dashboard"),
            path("users/", view(self.user_lookup), name="user_lookup"),
            path("users/<int:user_id>/reset/", view(self.quota_reset), name="quota_reset"),
            path("what-if/", view(self.what_if), name="what_if"),
            path("snapshots/", view(self.snapshots), name="snapshots"),
            path("snapshots/build/", view(self.snapshot_build), name="snapshot_build"),
            path(
                "snapshots/<str:version>/make-live/",
                view(self.snapshot_make_live),
                name="snapshot_make_live",
            ),
            path(
                "segments/build/<int:build_id>/progress/",
                view(self.build_progress),
                name="build_progress",
            ),
            path("segments/segment/<int:segment_id>/caps/", view(self.cap_grid), name="cap_grid"),
            *super().get_urls(),
        ]

    def console_links(self, request: HttpRequest) -> list[dict[str, str]]:
        user = request.user
        links = [
            ("Dashboard", "dashboard", "segments.view_segment", "Who got how much today, and who was refused."),
            ("Look up a user", "user_lookup", "limits.view_cap", "A user's segment, quota and recent sends."),
            ("What if…", "what_if", "limits.view_cap", "Try a change of caps on an audience before making it."),
            ("Snapshots", "snapshots", "segments.view_build", "Build and publish; the versions, and which is live."),
        ]  # fmt: skip
        return [
            {"title": title, "url": reverse(f"admin:{name}"), "help": help_text}
            for title, name, perm, help_text in links
            if user.has_perm(perm)
        ]

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**(extra_context or {}), "console": self.console_links(request)}
        return super().index(request, context)

    def _render(
        self, request: HttpRequest, template: str, title: str, **context: Any
    ) -> TemplateResponse:
        return TemplateResponse(
            request,
            f"admin/gatekeeper/{template}",
            {**self.each_context(request), "title": title, **context},
        )

    # --- dashboard -------------------------------------------------------------------------

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        _require(request, "segments.view_segment")
        from worker import stats as decision_stats
        from worker.processes import processes_list
        from worker.selectors import dashboard_stats

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
            entry["seen_ago"] = _ago(now - entry["seen_at"])
            entry["up_for"] = _ago(now - entry["started_at"])
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
        chart_data = {
            "sizes": {"labels": [s["name"] for s in sizes], "values": [s["users"] for s in sizes]},
            "today": stats["today_by_segment"] if stats else None,
            "history": stats["history"] if stats else None,
        }
        return self._render(
            request,
            "dashboard.html",
            "Dashboard",
            live_version=live,
            loaded=index_status(),
            processes=processes,
            stats=stats,
            sizes=sizes,
            chart_data=chart_data,
            problems=problems,
        )

    # --- caps ------------------------------------------------------------------------------

    def cap_grid(self, request: HttpRequest, segment_id: int) -> HttpResponse:
        _require(request, "limits.view_cap")
        segment = get_object_or_404(Segment, pk=segment_id)
        current = {cap.channel: cap for cap in Cap.objects.filter(segment=segment)}
        can_edit = request.user.has_perm("limits.change_cap") and request.user.has_perm(
            "limits.add_cap"
        )
        values: dict[str, dict[str, str]] = {
            scope: dict(zip(("daily", "weekly"), _cap_fields(current.get(scope)), strict=True))
            for scope in scopes()
        }
        errors: dict[str, list[str]] = {}
        # The values the form is based on: kept in hidden fields, so a save can tell which
        # cells this user changed. After a failed save they stay what the user first saw.
        shown = {scope: dict(v) for scope, v in values.items()}
        if request.method == "POST":
            if not can_edit:
                raise PermissionDenied
            for scope in scopes():
                for field in ("daily", "weekly"):
                    if f"{scope}-{field}-was" in request.POST:
                        shown[scope][field] = request.POST[f"{scope}-{field}-was"].strip()
            stored = {scope: dict(v) for scope, v in values.items()}
            parsed: dict[str, tuple[int | None, int | None]] = {}
            for scope in scopes():
                if f"{scope}-daily" not in request.POST and f"{scope}-weekly" not in request.POST:
                    continue  # not on the form that was sent (a channel added since): unchanged
                raw_daily = request.POST.get(f"{scope}-daily", "")
                raw_weekly = request.POST.get(f"{scope}-weekly", "")
                values[scope] = {"daily": raw_daily.strip(), "weekly": raw_weekly.strip()}
                # What the form showed when it was loaded; a cell the user left alone is not
                # written, and one changed meanwhile by someone else is a conflict.
                seen = {
                    "daily": request.POST.get(f"{scope}-daily-was", stored[scope]["daily"]).strip(),
                    "weekly": request.POST.get(f"{scope}-weekly-was", stored[scope]["weekly"]).strip(),
                }  # fmt: skip
                try:
                    daily = parse_limit(raw_daily, f"{scope} daily")
                    weekly = parse_limit(raw_weekly, f"{scope} weekly")
                except ValidationError as exc:
                    errors.setdefault(scope, []).extend(exc.messages)
                    continue
                if values[scope] == seen:
                    continue
                if stored[scope] != seen:
                    now_reads = cap_describe(
                        channel=scope,
                        daily=parse_limit(stored[scope]["daily"], scope),
                        weekly=parse_limit(stored[scope]["weekly"], scope),
                    )
                    errors.setdefault(scope, []).append(
                        f"{scope} was changed by someone else while you edited: it is now "
                        f"'{now_reads}'. Check it and save again."
                    )
                    values[scope] = dict(stored[scope])
                    shown[scope] = dict(stored[scope])  # the next save starts from it
                    continue
                parsed[scope] = (daily, weekly)
            if not errors:
                changed = []
                with transaction.atomic():
                    for scope, (daily, weekly) in parsed.items():
                        cap_set(
                            segment=segment,
                            channel=scope,
                            daily=daily,
                            weekly=weekly,
                            user=request.user,
                            via="admin",
                        )
                        changed.append(
                            f"{scope}: {cap_describe(channel=scope, daily=daily, weekly=weekly)}"
                        )
                if changed:
                    messages.success(
                        request,
                        f"Saved caps of {segment.name}. " + "; ".join(changed) + ". Running "
                        "workers apply them within seconds.",
                    )
                else:
                    messages.info(request, "Nothing changed.")
                return HttpResponseRedirect(request.path)
            messages.error(request, "Nothing was saved: fix the values marked below.")
        rows = []
        for scope in scopes():
            try:
                daily = parse_limit(values[scope]["daily"], "daily")
                weekly = parse_limit(values[scope]["weekly"], "weekly")
                reading = cap_describe(channel=scope, daily=daily, weekly=weekly)
                warnings = cap_warnings(daily=daily, weekly=weekly)
            except ValidationError:
                reading, warnings = "", []
            rows.append(
                {
                    "scope": scope,
                    "label": _scope_label(scope),
                    "daily": values[scope]["daily"],
                    "weekly": values[scope]["weekly"],
                    "daily_was": shown[scope]["daily"],
                    "weekly_was": shown[scope]["weekly"],
                    "reading": reading,
                    "warnings": warnings,
                    "errors": errors.get(scope, []),
                }
            )
        history = CapChange.objects.filter(segment_slug=segment.slug).select_related("changed_by")[
            :25
        ]
        return self._render(
            request,
            "cap_grid.html",
            f"Caps of {segment.name}",
            segment=segment,
            rows=rows,
            can_edit=can_edit,
            history=history,
            segments=Segment.objects.order_by("priority"),
        )

    # --- snapshots and builds --------------------------------------------------------------

    def snapshots(self, request: HttpRequest) -> HttpResponse:
        _require(request, "segments.view_build")
        try:
            versions = snapshot_versions()
            problem = ""
        except StoreError as exc:
            versions, problem = [], f"The snapshot store is not answering: {exc}"
        builds = {b.version: b for b in Build.objects.exclude(version="")}
        for entry in versions:
            entry["build"] = builds.get(entry["version"])
            entry["segments_text"] = _segments_text(entry)
        return self._render(
            request,
            "snapshots.html",
            "Snapshots",
            versions=versions,
            problem=problem,
            running=Build.objects.filter(
                status__in=[Build.Status.QUEUED, Build.Status.RUNNING]
            ).first(),
            can_publish=request.user.has_perm("segments.publish_snapshot"),
            loaded=index_status(),
        )

    def snapshot_build(self, request: HttpRequest) -> HttpResponse:
        _require(request, "segments.publish_snapshot")
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:snapshots"))
        try:
            build = build_start(user=request.user)
        except BuildInProgress as exc:
            messages.warning(request, str(exc))
            return HttpResponseRedirect(reverse("admin:snapshots"))
        messages.success(request, f"Build #{build.pk} started.")
        return HttpResponseRedirect(reverse("admin:segments_build_change", args=[build.pk]))

    def snapshot_make_live(self, request: HttpRequest, version: str) -> HttpResponse:
        _require(request, "segments.publish_snapshot")
        try:
            versions = {v["version"]: v for v in snapshot_versions()}
        except StoreError as exc:
            messages.error(request, f"The snapshot store is not answering: {exc}")
            return HttpResponseRedirect(reverse("admin:snapshots"))
        entry = versions.get(version)
        if entry is None:
            messages.error(request, f"There is no snapshot version '{version}'.")
            return HttpResponseRedirect(reverse("admin:snapshots"))
        live = next((v for v in versions.values() if v["is_live"]), None)
        entry["segments_text"] = _segments_text(entry)
        if request.method == "POST":
            try:
                snapshot_rollback(version=version)
            except (BuildInProgress, BuildBusy) as exc:
                messages.warning(request, f"{version} was not made live: {exc}")
            except Exception as exc:
                messages.error(request, f"{version} was not made live: {exc}")
            else:
                messages.success(
                    request,
                    f"{version} is live. Every process switches to it at its next poll "
                    "(within seconds); the dashboard shows which have.",
                )
            return HttpResponseRedirect(reverse("admin:snapshots"))
        running = Build.objects.filter(
            status__in=[Build.Status.QUEUED, Build.Status.RUNNING]
        ).first()
        return self._render(
            request,
            "snapshot_confirm.html",
            "Make a snapshot live",
            entry=entry,
            live=live,
            running=running,
        )

    def build_progress(self, request: HttpRequest, build_id: int) -> JsonResponse:
        _require(request, "segments.view_build")
        build = get_object_or_404(Build, pk=build_id)
        return JsonResponse(
            {
                "id": build.pk,
                "status": build.status,
                "progress": build.progress,
                "stage": build.stage,
                "version": build.version,
                "error": build.error,
                "done": build.status in (Build.Status.SUCCEEDED, Build.Status.FAILED),
            }
        )

    # --- users -----------------------------------------------------------------------------

    def user_lookup(self, request: HttpRequest) -> HttpResponse:
        _require(request, "limits.view_cap")
        from worker.selectors import Unavailable, user_quota, user_recent_sends

        form = UserLookupForm(request.GET or None)
        quota, sends, problem = None, [], ""
        if form.is_valid():
            user_id = form.cleaned_data["user_id"]
            try:
                quota = user_quota(user_id)
                sends = user_recent_sends(user_id)
            except Unavailable as exc:
                problem = str(exc)
            else:
                now = time.time()
                for scope, usage in quota["scopes"].items():
                    usage["label"] = _scope_label(scope)
                    usage["next_slot_text"] = _next_slot(usage, now)
                for send in sends:
                    send["when"] = dt.datetime.fromtimestamp(send["at"], dt.UTC)
                    send["ago"] = _ago(now - send["at"])
        return self._render(
            request,
            "user_lookup.html",
            "Look up a user",
            form=form,
            quota=quota,
            sends=sends,
            problem=problem,
            can_reset=request.user.has_perm("limits.reset_quota"),
        )

    def quota_reset(self, request: HttpRequest, user_id: int) -> HttpResponse:
        _require(request, "limits.reset_quota")
        from worker.selectors import Unavailable, user_quota
        from worker.services import quota_reset

        if user_id > max_user_id():
            raise Http404(f"No user id above {max_user_id():,}.")
        lookup = f"{reverse('admin:user_lookup')}?user_id={user_id}"
        form = QuotaResetForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                quota_reset(user_id=user_id, reason=form.cleaned_data["reason"], user=request.user)
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
        return self._render(
            request,
            "quota_reset_confirm.html",
            f"Reset the quota of user {user_id}",
            user_id=user_id,
            quota=quota,
            form=form,
            lookup=lookup,
        )

    # --- what-if ---------------------------------------------------------------------------

    def what_if(self, request: HttpRequest) -> HttpResponse:
        _require(request, "limits.view_cap")
        from worker.selectors import WHAT_IF_LIMIT, Unavailable, draft_table, what_if

        segments = list(Segment.objects.order_by("priority"))
        current = {(c.segment_id, c.channel): c for c in Cap.objects.all()}
        posted = request.method == "POST"
        form = WhatIfAudienceForm(
            request.POST if posted else None, request.FILES if posted else None
        )
        draft: dict[tuple[str, str], Limits] = {}
        grid = []
        errors: list[str] = []
        for segment in segments:
            cells = []
            for scope in scopes():
                cap = current.get((segment.pk, scope))
                names = (f"{segment.slug}|{scope}|daily", f"{segment.slug}|{scope}|weekly")
                now_values = _cap_fields(cap)
                shown = (
                    tuple(request.POST.get(n, v).strip() for n, v in zip(names, now_values, strict=True))
                    if request.method == "POST"
                    else now_values
                )  # fmt: skip
                try:
                    limits = Limits(
                        daily=parse_limit(shown[0], f"{segment.name} {scope} daily"),
                        weekly=parse_limit(shown[1], f"{segment.name} {scope} weekly"),
                    )
                    if shown != now_values:
                        draft[(segment.slug, scope)] = limits
                except ValidationError as exc:
                    errors.extend(exc.messages)
                cells.append(
                    {
                        "scope": scope,
                        "names": names,
                        "values": shown,
                        "changed": shown != now_values,
                    }
                )
            grid.append({"segment": segment, "cells": cells})
        result, problem = None, ""
        if request.method == "POST" and form.is_valid() and not errors:
            ids, size, problem = self._audience(form.cleaned_data)
            if ids is not None:
                channel = form.cleaned_data.get("channel") or None
                try:
                    result = what_if(
                        ids=ids,
                        draft=draft_table(draft),
                        only_channels=[channel] if channel else None,
                        audience_size=size or None,
                    )
                except Unavailable as exc:
                    problem = str(exc)
                if result is not None:
                    segment_names = {s.slug: s.name for s in segments}
                    for line in result["rows"]:
                        line["name"] = segment_names.get(line["segment"], line["segment"])
                        line["difference"] = line["refused_draft"] - line["refused_now"]
        return self._render(
            request,
            "what_if.html",
            "What if…",
            form=form,
            grid=grid,
            scopes=scopes(),
            errors=errors,
            draft=draft,
            result=result,
            problem=problem,
            limit=WHAT_IF_LIMIT,
        )

    def _audience(self, data: dict[str, Any]) -> tuple[Any, int, str]:
        """(ids to evaluate, audience size, problem). A segment larger than WHAT_IF_LIMIT is
        sampled by position in its bitmap, so a huge segment is never copied out whole."""
        from worker.selectors import WHAT_IF_LIMIT

        if data.get("segment"):
            index = get_index()
            if index is None:
                return None, 0, "No segment snapshot is loaded, so no segment can be listed."
            bitmap = index.bitmaps.get(data["segment"].slug)
            if bitmap is None:
                return None, 0, f"{data['segment'].name} is not in the live snapshot (build first)."
            size = len(bitmap)
            if size <= WHAT_IF_LIMIT:
                return np.asarray(bitmap.to_array(), dtype=np.uint64), size, ""
            positions = np.sort(np.random.default_rng().choice(size, WHAT_IF_LIMIT, replace=False))
            return np.array([bitmap[int(i)] for i in positions], dtype=np.uint64), size, ""
        upload = data["user_list"]
        if upload.size > WHAT_IF_MAX_BYTES:
            return (
                None,
                0,
                (
                    f"{upload.name}: {upload.size:,} bytes; a what-if list is at most "
                    f"{WHAT_IF_MAX_BYTES:,} bytes. Choose a segment for a larger audience."
                ),
            )
        parts, count = [], 0
        try:
            width = index.id_width if (index := get_index()) else 32
            for part in iter_ids(upload, width=width):
                count += int(part.size)
                if count > WHAT_IF_MAX_IDS:
                    return (
                        None,
                        0,
                        (
                            f"{upload.name}: more than {WHAT_IF_MAX_IDS:,} ids; choose a segment "
                            "for a larger audience."
                        ),
                    )
                parts.append(part)
        except UserListError as exc:
            return None, 0, f"{upload.name}: {exc.messages[0]}"
        if not parts:
            return None, 0, f"{upload.name} holds no user ids."
        ids = np.concatenate(parts)
        return ids, 0, ""
