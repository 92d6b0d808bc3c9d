"""Admin of cap experiments (limits/studies/experiments.py), for a marketer who never writes JSON.

The list shows each experiment's status and arms in words. The add form takes up to 5 arms, each
with one rule picked from plain choices (a channel, a limit, a window), checked by the one rule
(`experiment_problems`) and made through `experiment_create`; every problem is shown on the
field it names (`arms.1.rules.0.limit` on arm 2's limit), and nothing is made while one is left.
An experiment's page is read only but for its name and end (while it is scheduled or running,
through `experiment_change`), with two buttons: stop it now, or conclude it by promoting one
arm's rules to its segment. Every change is in its history; none is ever deleted here.

Its result (`<id>/report/`, and the global control group's at `report/holdout/`) is the
experiments report (limits/studies/report.py) as a marketer reads it: the verdict in words first,
then per measure each arm's mean per user with its 95 % interval and each arm's change against
the reference, drawn (Chart.js, as the dashboard) and in a table for whoever has no JavaScript
or a screen reader, and the REST report's CSV for a spreadsheet."""

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import urlencode

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.integers import INT32_MAX, WholeNumberField
from gatekeeper.lib.permissions import CHANGE_EXPERIMENTS, CONCLUDE_EXPERIMENTS, VIEW_STUDIES
from limits.channels import scope_label, scopes
from limits.models.studies import Experiment, ExperimentArm
from limits.policy.admin.base import history_url
from limits.policy.rules import rule_describe, rule_fields_of_json, rule_view_of
from limits.studies.experiments import (
    ARMS_MAX,
    ARMS_MIN,
    CONCLUDED,
    ENDED,
    EXPERIMENTS,
    RUNNING,
    SCHEDULED,
    STOPPED,
    ArmFields,
    ExperimentFields,
    experiment_change,
    experiment_conclude,
    experiment_create,
    experiment_problems,
    experiment_stop,
    experiment_words,
    status_of,
)
from limits.studies.report import BASE_MEASURES, report_period, study_of, study_report, today_utc
from segments.models import Segment

# The windows an arm's rule may have in the add form: (what it is called, its JSON).
WINDOWS: dict[str, tuple[str, dict[str, Any]]] = {
    "rolling-1d": ("rolling 1 day (any 24 hours)", {"kind": "rolling", "seconds": 86_400}),
    "rolling-7d": ("rolling 7 days", {"kind": "rolling", "seconds": 7 * 86_400}),
    "rolling-30d": ("rolling 30 days", {"kind": "rolling", "seconds": 30 * 86_400}),
    "calendar-day": ("calendar day", {"kind": "calendar", "unit": "day"}),
    "calendar-week": ("calendar week (Monday to Sunday)", {"kind": "calendar", "unit": "week"}),
    "calendar-month": ("calendar month", {"kind": "calendar", "unit": "month"}),
}
MODE_CHOICES = [
    ("replace", "replace the segment's own rules on this channel"),
    ("add", "add to the segment's own rules"),
]
# The parts of an arm in the add form: arm{n}_{part}, n from 1 (as people count).
ARM_PARTS = ("name", "share", "mode", "channel", "limit", "window")
# The one rule names an arm's rule's fields as the REST API does; the form's are the arm's.
RULE_PART = {"name": "name", "channel": "channel", "limit": "limit", "window": "window"}
# Datetimes as a browser's datetime picker sends and shows them (to the minute).
PICKED = "%Y-%m-%dT%H:%M"
STOPPABLE = (SCHEDULED, RUNNING)
EDITABLE = (SCHEDULED, RUNNING)


def percent(share: float) -> str:
    """0.5 -> '50 %'; 0.333 -> '33.3 %'."""
    return f"{share * 100:g} %"


