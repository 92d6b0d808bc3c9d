"""The admin's backtests (docs/backtests.md): "Try this change on the last 30 days" on the rule,
quiet-hours and cap forms, the backtest's page (its progress, then a chart per day and the
table), "Save this change" there (the result kept with the change it is saved as), and the
list of recent ones."""

import json
from dataclasses import asdict
from datetime import UTC, timedelta
from typing import Any

import msgspec
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as ModelValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.console import page, render, require
from gatekeeper.lib.permissions import RUN_BACKTESTS, VIEW_BACKTESTS
from limits.channels import scopes
from limits.engine.quiet import quiet_json_describe
from limits.models.policy import Cap, QuietHours, Rule, SettingChange
from limits.policy.bodies import DraftBody
from limits.policy.drafts import draft_save
from limits.policy.rules import rule_fields_as_json, rule_json_describe
from limits.policy.services import cap_describe, cap_from_text, cap_text
from segments.models import Segment
from worker.backtest import policy_mark
from worker.models import Backtest
from worker.services import backtest_create

TRY_DAYS = 30  # "the last 30 days": the whole UTC days before today
ROWS_SHOWN = 200  # rows of the table on the page (the CSV has them all)


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "backtests/", backtests_page, "backtests"),
        page(site, "backtests/<int:backtest_id>/", backtest_page, "backtest"),
        page(site, "backtests/<int:backtest_id>/save/", backtest_save, "backtest_save"),
        page(site, "backtests/try/<str:kind>/", backtest_try, "backtest_try"),
    ]


def _changes_words(changes: dict[str, Any]) -> list[str]:
    """A draft's changes, each in words."""
    names = dict(Segment.objects.values_list("slug", "name"))
    words = []
    for rule in changes.get("rules", []):
        op = rule.get("op")
        if op == "delete":
            found = Rule.objects.filter(pk=rule["id"]).first()
            words.append(f"Delete the rule '{found.name if found else rule['id']}'.")
        elif op == "change":
            found = Rule.objects.filter(pk=rule["id"]).first()
            described = rule_json_describe(rule, names)
            words.append(f"Change the rule '{found.name if found else rule['id']}': {described}.")
        else:
            words.append(f"Add a rule: {rule_json_describe(rule, names)}.")
    for quiet in changes.get("quiet_hours", []):
        op = quiet.get("op")
        if op == "delete":
            words.append(f"Delete quiet hours {quiet['id']}.")
        else:
            verb = "Change quiet hours" if op == "change" else "Add quiet hours"
            words.append(f"{verb}: {quiet_json_describe(quiet, names)}.")
    for cap in changes.get("caps", []):
        reads = cap_describe(channel=cap["channel"], daily=cap["daily"], weekly=cap["weekly"])
        words.append(f"Caps of {names.get(cap['segment'], cap['segment'])}: {reads}.")
    return words


def _period() -> tuple[Any, Any]:
    today = timezone.now().astimezone(UTC).date()
    return today - timedelta(days=TRY_DAYS), today - timedelta(days=1)


def _posted_form(site: AdminSite, request: HttpRequest, model: Any, row: Any) -> Any:
    """The admin's own form of `model` (its change form's, fields and checks alike), bound to
    what was posted."""
    form_class = site.get_model_admin(model).get_form(request, row, change=row is not None)
    return form_class(request.POST, instance=row)


