"""Admin of quiet hours: a form checked by the one rule for quiet hours, entries in plain words,
their history, and writes through the services (quiet_create, quiet_update, quiet_delete)."""

from dataclasses import asdict
from datetime import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from gatekeeper.lib.integers import (
    INT32_MAX,
    WholeNumberField,
)
from gatekeeper.lib.words import count
from limits.admin.base import AuditLogAdmin, history_table, made_words, segment_names
from limits.channels import scope_label, scopes
from limits.models import (
    QuietHours,
    QuietHoursChange,
)
from limits.quiet import (
    SPREAD_MAX,
    QuietFields,
    QuietView,
    clock_text,
    minutes_from_text,
    quiet_describe,
    quiet_problems,
    quiet_view,
)
from limits.services import (
    quiet_create,
    quiet_delete,
    quiet_update,
)
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

    def quiet_fields(self) -> QuietFields:
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
        for field, problems in quiet_problems(self.quiet_fields(), segments=slugs).items():
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


QUIET_FIELDS_SHOWN = ("segment", "channel", "start", "end", "spread_minutes", "enabled")


def _quiet_view_of(data: dict[str, Any]) -> QuietView:
    """An entry as its history keeps it (quiet_as_json), read back to be put in words."""
    return QuietView(
        id=data.get("id") or 0,
        segment=data.get("segment"),
        channel=data.get("channel", ""),
        start=minutes_from_text(data.get("start", "00:00")),
        end=minutes_from_text(data.get("end", "00:00")),
        spread_minutes=data.get("spread_minutes", 0),
    )


def _quiet_value_words(key: str, value: Any, names: dict[str, str]) -> str:
    if key == "segment":
        return "every segment" if value is None else names.get(value, value)
    if key == "channel":
        return scope_label(value) if value else "none"
    if key == "spread_minutes":
        return "at once" if not value else f"{value} min"
    if key == "enabled":
        return "yes" if value else "no"
    return "none" if value in (None, "") else str(value)


def quiet_change_words(change: QuietHoursChange, names: dict[str, str]) -> str:
    """A history line: what the entry became, or which fields changed from what to what.
    `names`: segment names by slug (segment_names())."""
    if change.action == QuietHoursChange.Action.CREATED and change.after:
        return f"Created: {quiet_describe(_quiet_view_of(change.after), segment_names=names)}"
    if change.action == QuietHoursChange.Action.DELETED:
        return "Deleted."
    before, after = change.before or {}, change.after or {}
    changed = [
        f"{key.replace('_minutes', '')}: {_quiet_value_words(key, before.get(key), names)} → "
        f"{_quiet_value_words(key, after.get(key), names)}"
        for key in QUIET_FIELDS_SHOWN
        if before.get(key) != after.get(key)
    ]
    return "; ".join(changed) or "Nothing visible changed."


@admin.register(QuietHours)
class QuietHoursAdmin(admin.ModelAdmin):
    form = QuietHoursForm
    list_display = ["reading", "who", "scope", "hours", "spread", "enabled"]
    list_display_links = ["reading"]
    list_filter = [("segment", QuietSegmentFilter), "channel", "enabled"]
    ordering = [F("segment__priority").asc(nulls_first=True), "channel", "start", "id"]
    actions = ["delete_selected", "enable_entries", "disable_entries"]
    change_list_template = "admin/gatekeeper/quiethours_change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[QuietHours]:
        return super().get_queryset(request).select_related("segment", "created_by", "changed_by")

    @admin.display(description="in plain words")
    def reading(self, entry: QuietHours) -> str:
        return quiet_reading(entry)

    @admin.display(description="segment", ordering="segment__priority")
    def who(self, entry: QuietHours) -> str:
        return entry.segment.name if entry.segment is not None else "every segment"

    @admin.display(description="channel", ordering="channel")
    def scope(self, entry: QuietHours) -> str:
        return scope_label(entry.channel)

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

    @admin.display(description="created and changed")
    def made(self, entry: QuietHours) -> str:
        return made_words(entry)

    @admin.display(description="changes")
    def history(self, entry: QuietHours) -> str:
        return history_table(entry.changes, quiet_change_words, table_id="quiet-hours-history")

    # --- writes: through the services, so the history records who did it ---

    def save_model(self, request: HttpRequest, obj: QuietHours, form: Any, change: bool) -> None:
        fields = form.quiet_fields()
        if change:
            # The stored entry, not `obj`: the form has put the typed text in its fields.
            stored = QuietHours.objects.select_related("segment").get(pk=obj.pk)
            saved = quiet_update(
                entry=stored, changes=asdict(fields), user=request.user, via="admin"
            )
        else:
            saved = quiet_create(fields=fields, user=request.user, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()  # as stored, for the admin's messages and log
        messages.info(request, f"It reads: {quiet_reading(saved)}.")

    def delete_model(self, request: HttpRequest, obj: QuietHours) -> None:
        quiet_delete(entry=obj, user=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[QuietHours]) -> None:
        for entry in queryset.select_related("segment"):
            quiet_delete(entry=entry, user=request.user, via="admin")

    @admin.action(description="Enable the selected quiet hours", permissions=["change"])
    def enable_entries(self, request: HttpRequest, queryset: QuerySet[QuietHours]) -> None:
        self._switch(request, queryset, enabled=True)

    @admin.action(description="Disable the selected quiet hours", permissions=["change"])
    def disable_entries(self, request: HttpRequest, queryset: QuerySet[QuietHours]) -> None:
        self._switch(request, queryset, enabled=False)

    def _switch(
        self, request: HttpRequest, queryset: QuerySet[QuietHours], *, enabled: bool
    ) -> None:
        switched, refused = 0, []
        for entry in queryset.select_related("segment"):
            try:
                quiet_update(
                    entry=entry, changes={"enabled": enabled}, user=request.user, via="admin"
                )
            except ValidationError as exc:
                # Stored before a setting changed (a channel removed): fixed on its own page.
                refused.append(f"{quiet_reading(entry)} ({' '.join(exc.messages)})")
            else:
                switched += 1
        word = "Enabled" if enabled else "Disabled"
        messages.success(request, f"{word} {count(switched, 'entry', 'entries')}.")
        if refused:
            messages.warning(request, f"Left alone: {'; '.join(refused)}.")


@admin.register(QuietHoursChange)
class QuietHoursChangeAdmin(AuditLogAdmin):
    """Every change of every quiet-hours entry, deleted ones' included (an entry's page shows
    its own)."""

    list_filter = ["action", "via"]
    search_fields = ["label"]

    def get_list_display(self, request: HttpRequest) -> Any:
        names = segment_names()

        @admin.display(description="what")
        def what(change: QuietHoursChange) -> str:
            return quiet_change_words(change, names)

        return ["changed_at", "label", "action", what, "changed_by", "via"]