def arm_rule_words(rule: Mapping[str, Any], segment: Segment | None) -> str:
    """One rule of an arm in plain words, for the experiment's users."""
    fields = rule_fields_of_json(rule)
    fields.segment = segment.slug if segment is not None else None
    name = segment.name if segment is not None else None
    return rule_describe(rule_view_of(fields, id=0), segment_name=name)


def mode_words(mode: str) -> str:
    if mode == ExperimentArm.Mode.REPLACE:
        return "replacing the segment's own rules on the channels it names"
    return "on top of the segment's own rules"


def arm_words(arm: ExperimentArm, segment: Segment | None) -> str:
    """'one' (50 % of the users, replacing ...): VIP users: at most 1 email in any 24 hours."""
    rules = "; ".join(arm_rule_words(rule, segment) for rule in arm.rules)
    return f"'{arm.name}' ({percent(arm.share)} of the users, {mode_words(arm.mode)}): {rules}"


def picker() -> forms.DateTimeInput:
    """The browser's own date and time picker."""
    return forms.DateTimeInput(format=PICKED, attrs={"type": "datetime-local"})


def zone_words() -> str:
    return f"In {timezone.get_current_timezone_name()}, the admin's time zone."


def add_problems(
    form: forms.Form,
    problems: Mapping[str, Sequence[str]],
    where: Mapping[str, str | None],
    arm_numbers: Sequence[int] = (),
) -> None:
    """The one rule's problems (by the REST API's names) on the form's fields: each on the field
    `where` names, the rest on the form as a whole with the name they came with, so that none is
    lost. A field the form has already refused (a limit that is not a number) is not told again
    what the one rule made of its emptiness."""
    for key, messages_ in problems.items():
        field = where.get(key)
        if field is not None and field not in form.fields:
            field = None
        if field is not None and field in form.errors:
            continue
        for message in messages_:
            shown = message if field is not None else f"{label_of(key, arm_numbers)}: {message}"
            form.add_error(field, shown)


def label_of(key: str, arm_numbers: Sequence[int] = ()) -> str:
    """A problem's REST name as people read it: 'arms.1.rules.0.reserve' -> 'Arm 2, rule 1,
    reserve'. `arm_numbers`: the arms' numbers on the form, by place (arm 3 left empty, the
    third arm is arm 4)."""
    parts = key.split(".")
    words = []
    while parts:
        part = parts.pop(0)
        if part == "arms" and parts and parts[0].isdigit():
            place = int(parts.pop(0))
            number = arm_numbers[place] if place < len(arm_numbers) else place + 1
            words.append(f"Arm {number}")
        elif part == "rules" and parts and parts[0].isdigit():
            words.append(f"rule {int(parts.pop(0)) + 1}")
        else:
            words.append(part.replace("_", " "))
    text = ", ".join(words)
    return text[:1].upper() + text[1:]


# --- the add form ------------------------------------------------------------------------------