def _form_changes(
    site: AdminSite, request: HttpRequest, kind: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The draft the posted admin form makes (one change) and where it came from; a
    ValidationError naming the form's problems."""
    row_id = request.GET.get("id")
    if kind == "rule":
        rule = get_object_or_404(Rule, pk=row_id) if row_id else None
        form = _posted_form(site, request, Rule, rule)
        if not form.is_valid():
            raise ModelValidationError(form.errors.as_text())
        given = rule_fields_as_json(form.authored_fields())
        op = {"op": "change", "id": rule.pk, **given} if rule else {"op": "add", **given}
        label = rule.name if rule else given["name"]
        return {"rules": [op]}, {"kind": kind, "id": rule and rule.pk, "label": label}
    if kind == "quiet":
        entry = get_object_or_404(QuietHours, pk=row_id) if row_id else None
        form = _posted_form(site, request, QuietHours, entry)
        if not form.is_valid():
            raise ModelValidationError(form.errors.as_text())
        given = asdict(form.authored_fields())
        op = {"op": "change", "id": entry.pk, **given} if entry else {"op": "add", **given}
        label = f"quiet hours {entry.pk}" if entry else "new quiet hours"
        return {"quiet_hours": [op]}, {"kind": kind, "id": entry and entry.pk, "label": label}
    if kind == "caps":
        segment = get_object_or_404(Segment, pk=row_id)
        stored = {cap.channel: cap_text(cap) for cap in Cap.objects.filter(segment=segment)}
        caps = []
        for scope in scopes():
            if f"{scope}-daily" not in request.POST:
                continue
            cells = {f: request.POST.get(f"{scope}-{f}", "").strip() for f in ("daily", "weekly")}
            if cells == stored.get(scope, cap_text(None)):
                continue
            caps.append(
                {
                    "segment": segment.slug,
                    "channel": scope,
                    "daily": cap_from_text(cells["daily"], f"{scope} daily"),
                    "weekly": cap_from_text(cells["weekly"], f"{scope} weekly"),
                }
            )
        if not caps:
            raise ModelValidationError("No cap was changed: change one, then try it.")
        origin = {"kind": kind, "id": segment.pk, "label": f"caps of {segment.name}"}
        return {"caps": caps}, origin
    raise PermissionDenied


@require_POST
def backtest_try(request: HttpRequest, *, site: AdminSite, kind: str) -> HttpResponse:
    """A form's change tried on the last 30 days: a backtest made of it, and its page."""
    require(request, *RUN_BACKTESTS)
    try:
        changes, origin = _form_changes(site, request, kind)
        start, end = _period()
        backtest = backtest_create(
            start=start,
            end=end,
            changes=msgspec.convert(changes, DraftBody),
            user=request.user,
        )
    except (ModelValidationError, ValidationError, msgspec.ValidationError) as exc:
        problems = exc.messages if isinstance(exc, ModelValidationError) else [str(exc)]
        if isinstance(exc, ValidationError):
            problems = [f"{k}: {' '.join(map(str, v))}" for k, v in exc.detail.items()]  # type: ignore[union-attr]
        response = render(
            request,
            site,
            "backtest.html",
            "Try this change",
            problems=problems,
            back=request.META.get("HTTP_REFERER", reverse("admin:index")),
        )
        response.status_code = 400
        return response
    Backtest.objects.filter(pk=backtest.pk).update(origin=origin)
    return HttpResponseRedirect(reverse("admin:backtest", args=[backtest.pk]))


def backtests_page(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    require(request, *VIEW_BACKTESTS)
    recent = Backtest.objects.select_related("created_by")[:50]
    return render(request, site, "backtests.html", "Backtests", backtests=recent)


def backtest_page(request: HttpRequest, *, site: AdminSite, backtest_id: int) -> HttpResponse:
    require(request, *VIEW_BACKTESTS)
    backtest = get_object_or_404(Backtest, pk=backtest_id)
    done = sum(part.done for part in backtest.part_rows.all())
    result = backtest.result or {}
    rows = result.get("rows", [])
    days: dict[str, dict[str, int]] = {}
    for row in rows:
        day = days.setdefault(row["day"], {"in_force": 0, "draft": 0, "gained": 0, "lost": 0})
        day["in_force"] += row["in_force"].get("allowed", 0)
        day["draft"] += row["draft"].get("allowed", 0)
        day["gained"] += row["gained"]
        day["lost"] += row["lost"]
    shown = sorted(rows, key=lambda r: -(r["gained"] + r["lost"]))[:ROWS_SHOWN]
    chart = {
        "days": list(days),
        "in_force": [d["in_force"] for d in days.values()],
        "draft": [d["draft"] for d in days.values()],
    }
    can_save = (
        backtest.status == Backtest.Status.DONE
        and backtest.origin is not None
        and backtest.saved_as_id is None
        and _may_save(request, backtest)
    )
    return render(
        request,
        site,
        "backtest.html",
        f"Backtest {backtest.pk}",
        backtest=backtest,
        running=backtest.status in (Backtest.Status.QUEUED, Backtest.Status.RUNNING),
        done=done,
        fraction=min(1.0, done / backtest.expected) if backtest.expected else 0.0,
        words=_changes_words(backtest.changes),
        result=result,
        days=[{"day": k, **v} for k, v in days.items()],
        rows=shown,
        rows_left=max(0, len(rows) - len(shown)),
        chart=chart,
        chart_json=json.dumps(chart),
        stale=policy_mark() != backtest.policy_mark,
        can_save=can_save,
        back=_origin_url(backtest.origin),
    )


def _may_save(request: HttpRequest, backtest: Backtest) -> bool:
    changes = backtest.changes
    needed = set()
    if changes.get("rules"):
        needed |= {"limits.add_rule", "limits.change_rule", "limits.delete_rule"}
    if changes.get("quiet_hours"):
        needed |= {"limits.add_quiethours", "limits.change_quiethours", "limits.delete_quiethours"}
    if changes.get("caps"):
        needed |= {"limits.add_cap", "limits.change_cap"}
    return request.user.has_perms(sorted(needed))


def _origin_url(origin: dict[str, Any] | None) -> str:
    if not origin:
        return reverse("admin:backtests")
    kind, row_id = origin.get("kind"), origin.get("id")
    if kind == "rule":
        return (
            reverse("admin:limits_rule_change", args=[row_id])
            if row_id
            else reverse("admin:limits_rule_add")
        )
    if kind == "quiet":
        return (
            reverse("admin:limits_quiethours_change", args=[row_id])
            if row_id
            else reverse("admin:limits_quiethours_add")
        )
    return reverse("admin:cap_grid", args=[row_id])


@require_POST
def backtest_save(request: HttpRequest, *, site: AdminSite, backtest_id: int) -> HttpResponse:
    """Save the change a backtest tried, through the one write path, and keep the backtest with
    the change it is saved as; refused when the policy changed since it was tried."""
    require(request, *VIEW_BACKTESTS)
    backtest = get_object_or_404(Backtest, pk=backtest_id)
    if not _may_save(request, backtest) or backtest.origin is None:
        raise PermissionDenied
    here = reverse("admin:backtest", args=[backtest.pk])
    if backtest.saved_as_id is not None:
        messages.info(request, "This change was saved already.")
        return HttpResponseRedirect(here)
    if policy_mark() != backtest.policy_mark:
        messages.error(
            request,
            "The settings changed since this change was tried: nothing was saved. Try it again "
            "from its form.",
        )
        return HttpResponseRedirect(here)
    try:
        with transaction.atomic():
            saved = draft_save(
                msgspec.convert(backtest.changes, DraftBody), user=request.user, via="admin"
            )
            first = SettingChange.objects.filter(pk__in=saved).order_by("id").first()
            Backtest.objects.filter(pk=backtest.pk).update(saved_as=first)
    except (ModelValidationError, ValidationError, Conflict) as exc:
        messages.error(request, f"Nothing was saved: {exc}")
        return HttpResponseRedirect(here)
    messages.success(request, "Saved. The backtest is kept with the change, on its history.")
    return HttpResponseRedirect(_origin_url(backtest.origin) if backtest.origin.get("id") else here)
