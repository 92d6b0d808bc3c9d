"""Admin of the global control group: one page (the list goes straight to it), a form checked
by the one rule (limits.policy.holdout.holdout_problems), saved through `holdout_set` so the change
is recorded and said in words, with a link to its result (the experiments admin's page: what
marketing brings against no marketing at all); its history read only."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from gatekeeper.lib.permissions import VIEW_STUDIES
from limits.models.policy import Holdout
from limits.policy.holdout import HoldoutFields, holdout_problems, holdout_read, holdout_set
from segments.models import Segment


class HoldoutForm(forms.ModelForm):
    share = forms.FloatField(
        min_value=0,
        max_value=0.2,
        help_text="The share of users who get no marketing at all: 0.001 (0.1 %) to 0.2 "
        "(20 %), 0 for no group. Growing it keeps everyone held out still out; shrinking it "
        "lets some back.",
    )
    exclude_segments = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Their users are never held out.",
    )
    exclude_tags = forms.CharField(
        required=False,
        help_text="Sends carrying one of these tags (comma-separated) are never held back.",
    )

    class Meta:
        model = Holdout
        fields = ["share", "salt", "exclude_segments", "exclude_tags"]
        help_texts = {"salt": "What the group is drawn from. A new salt draws a new group."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        segments = list(Segment.objects.values_list("slug", "name"))
        self.fields["exclude_segments"].choices = segments  # type: ignore[attr-defined]
        if self.instance.pk:
            self.initial["exclude_tags"] = ", ".join(self.instance.exclude_tags or [])

    def holdout_fields(self) -> HoldoutFields:
        data = self.cleaned_data
        tags = [t.strip() for t in (data.get("exclude_tags") or "").split(",") if t.strip()]
        return HoldoutFields(
            share=float(data.get("share") or 0),
            salt=data.get("salt") or "",
            exclude_segments=list(data.get("exclude_segments") or []),
            exclude_tags=tags,
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        segments = Segment.objects.values_list("slug", flat=True)
        for name, problems in holdout_problems(self.holdout_fields(), segments=segments).items():
            field = name.split(".")[0]
            if field in self.errors:
                continue
            for problem in problems:
                self.add_error(field if field in self.fields else None, problem)
        return data


@admin.register(Holdout)
class HoldoutAdmin(admin.ModelAdmin):
    form = HoldoutForm
    change_form_template = "admin/gatekeeper/holdout_change_form.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        holdout_read()  # made when never set
        return HttpResponseRedirect(reverse("admin:limits_holdout_change", args=[1]))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Its page, with a link to its result for whoever may read experiments' results."""
        context = dict(extra_context or {})
        if request.user.has_perms(VIEW_STUDIES):
            context["report_url"] = reverse("admin:limits_holdout_report")
        return super().change_view(request, object_id, form_url, context)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        _, words = holdout_set(
            form.holdout_fields(),
            segments=Segment.objects.values_list("slug", flat=True),
            via="admin",
            by=request.user,
        )
        messages.info(request, words)
