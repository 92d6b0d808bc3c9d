"""Admin of cap rules: a form checked by the one rule for a valid rule, rules read out in plain
words, their history, the findings a marketer should see (rules that never decide, reserves that
shut sends out), and writes through the rules' authored kind (`RULES.create`, `.update`,
`.delete` in limits/policy/services.py; a classic cap's rule changes only with its cap)."""

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
from limits.channels import scope_label, scopes
from limits.models.policy import Rule
from limits.policy.admin.base import AuthoredAdmin
from limits.policy.rules import (
    NotADuration,
    RuleFields,
    duration_from_text,
    duration_words,
    rule_describe,
    rule_problems,
)
from limits.policy.selectors import rule_view, rules_findings
from limits.policy.services import RULES
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

    def authored_fields(self) -> RuleFields:
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
        fields = self.authored_fields()
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


@admin.register(Rule)
class RuleAdmin(AuthoredAdmin):
    authored = RULES
    history_id = "rule-history"
    counted = ("rule", "rules")
    guarded = "classic caps change in the cap grid"
    form = RuleForm
    list_display_links = ["name"]
    list_filter = [("segment", RuleSegmentFilter), "channel", "match", "enabled", RuleKindFilter]
    search_fields = ["name", "tag"]
    ordering = [F("segment__priority").asc(nulls_first=True), "channel", "id"]
    change_list_template = "admin/gatekeeper/rule_change_list.html"
    change_form_template = "admin/gatekeeper/rule_change_form.html"

    def reading_of(self, rule: Rule) -> str:
        return rule_reading(rule)

    def after_save(self, request: HttpRequest, rule: Rule) -> None:
        if rule.enabled:
            for note in enabled_findings().get(rule.pk, []):
                messages.warning(request, note)

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


# --- quiet hours -----------------------------------------------------------------------------


# --- the suppression list ----------------------------------------------------------------------