class ExperimentAddForm(forms.Form):
    """An experiment as a marketer gives it: up to 5 arms of one rule each, shares in percent.
    Arms 1 and 2 are needed; arm 3 to 5 count when anything of them is typed."""

    name = forms.CharField(max_length=100, help_text='In your words: "3 or 5 a week for Active".')
    segment = forms.ChoiceField(
        choices=[],
        required=False,
        help_text="Whose users are split into the arms. Every segment: everyone's.",
    )
    starts_at = forms.DateTimeField(
        required=False, widget=picker(), label="Starts at", help_text="Empty: now."
    )
    ends_at = forms.DateTimeField(widget=picker(), label="Ends at")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        segments = Segment.objects.order_by("priority").values_list("slug", "name")
        cast(forms.ChoiceField, self.fields["segment"]).choices = [
            ("", "every segment"),
            *segments,
        ]
        for name in ("starts_at", "ends_at"):
            self.fields[name].help_text = f"{self.fields[name].help_text} {zone_words()}".strip()
        channels = [(s, scope_label(s)) for s in scopes()]
        for n in range(1, ARMS_MAX + 1):
            self.fields[f"arm{n}_name"] = forms.CharField(
                required=False,
                max_length=100,
                label="Name",
                help_text='Like "3 a week". Also the name of its rule.',
            )
            self.fields[f"arm{n}_share"] = forms.FloatField(
                required=False,
                label="Share (%)",
                help_text="Of the users, in percent: 50 for half. All arms together at most "
                "100; the rest keep the segment's rules and are in no arm.",
            )
            self.fields[f"arm{n}_mode"] = forms.ChoiceField(choices=MODE_CHOICES, label="Mode")
            self.fields[f"arm{n}_channel"] = forms.ChoiceField(choices=channels, label="Channel")
            self.fields[f"arm{n}_limit"] = WholeNumberField(
                maximum=INT32_MAX,
                what="Limit",
                required=False,
                label="Limit",
                help_text="Most sends in the window. 0 blocks them all.",
            )
            self.fields[f"arm{n}_window"] = forms.ChoiceField(
                choices=[(key, words) for key, (words, _) in WINDOWS.items()], label="Window"
            )
        self.arm_numbers: list[int] = []  # the arms given, as the form numbers them

    def arm_blocks(self) -> list[dict[str, Any]]:
        """The arms' fields, a block each, for the template."""
        return [
            {
                "number": n,
                "optional": n > ARMS_MIN,
                "fields": [self[f"arm{n}_{part}"] for part in ARM_PARTS],
            }
            for n in range(1, ARMS_MAX + 1)
        ]

    def general_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("name", "segment", "starts_at", "ends_at")]

    def _given(self, n: int) -> bool:
        if n <= ARMS_MIN:
            return True
        return any(
            str(self.data.get(self.add_prefix(f"arm{n}_{part}"), "")).strip()
            for part in ("name", "share", "limit")
        )

    def experiment_fields(self, now: datetime) -> ExperimentFields:
        """The experiment as typed; a part that did not parse reads as empty (it has its error)."""
        data = self.cleaned_data
        arms = []
        for n in self.arm_numbers:
            name = data.get(f"arm{n}_name") or ""
            share = data.get(f"arm{n}_share")
            limit = data.get(f"arm{n}_limit")
            window = WINDOWS.get(data.get(f"arm{n}_window") or "", ("", {}))[1]
            rule = {
                "name": name.strip(),
                "channel": data.get(f"arm{n}_channel") or "",
                "match": "any",
                "tag": None,
                "window": dict(window),
                "limit": 0 if limit is None else limit,
                "reserve": None,
            }
            arms.append(
                ArmFields(
                    name=name,
                    share=0.0 if share is None else share / 100,
                    rules=[rule],
                    mode=data.get(f"arm{n}_mode") or "",
                )
            )
        starts = data.get("starts_at") or now
        ends = data.get("ends_at") or starts
        return ExperimentFields(
            name=data.get("name") or "",
            segment=data.get("segment") or None,
            arms=arms,
            starts_at=starts,
            ends_at=ends,
            salt="-",  # drawn when made; the form has none to check
        )

    def field_of(self) -> dict[str, str | None]:
        """Where each of the one rule's names goes on this form."""
        where: dict[str, str | None] = {
            "name": "name",
            "segment": "segment",
            "starts_at": "starts_at",
            "ends_at": "ends_at",
        }
        for place, n in enumerate(self.arm_numbers):
            for part in ("name", "share", "mode"):
                where[f"arms.{place}.{part}"] = f"arm{n}_{part}"
            for key, part in RULE_PART.items():
                where[f"arms.{place}.rules.0.{key}"] = f"arm{n}_{part}"
            for key in ("window.kind", "window.seconds", "window.unit"):
                where[f"arms.{place}.rules.0.{key}"] = f"arm{n}_window"
        return where

    def add_problems(self, problems: Mapping[str, Sequence[str]]) -> None:
        """Problems by the one rule's names (from `experiment_problems` or `experiment_create`),
        each where the marketer sees it."""
        add_problems(self, problems, self.field_of(), self.arm_numbers)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        self.arm_numbers = [n for n in range(1, ARMS_MAX + 1) if self._given(n)]
        for n in self.arm_numbers:
            for part, missing in (
                ("name", 'Give the arm a name: "3 a week".'),
                ("share", "Give the arm its share of the users, in percent: 50 for half."),
                ("limit", "Give its rule a limit: the most sends in the window."),
            ):
                field = f"arm{n}_{part}"
                if field not in self.errors and data.get(field) in (None, ""):
                    self.add_error(field, missing)
            share = data.get(f"arm{n}_share")
            if share is not None and not 0 < share <= 100:
                self.add_error(f"arm{n}_share", "Above 0 and at most 100 (%).")
        now = timezone.now()
        fields = self.experiment_fields(now)
        # Without both its times, its overlap with other experiments cannot be told yet.
        live = Experiment.objects.filter(state=Experiment.State.ACTIVE).select_related("segment")
        timed = data.get("ends_at") and "starts_at" not in self.errors
        others = list(live) if timed else []
        slugs = Segment.objects.values_list("slug", flat=True)
        self.add_problems(experiment_problems(fields, segments=slugs, others=others, now=now))
        return data


