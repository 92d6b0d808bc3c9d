"""Admin of quiet hours: a form checked by the one rule for quiet hours, entries in plain words,
their history, and writes through their authored kind (`QUIET_HOURS.create`, `.update`,
`.delete` in limits/policy/services.py)."""

from datetime import time
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import F
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from gatekeeper.lib.integers import (
    INT32_MAX,
    WholeNumberField,
)
from limits.channels import scope_label, scopes
from limits.engine.quiet import (
    SPREAD_MAX,
    QuietFields,
    clock_text,
    quiet_describe,
    quiet_problems,
    quiet_view,
)
from limits.models.policy import QuietHours
from limits.policy.admin.base import AuthoredAdmin
from limits.policy.services import QUIET_HOURS
from segments.models import Segment


class ClockField(forms.CharField):
    """A local time of day typed as HH:MM, checked by the one rule for quiet hours (the form's
    `clean`); a stored time is shown back as HH:MM."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault(
            "widget",
            forms.TextInput(attrs={"placeholder": "HH:MM", "size": "6", "autocomplete": "off"}),
        )
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, time):
            return clock_text(value.hour * 60 + value.minute)
        return value


class QuietHoursForm(forms.ModelForm):
    segment = forms.ModelChoiceField(
        queryset=Segment.objects.order_by("priority"),
        required=False,
        empty_label="every segment",
        help_text="Whose marketing sends wait. Every segment: every user, whatever their segment.",
    )
    channel = forms.ChoiceField(
        choices=[], help_text="All channels together: no marketing message of any kind."
    )
    start = ClockField(
        label="Quiet from",
        help_text="As HH:MM (00:00 to 23:59) on each user's own clock, in their time zone: 21:00.",
    )
    end = ClockField(
        label="Until",
        help_text="HH:MM. Earlier than the start means the next morning: from 21:00 until "
        "08:00. It cannot equal the start.",
    )
    spread_minutes = WholeNumberField(
        maximum=INT32_MAX,
        what="Spread",
        label="Spread over (minutes)",
        help_text=f"Sends held until the end go out over this many minutes after it, each user "
        f"at their own place in it, so the morning does not start with one burst. 0: all at "
        f"once; at most {SPREAD_MAX} ({SPREAD_MAX // 60} hours), and less than the part of the "
        "day outside the quiet hours.",
    )
    enabled = forms.BooleanField(
        required=False, initial=True, help_text="Disabled quiet hours hold nothing."
    )

    class Meta:
        model = QuietHours
        fields = ["enabled", "segment", "channel", "start", "end", "spread_minutes"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "channel" in self.fields:
            channel = self.fields["channel"]
            channel.choices = [(s, scope_label(s)) for s in scopes()]  # type: ignore[attr-defined]

    def authored_fields(self) -> QuietFields:
        """The entry as typed; a field that did not parse reads as empty (it has its error)."""
        data = self.cleaned_data
        segment = data.get("segment")
        spread = data.get("spread_minutes")
        return QuietFields(
            segment=segment.slug if segment is not None else None,
            channel=data.get("channel") or "",
            start=data.get("start") or "",
            end=data.get("end") or "",
            spread_minutes=0 if spread is None else spread,
            enabled=bool(data.get("enabled")),
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        slugs = Segment.objects.values_list("slug", flat=True)
        # The one rule for quiet hours, as the REST API and the commands apply it; its fields
        # are named as the form's.
        for field, problems in quiet_problems(self.authored_fields(), segments=slugs).items():
            if field not in self.fields or field in self.errors:
                continue  # already told what is wrong with it
            for problem in problems:
                self.add_error(field, problem)
        return data


class QuietSegmentFilter(admin.RelatedFieldListFilter):
    """By segment; an entry without one holds every segment's sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_value_display = mark_safe("every segment (entries for all)")  # a constant


def quiet_reading(entry: QuietHours) -> str:
    names = {entry.segment.slug: entry.segment.name} if entry.segment is not None else {}
    return quiet_describe(quiet_view(entry), segment_names=names)


@admin.register(QuietHours)
class QuietHoursAdmin(AuthoredAdmin):
    change_form_template = "admin/gatekeeper/quiethours_change_form.html"
    authored = QUIET_HOURS
    history_id = "quiet-hours-history"
    counted = ("entry", "entries")
    form = QuietHoursForm
    list_display = ["reading", "who", "scope", "hours", "spread", "enabled"]
    list_display_links = ["reading"]
    list_filter = [("segment", QuietSegmentFilter), "channel", "enabled"]
    ordering = [F("segment__priority").asc(nulls_first=True), "channel", "start", "id"]
    change_list_template = "admin/gatekeeper/quiethours_change_list.html"

    def reading_of(self, entry: QuietHours) -> str:
        return quiet_reading(entry)

    @admin.display(description="quiet hours", ordering="start")
    def hours(self, entry: QuietHours) -> str:
        view = quiet_view(entry)
        text = f"{clock_text(view.start)} to {clock_text(view.end)}"
        return f"{text} (next morning)" if view.wraps else text

    @admin.display(description="spread over", ordering="spread_minutes")
    def spread(self, entry: QuietHours) -> str:
        return f"{entry.spread_minutes} min" if entry.spread_minutes else "at once"

    # --- the change form ---

    def get_fieldsets(self, request: HttpRequest, obj: QuietHours | None = None) -> Any:
        fieldsets: list[tuple[str | None, dict[str, Any]]] = [
            (None, {"fields": ["enabled"]}),
            ("Whose sends, on which channel", {"fields": ["segment", "channel"]}),
            ("When, on each user's own clock", {"fields": ["start", "end", "spread_minutes"]}),
        ]
        if obj is None:
            return fieldsets
        return [
            ("At a glance", {"fields": ["reading"]}),
            *fieldsets,
            ("History", {"fields": ["made", "history"]}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: QuietHours | None = None) -> Any:
        return [] if obj is None else ["reading", "made", "history"]
