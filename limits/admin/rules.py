"""Admin of cap rules: a form checked by the one rule for a valid rule, rules read out in plain
words, their history, the findings a marketer should see (rules that never decide, reserves that
shut sends out), and writes through the services (rule_create, rule_update, rule_delete; a
classic cap's rule changes only with its cap)."""

from dataclasses import asdict
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import ValidationError
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from gatekeeper.lib.integers import (
    INT32_MAX,
    WholeNumberField,
)
from gatekeeper.lib.words import count
from limits.admin.base import AuditLogAdmin, history_table, made_words, segment_names
from limits.channels import scope_label, scopes
from limits.models import (
    Rule,
    RuleChange,
)
from limits.policy import RuleView
from limits.rules import (
    NotADuration,
    RuleFields,
    duration_from_text,
    duration_words,
    rule_describe,
    rule_problems,
)
from limits.selectors import rule_view, rules_findings
from limits.services import (
    ClassicRule,
    rule_create,
    rule_delete,
    rule_update,
)
from segments.models import Segment

# --- cap rules -------------------------------------------------------------------------------


class WindowLengthField(forms.CharField):
    """A rolling window's length, typed in words or seconds; shown back in words."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return duration_words(value)
        return value

    def to_python(self, value: Any) -> int | None:  # type: ignore[override]
        text = super().to_python(value)
        if text is None or text in self.empty_values:
            return None
        try:
            # "4 Hours" is meant as "4 hours": the one rule reads lowercase.
            return duration_from_text(" ".join(text.lower().split()))
        except NotADuration as exc:
            raise ValidationError(f"{self.label}: {exc}") from None


# rule_problems names fields as the REST API does; the form's fields are the model's.
FORM_FIELD = {
    "window.kind": "window_kind",
    "window.seconds": "window_seconds",
    "window.unit": "window_unit",
    "reserve.below_priority": "reserve_below_priority",
    "reserve.slots": "reserve_slots",
    "non_field_errors": None,
}


class RuleForm(forms.ModelForm):
    segment = forms.ModelChoiceField(
        queryset=Segment.objects.order_by("priority"),
        required=False,
        empty_label="every segment",
        help_text="Whose sends it counts. Every segment: each user's own count, whatever "
        "their segment.",
    )
    channel = forms.ChoiceField(
        choices=[], help_text="All channels together counts a user's sends on every channel."
    )
    match = forms.ChoiceField(
        choices=Rule.Match.choices,
        label="Counts",
        help_text="Every marketing send; only the sends carrying a tag; or each campaign on "
        "its own (a count per campaign, for limits like “at most 1 of each campaign a day”).",
    )
    tag = forms.CharField(
        required=False,
        help_text="For sends carrying a tag: the tag, as the campaign system sends it "
        "(lowercase letters, digits, - and _).",
    )
    window_kind = forms.ChoiceField(
        choices=Rule.WindowKind.choices,
        label="Window",
        help_text="Rolling: the last so many hours or days, whenever you look. Calendar: the "
        "current day, week (Monday to Sunday) or month in the user's time zone; it starts "
        "afresh at midnight.",
    )
    window_seconds = WindowLengthField(
        required=False,
        label="Rolling window length",
        help_text="Like 4 hours, 90 minutes, 7 days (or seconds): 1 minute to 90 days. A limit "
        "of 1 over 4 hours keeps sends at least 4 hours apart.",
    )
    window_unit = forms.ChoiceField(
        choices=[
            ("", "---------"),
            ("day", "day"),
            ("week", "week, Monday to Sunday"),
            ("month", "month"),
        ],
        required=False,
        label="Calendar period",
    )
    limit = WholeNumberField(
        maximum=INT32_MAX,
        what="Limit",
        label="Limit",
        help_text="Most sends in the window. 0 blocks them all.",
    )
    reserve_below_priority = forms.TypedChoiceField(
        choices=[("", "no reserve"), *((p, f"priority {p} and above") for p in range(1, 10))],
        coerce=int,
        empty_value=None,
        required=False,
        label="Keep slots for",
        help_text="Sends have a priority from 0 to 9 (5 unless the campaign says otherwise). "
        "Sends below this one may not use the kept slots.",
    )
    reserve_slots = WholeNumberField(
        maximum=INT32_MAX,
        what="Kept slots",
        required=False,
        label="Kept slots",
        help_text="How many of the limit's slots only those sends may use.",
    )

    class Meta:
        model = Rule
        fields = [
            "name",
            "enabled",
            "segment",
            "channel",
            "match",
            "tag",
            "window_kind",
            "window_seconds",
            "window_unit",
            "limit",
            "reserve_below_priority",
            "reserve_slots",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "channel" in self.fields:
            channel = self.fields["channel"]
            channel.choices = [(s, scope_label(s)) for s in scopes()]  # type: ignore[attr-defined]

    def rule_fields(self) -> RuleFields:
        """The rule as typed; a field that did not parse reads as empty (it has its error)."""
        data = self.cleaned_data
        segment = data.get("segment")
        limit = data.get("limit")
        return RuleFields(
            name=data.get("name") or "",
            segment=segment.slug if segment is not None else None,
            channel=data.get("channel") or "",
            match=data.get("match") or "any",
            tag=data.get("tag") or "",
            window_kind=data.get("window_kind") or "",
            window_seconds=data.get("window_seconds"),
            window_unit=data.get("window_unit") or "",
            limit=INT32_MAX if limit is None else limit,
            reserve_below_priority=data.get("reserve_below_priority"),
            reserve_slots=data.get("reserve_slots"),
            enabled=bool(data.get("enabled")),
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        fields = self.rule_fields()
        slugs = Segment.objects.values_list("slug", flat=True)
        # The one rule for a valid rule, as the REST API and the commands apply it.
        for key, problems in rule_problems(fields, segments=slugs).items():
            field = FORM_FIELD.get(key, key)
            if key == "reserve":
                field = (
                    "reserve_slots" if fields.reserve_slots is None else "reserve_below_priority"
                )
            if field is not None and (field not in self.fields or field in self.errors):
                continue  # already told what is wrong with it
            for problem in problems:
                self.add_error(field, problem)
        return data


class RuleSegmentFilter(admin.RelatedFieldListFilter):
    """By segment; a rule without one is every segment's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_value_display = mark_safe("every segment (its own rules)")  # a constant


class RuleKindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("rule", "rules"), ("classic", "classic caps")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Rule]) -> QuerySet[Rule]:
        if self.value() == "rule":
            return queryset.filter(cap__isnull=True)
        if self.value() == "classic":
            return queryset.filter(cap__isnull=False)
        return queryset


def rule_reading(rule: Rule) -> str:
    name = rule.segment.name if rule.segment is not None else None
    return rule_describe(rule_view(rule), segment_name=name)


def enabled_findings() -> dict[int, list[str]]:
    """What the enabled rules' findings say, per rule id (rules that never decide, reserves
    that shut lower priorities out)."""
    return rules_findings()


def _view_of(data: dict[str, Any]) -> RuleView:
    """A rule as its history keeps it (rule_as_json), read back to be put in words."""
    window, reserve = data.get("window") or {}, data.get("reserve") or {}
    return RuleView(
        id=data.get("id") or 0,
        name=data.get("name", ""),
        segment=data.get("segment"),
        channel=data.get("channel", ""),
        match=data.get("match", "any"),
        tag=data.get("tag") or "",
        window_kind=window.get("kind", "rolling"),
        window_seconds=window.get("seconds"),
        window_unit=window.get("unit") or "",
        limit=data.get("limit", 0),
        reserve_below=reserve.get("below_priority"),
        reserve_slots=reserve.get("slots"),
    )


def _value_words(key: str, value: Any) -> str:
    if key == "window" and value:
        if value.get("kind") == "calendar":
            return f"calendar {value.get('unit')}"
        return f"rolling {duration_words(int(value.get('seconds') or 0))}"
    if key == "reserve":
        return "none" if not value else f"{value['slots']} for priority {value['below_priority']}+"
    if key == "enabled":
        return "yes" if value else "no"
    return "none" if value in (None, "") else str(value)


RULE_FIELDS_SHOWN = (
    "name", "segment", "channel", "match", "tag", "window", "limit", "reserve", "enabled"
)  # fmt: skip