# --- an experiment's page ------------------------------------------------------------------------


class ExperimentEditForm(forms.Form):
    """What may change once an experiment is made: its name and its end."""

    name = forms.CharField(max_length=100)
    ends_at = forms.DateTimeField(widget=picker(), label="Ends at")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["ends_at"].help_text = (
            f"{zone_words()} Later to run it longer, earlier to end it sooner (stop it to end "
            "it now)."
        )

    def changes(self, row: Experiment) -> dict[str, Any]:
        """What was changed. The end is shown to the minute: a stored end with seconds, left
        as shown, is not moved."""
        data = self.cleaned_data
        changes: dict[str, Any] = {}
        if data["name"].strip() != row.name:
            changes["name"] = data["name"].strip()
        if data["ends_at"] != row.ends_at.replace(second=0, microsecond=0):
            changes["ends_at"] = data["ends_at"]
        return changes


# --- its result ----------------------------------------------------------------------------------

# An arm's colour in every chart of a result (the dashboard's palette): the same arm, the same
# colour, in the means and in the changes.
ARM_COLOURS = ("#5b8bd0", "#3a9b5c", "#e0a030", "#b23b3b", "#8a63c9", "#2aa5a5")
# What the result page passes on to the report; anything else in its query is not the report's.
REPORT_PARAMS = ("from", "to", "event")
# In the chart of changes: the base measures after the events' conversions (an event's value
# reads as its conversions do, so only those are drawn; the table has both).
CHANGE_MEASURES = ("sends", "unsubscribes", "complaints")


def finite(value: float | None) -> float | None:
    """A figure as JSON can carry it: None for none, NaN or infinity."""
    return value if value is not None and math.isfinite(value) else None


def figure(value: float | None) -> str:
    """A per-user figure as people read it, to about 3 digits: 1,234 / 12.35 / 0.0123; '-' for
    none."""
    value = finite(value)
    if value is None:
        return "-"
    size = abs(value)
    if size == 0:
        return "0"
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 1:
        return f"{value:,.2f}"
    return f"{value:.{min(8, 2 - math.floor(math.log10(size)))}f}"


def signed(value: float | None) -> str:
    """A difference, with its sign: +0.50, -0.0123."""
    shown = figure(value)
    return f"+{shown}" if value is not None and shown not in ("-", "0") and value > 0 else shown


def change_words(value: float | None) -> str:
    """A relative change in percent, with its sign: +12.5 %."""
    value = finite(value)
    return "-" if value is None else f"{value * 100:+.1f} %"