def change_words(change: RuleChange, names: dict[str, str]) -> str:
    """A history line: what the rule became, or which fields changed from what to what.
    `names`: segment names by slug (segment_names())."""
    if change.action == RuleChange.Action.CREATED and change.after:
        view = _view_of(change.after)
        return f"Created: {rule_describe(view, segment_name=names.get(view.segment or ''))}"
    if change.action == RuleChange.Action.DELETED:
        return "Deleted."
    before, after = change.before or {}, change.after or {}
    # In the rule's own order: PostgreSQL's jsonb keeps a record's keys in an order of its own.
    changed = [
        f"{key}: {_value_words(key, before.get(key))} → {_value_words(key, after.get(key))}"
        for key in RULE_FIELDS_SHOWN
        if before.get(key) != after.get(key)
    ]
    return "; ".join(changed) or "Nothing visible changed."


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    form = RuleForm
    list_display_links = ["name"]
    list_filter = [("segment", RuleSegmentFilter), "channel", "match", "enabled", RuleKindFilter]
    search_fields = ["name", "tag"]
    ordering = [F("segment__priority").asc(nulls_first=True), "channel", "id"]
    actions = ["delete_selected", "enable_rules", "disable_rules"]
    change_list_template = "admin/gatekeeper/rule_change_list.html"
    change_form_template = "admin/gatekeeper/rule_change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Rule]:
        return super().get_queryset(request).select_related("segment", "created_by", "changed_by")

    def get_list_display(self, request: HttpRequest) -> Any:
        findings = enabled_findings()

        @admin.display(description="check")
        def check(rule: Rule) -> str:
            if not rule.enabled:
                return "disabled: it decides nothing"
            notes = findings.get(rule.pk, [])
            return format_html_join(
                "", '<div class="gk-badge gk-warn">{}</div>', ((n,) for n in notes)
            )

        return ["name", "reading", "who", "scope", "enabled", "kind", check]

    @admin.display(description="in plain words")
    def reading(self, rule: Rule) -> str:
        return rule_reading(rule)

    @admin.display(description="segment", ordering="segment__priority")
    def who(self, rule: Rule) -> str:
        return rule.segment.name if rule.segment is not None else "every segment"

    @admin.display(description="channel", ordering="channel")
    def scope(self, rule: Rule) -> str:
        return scope_label(rule.channel)

    @admin.display(description="kind")
    def kind(self, rule: Rule) -> str:
        if rule.segment is None or rule.cap_id is None:
            return "rule"
        url = reverse("admin:cap_grid", args=[rule.segment.pk])
        return format_html('classic cap: <a href="{}">change it in the cap grid</a>', url)

    # --- the change form ---

    def get_fieldsets(self, request: HttpRequest, obj: Rule | None = None) -> Any:
        fieldsets: list[tuple[str | None, dict[str, Any]]] = [
            (None, {"fields": ["name", "enabled"]}),
            ("Whose sends, on which channel", {"fields": ["segment", "channel"]}),
            ("What it counts", {"fields": ["match", "tag"]}),
            ("Over which window", {"fields": ["window_kind", "window_seconds", "window_unit"]}),
            ("How many", {"fields": ["limit", "reserve_below_priority", "reserve_slots"]}),
        ]
        if obj is None:
            return fieldsets
        if obj.cap_id is not None:
            # Shown, not edited: the reading says its window; the cap grid changes its limit.
            fieldsets = [(None, {"fields": ["name", "segment", "channel", "limit", "enabled"]})]
        top = ["reading", "findings"] + (["classic_cap"] if obj.cap_id is not None else [])
        return [
            ("At a glance", {"fields": top}),
            *fieldsets,
            ("History", {"fields": ["made", "history"]}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Rule | None = None) -> Any:
        return [] if obj is None else ["reading", "findings", "classic_cap", "made", "history"]

    @admin.display(description="check")
    def findings(self, rule: Rule) -> str:
        if not rule.enabled:
            return "Disabled: it decides nothing until it is enabled again."
        notes = enabled_findings().get(rule.pk, [])
        if not notes:
            return "Nothing to note: it can decide."
        return format_html_join("", '<div class="gk-badge gk-warn">{}</div>', ((n,) for n in notes))

    @admin.display(description="classic cap")
    def classic_cap(self, rule: Rule) -> str:
        if rule.segment is None or rule.cap_id is None:
            return "-"
        url = reverse("admin:cap_grid", args=[rule.segment.pk])
        return format_html(
            'One of the caps of {}: it changes with them, in <a href="{}" class="cap-grid-link">'
            "the cap grid</a>.",
            rule.segment.name,
            url,
        )

    @admin.display(description="created and changed")
    def made(self, rule: Rule) -> str:
        return made_words(rule)

    @admin.display(description="changes")
    def history(self, rule: Rule) -> str:
        return history_table(rule.changes, change_words, table_id="rule-history")

    # --- rights: a classic cap's rule changes only through its cap ---

    def has_change_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        if obj is not None and obj.cap_id is not None:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        if obj is not None and obj.cap_id is not None:
            return False
        return super().has_delete_permission(request, obj)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        rule = self.get_object(request, object_id)
        if rule is not None and rule.cap_id is not None and self.has_view_permission(request, rule):
            messages.error(
                request,
                f"'{rule.name}' is one of a segment's classic caps: it cannot be deleted here. "
                "Empty its cell in the cap grid instead.",
            )
            return HttpResponseRedirect(reverse("admin:limits_rule_change", args=[rule.pk]))
        return super().delete_view(request, object_id, extra_context)

    # --- writes: through the services, so the history records who did it ---

    def save_model(self, request: HttpRequest, obj: Rule, form: Any, change: bool) -> None:
        fields = form.rule_fields()
        if change:
            saved = rule_update(rule=obj, changes=asdict(fields), user=request.user, via="admin")
        else:
            saved = rule_create(fields=fields, user=request.user, via="admin")
        obj.pk, obj.name = saved.pk, saved.name
        messages.info(request, f"It reads: {rule_reading(saved)}.")
        if saved.enabled:
            for note in enabled_findings().get(saved.pk, []):
                messages.warning(request, note)

    def delete_model(self, request: HttpRequest, obj: Rule) -> None:
        rule_delete(rule=obj, user=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        for rule in queryset.select_related("segment"):
            rule_delete(rule=rule, user=request.user, via="admin")

    @admin.action(description="Delete the selected rules", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Rule]) -> Any:
        """Django's own (it asks first), refusing with words rather than a bare 403 when a
        classic cap's rule is among them."""
        classic = list(queryset.filter(cap__isnull=False).values_list("name", flat=True))
        if classic:
            messages.error(
                request,
                f"Nothing was deleted: {', '.join(classic)} "
                f"{'is a classic cap' if len(classic) == 1 else 'are classic caps'}. Empty "
                "their cells in the cap grid instead.",
            )
            return None
        return django_delete_selected(self, request, queryset)

    @admin.action(description="Enable the selected rules", permissions=["change"])
    def enable_rules(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        self._switch(request, queryset, enabled=True)

    @admin.action(description="Disable the selected rules", permissions=["change"])
    def disable_rules(self, request: HttpRequest, queryset: QuerySet[Rule]) -> None:
        self._switch(request, queryset, enabled=False)

    def _switch(self, request: HttpRequest, queryset: QuerySet[Rule], *, enabled: bool) -> None:
        switched, classic, refused = 0, [], []
        for rule in queryset.select_related("segment"):
            try:
                rule_update(rule=rule, changes={"enabled": enabled}, user=request.user)
            except ClassicRule:
                classic.append(rule.name)
            except ValidationError as exc:
                # Stored before a setting changed (a channel removed): fixed on its own page.
                refused.append(f"{rule.name} ({' '.join(exc.messages)})")
            else:
                switched += 1
        word = "Enabled" if enabled else "Disabled"
        messages.success(request, f"{word} {count(switched, 'rule')}.")
        if classic:
            messages.warning(
                request,
                f"Left alone (classic caps change in the cap grid): {', '.join(classic)}.",
            )
        if refused:
            messages.warning(request, f"Left alone: {'; '.join(refused)}.")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        findings = enabled_findings()
        names = dict(Rule.objects.filter(pk__in=findings).values_list("pk", "name"))
        listed = [
            {
                "name": names.get(pk, ""),
                "url": reverse("admin:limits_rule_change", args=[pk]),
                "notes": notes,
            }
            for pk, notes in sorted(findings.items())
        ]
        context = {"title": "Cap rules", "findings": listed, **(extra_context or {})}
        return super().changelist_view(request, context)


@admin.register(RuleChange)
class RuleChangeAdmin(AuditLogAdmin):
    """Every change of every rule, deleted rules' included (a rule's page shows its own)."""

    list_filter = ["action", "via"]
    search_fields = ["rule_name"]

    def get_list_display(self, request: HttpRequest) -> Any:
        names = segment_names()

        @admin.display(description="what")
        def what(change: RuleChange) -> str:
            return change_words(change, names)

        return ["changed_at", "rule_name", "action", what, "changed_by", "via"]


# --- quiet hours -----------------------------------------------------------------------------


# --- the suppression list ----------------------------------------------------------------------