def between(low: float | None, high: float | None, words: Any = figure) -> str:
    """An interval: '0.91 to 1.12'; '-' when either end is unknown (too few buckets)."""
    if finite(low) is None or finite(high) is None:
        return "-"
    return f"{words(low)} to {words(high)}"


def p_words(value: float | None) -> str:
    value = finite(value)
    if value is None:
        return "-"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def percent_of(value: float | None) -> float | None:
    """A relative change (0.125) in percent (12.5) for the charts; None for none."""
    value = finite(value)
    return None if value is None else value * 100


def event_names(measures: Sequence[Mapping[str, Any]]) -> list[str]:
    """The outcome events among a report's measures: each comes with its value, `<name>.value`."""
    keys = [measure["key"] for measure in measures]
    base = {key for key, _ in BASE_MEASURES}
    return [key for key in keys if key not in base and f"{key}.value" in keys]


def result_table(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report's figures for the page's table: a group of rows per measure, a row per arm
    (the reference's with no difference: it is what the others are compared with)."""
    groups = []
    for measure in report["measures"]:
        key = measure["key"]
        rows = []
        for arm in report["arms"]:
            figures = arm["measures"][key]
            row: dict[str, Any] = {
                "arm": arm["name"],
                "users": arm["users"],
                "mean": figure(figures["mean"]),
                "interval": between(figures["low"], figures["high"]),
                "reference": arm["lift"] is None,
            }
            found = (arm["lift"] or {}).get(key)
            if arm["lift"] is not None and found is None:
                row["too_few"] = True
            elif found is not None:
                row.update(
                    difference=signed(found["difference"]),
                    difference_interval=between(found["low"], found["high"], signed),
                    change=change_words(found["relative"]),
                    change_interval=between(
                        found["relative_low"], found["relative_high"], change_words
                    ),
                    p_value=p_words(found["p_value"]),
                    significant="yes" if found["significant"] else "no",
                )
            rows.append(row)
        groups.append({"key": key, "per_user": measure["per_user"], "rows": rows})
    return groups


def result_charts(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the page's script draws: per measure each arm's mean per user and its interval; and
    each arm's change against the reference (in percent, with its interval) on the events'
    conversions and the base measures. Figures JSON cannot carry are None (a gap)."""
    arms = report["arms"]
    reference = report["reference"]
    means = []
    for place, measure in enumerate(report["measures"]):
        key = measure["key"]
        shown = [arm["measures"][key] for arm in arms]
        means.append(
            {
                "canvas": f"chart-mean-{place}",
                "axis": f"{measure['per_user']} per user",
                "values": [finite(f["mean"]) for f in shown],
                "lows": [finite(f["low"]) for f in shown],
                "highs": [finite(f["high"]) for f in shown],
                "tips": [
                    f"{figure(f['mean'])} per user (95 % interval {between(f['low'], f['high'])})"
                    for f in shown
                ],
            }
        )
    words = {measure["key"]: measure["per_user"] for measure in report["measures"]}
    keys = [*event_names(report["measures"]), *CHANGE_MEASURES]
    changes = []
    for place, arm in enumerate(arms):
        if arm["lift"] is None:
            continue
        found = [arm["lift"].get(key) or {} for key in keys]
        changes.append(
            {
                "name": arm["name"],
                "colour": ARM_COLOURS[place % len(ARM_COLOURS)],
                "values": [percent_of(f.get("relative")) for f in found],
                "lows": [percent_of(f.get("relative_low")) for f in found],
                "highs": [percent_of(f.get("relative_high")) for f in found],
                "tips": [
                    f"{change_words(f['relative'])} (95 % interval "
                    f"{between(f['relative_low'], f['relative_high'], change_words)})"
                    if finite(f.get("relative")) is not None
                    else "too few users yet to tell"
                    for f in found
                ],
            }
        )
    return {
        "arms": [arm["name"] for arm in arms],
        "colours": [ARM_COLOURS[place % len(ARM_COLOURS)] for place in range(len(arms))],
        "means": means if any(arm["users"] for arm in arms) else [],
        "changes": {
            "canvas": "chart-changes",
            "axis": f"change against '{reference}' (%)",
            "labels": [words[key] for key in keys],
            "arms": changes,
        }
        if changes and any(arm["users"] for arm in arms)
        else None,
    }


class ReportForm(forms.Form):
    """The period of a result and the event its verdict reads, asked by GET. Checked by the
    report's own rule (`report_period`), whose problems the view puts on these fields: the form
    itself takes any text, so that nothing is refused twice in two ways."""

    def __init__(self, data: Mapping[str, Any], *, events: Sequence[str]) -> None:
        super().__init__(data)
        day = forms.DateInput(attrs={"type": "date"})
        self.fields["from"] = forms.CharField(
            required=False, label="From", widget=day, help_text="The first UTC day."
        )
        self.fields["to"] = forms.CharField(
            required=False, label="To", widget=day, help_text="The last UTC day, included."
        )
        self.fields["event"] = forms.CharField(
            required=False,
            label="Event",
            widget=forms.Select(choices=[("", "the most frequent"), *((e, e) for e in events)]),
            help_text="The outcome the verdict reads.",
        )


class StatusFilter(admin.SimpleListFilter):
    """By status, which reads the clock besides what a person did."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in (SCHEDULED, RUNNING, ENDED, STOPPED, CONCLUDED)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now, active = timezone.now(), Q(state=Experiment.State.ACTIVE)
        where = {
            SCHEDULED: active & Q(starts_at__gt=now),
            RUNNING: active & Q(starts_at__lte=now, ends_at__gt=now),
            ENDED: active & Q(ends_at__lte=now),
            STOPPED: Q(state=Experiment.State.STOPPED),
            CONCLUDED: Q(state=Experiment.State.CONCLUDED),
        }.get(self.value() or "")
        return queryset if where is None else queryset.filter(where)


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    """Experiments are history: made here or over REST, stopped or concluded, never deleted."""

    list_display = ["name", "who", "status", "starts_at", "ends_at", "arms_in_words"]
    list_filter = [StatusFilter]
    search_fields = ["name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Experiment]:
        rows = super().get_queryset(request).select_related("segment", "created_by")
        return rows.prefetch_related("arms")

    @admin.display(description="segment", ordering="segment__priority")
    def who(self, row: Experiment) -> str:
        return row.segment.name if row.segment is not None else "every segment"

    @admin.display(description="status")
    def status(self, row: Experiment) -> str:
        return status_of(row.state, row.starts_at, row.ends_at, timezone.now())

    @admin.display(description="arms")
    def arms_in_words(self, row: Experiment) -> str:
        return " | ".join(arm_words(arm, row.segment) for arm in row.arms.all())

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path(
                "<int:experiment_id>/stop/",
                view(self.stop_view),
                name="limits_experiment_stop",
            ),
            path(
                "<int:experiment_id>/conclude/",
                view(self.conclude_view),
                name="limits_experiment_conclude",
            ),
            path(
                "<int:experiment_id>/report/",
                view(self.report_view),
                name="limits_experiment_report",
            ),
            path("report/holdout/", view(self.holdout_report_view), name="limits_holdout_report"),
            *super().get_urls(),
        ]

    def _page(self, request: HttpRequest, template: str, **context: Any) -> TemplateResponse:
        return TemplateResponse(
            request,
            f"admin/gatekeeper/{template}",
            {**self.admin_site.each_context(request), "opts": self.opts, **context},
        )

    def _back(self, row: Experiment) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:limits_experiment_change", args=[row.pk]))

    # --- made ---

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A new experiment, from the form; made only when nothing is wrong with any of it."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = ExperimentAddForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            now = timezone.now()
            fields = form.experiment_fields(now)
            fields.salt = ""  # a new one, drawn when made
            try:
                row = experiment_create(fields, user=request.user, via="admin", now=now)
            except ValidationError as exc:
                # Another experiment made meanwhile: the one rule, once more, under the lock.
                form.add_problems(exc.message_dict)
            else:
                self.log_addition(request, row, "Made through the add form")
                messages.success(request, f"Made: {experiment_words(row)}")
                return self._back(row)
        return self._page(request, "experiment_add_form.html", title="Add an experiment", form=form)

    # --- its page ---

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Its page: read only but for its name and end while it is scheduled or running, with
        its arms and history in words and the buttons that stop or conclude it."""
        row = self.get_object(request, unquote(object_id))
        if row is None:
            messages.warning(request, f"No experiment with id '{object_id[:20]}'.")
            return HttpResponseRedirect(reverse("admin:limits_experiment_changelist"))
        if not self.has_view_or_change_permission(request, row):
            raise PermissionDenied
        status = status_of(row.state, row.starts_at, row.ends_at, timezone.now())
        can_change = self.has_change_permission(request, row)
        editable = can_change and status in EDITABLE
        initial = {"name": row.name, "ends_at": row.ends_at}
        form = ExperimentEditForm(initial=initial)
        if request.method == "POST":
            if not can_change:
                raise PermissionDenied
            if not editable:
                messages.error(request, f"It is {status}: its name and end are fixed now.")
                return self._back(row)
            form = ExperimentEditForm(request.POST, initial=initial)
            if form.is_valid():
                changes = form.changes(row)
                if not changes:
                    messages.info(request, "Nothing changed.")
                    return self._back(row)
                try:
                    changed = experiment_change(row, changes, user=request.user, via="admin")
                except ValidationError as exc:
                    add_problems(form, exc.message_dict, {"name": "name", "ends_at": "ends_at"})
                else:
                    what = " and ".join("its name" if k == "name" else "its end" for k in changes)
                    self.log_change(request, changed, f"Changed {what}")
                    messages.success(request, f"Changed {what}: {experiment_words(changed)}")
                    return self._back(changed)
        arms = list(row.arms.all())
        context = {
            "title": f"Experiment: {row.name}",
            "original": row,
            "status": status,
            "words": experiment_words(row),
            "arms": [
                {
                    "name": arm.name,
                    "share": percent(arm.share),
                    "mode": mode_words(arm.mode),
                    "rules": [arm_rule_words(rule, row.segment) for rule in arm.rules],
                }
                for arm in arms
            ],
            "segment_name": row.segment.name if row.segment is not None else "every segment",
            "form": form if editable else None,
            "can_stop": request.user.has_perms(CHANGE_EXPERIMENTS) and status in STOPPABLE,
            "can_conclude": request.user.has_perms(CONCLUDE_EXPERIMENTS)
            and status not in (SCHEDULED, CONCLUDED),
            "arm_names": [arm.name for arm in arms],
            "can_read_result": request.user.has_perms(VIEW_STUDIES),
            "history": EXPERIMENTS.changes(row.pk).select_related("by")[:100],
            "history_url": history_url(EXPERIMENTS.kind, row.pk),
        }
        return self._page(request, "experiment_change_form.html", **context)

    # --- the buttons ---

    def stop_view(self, request: HttpRequest, experiment_id: int) -> HttpResponse:
        """POST only (the button on its page): stop it now, every user back on the segment's
        rules."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perms(CHANGE_EXPERIMENTS):
            raise PermissionDenied
        row = get_object_or_404(Experiment, pk=experiment_id)
        status = status_of(row.state, row.starts_at, row.ends_at, timezone.now())
        if status == ENDED:
            messages.error(
                request, "It has ended: its arms no longer apply, there is nothing to stop."
            )
            return self._back(row)
        try:
            stopped = experiment_stop(row, user=request.user, via="admin")
        except Conflict as exc:  # already stopped or concluded
            messages.error(request, str(exc))
        else:
            self.log_change(request, stopped, "Stopped")
            messages.success(
                request, f"Stopped '{stopped.name}': every user is back on the segment's rules."
            )
        return self._back(row)

    def conclude_view(self, request: HttpRequest, experiment_id: int) -> HttpResponse:
        """POST only (the button on its page): promote the chosen arm's rules to the segment,
        and say what that did to its rules."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perms(CONCLUDE_EXPERIMENTS):
            raise PermissionDenied
        row = get_object_or_404(Experiment, pk=experiment_id)
        try:
            concluded, words = experiment_conclude(
                row, request.POST.get("arm", ""), user=request.user, via="admin"
            )
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
        except Conflict as exc:  # not now (its status), or the rules' writer's guard
            messages.error(request, str(exc))
        else:
            self.log_change(request, concluded, f"Concluded: arm '{concluded.concluded_arm}'")
            messages.success(request, words)
        return self._back(row)

    # --- its result ---

    def report_view(self, request: HttpRequest, experiment_id: int) -> HttpResponse:
        """The experiment's result, its arms against its first."""
        if not request.user.has_perms(VIEW_STUDIES):
            raise PermissionDenied
        if not Experiment.objects.filter(pk=experiment_id).exists():
            messages.warning(request, f"No experiment with id '{experiment_id}'.")
            return HttpResponseRedirect(reverse("admin:limits_experiment_changelist"))
        return self._result(
            request,
            str(experiment_id),
            back=reverse("admin:limits_experiment_change", args=[experiment_id]),
        )

    def holdout_report_view(self, request: HttpRequest) -> HttpResponse:
        """The global control group's result: its held-out users against the treatment sample."""
        if not request.user.has_perms(VIEW_STUDIES):
            raise PermissionDenied
        return self._result(
            request, "holdout", back=reverse("admin:limits_holdout_change", args=[1])
        )

    def _result(self, request: HttpRequest, key: str, *, back: str) -> TemplateResponse:
        """A study's result over the period asked (by default its days up to today). A period
        that is not one shows its problems on the form's fields and no figures."""
        today = today_utc()
        study = study_of(key, today=today)
        if study is None:
            raise Http404(f"No experiment {key[:20]}.")
        context: dict[str, Any] = {
            "title": f"Result: {study.name}",
            "study": study,
            "back": back,
            "holdout": key == "holdout",
        }
        if study.first_day > today:
            context["not_yet"] = (
                f"It starts on {study.first_day.isoformat()} (UTC): its figures come as its "
                "users enter, with their first marketing send while it runs."
            )
            return self._page(request, "experiment_report.html", **context)
        # An emptied date field asks for the default, as if it were not there.
        asked = {
            name: [value for value in request.GET.getlist(name) if value.strip()]
            for name in REPORT_PARAMS
        }
        shown = {name: values[-1] if values else "" for name, values in asked.items()}
        try:
            start, end, event = report_period(study, asked, today=today)
        except ValidationError as exc:
            form = ReportForm(shown, events=[shown["event"]] if shown["event"] else [])
            form.is_valid()  # only text: what is wrong is what the report's rule says
            for name, problems in exc.message_dict.items():
                for problem in problems:
                    form.add_error(name if name in form.fields else None, problem)
            return self._page(request, "experiment_report.html", form=form, **context)
        report = study_report(study, start=start, end=end, event=event)
        events = event_names(report["measures"])
        shown.update({"from": start.isoformat(), "to": end.isoformat()})
        query = {"format": "csv", "from": start.isoformat(), "to": end.isoformat()}
        if event:
            query["event"] = event
        context.update(
            form=ReportForm(shown, events=events),
            report=report,
            table=result_table(report),
            chart_data=result_charts(report),
            csv_url=f"{reverse('experiment-report', args=[key])}?{urlencode(query)}",
        )
        return self._page(request, "experiment_report.html", **context)
