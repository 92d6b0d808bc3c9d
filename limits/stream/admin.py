"""Admin of the event stream's webhook endpoints (limits/stream/webhooks.py): made and changed on
a form checked by the one rule for endpoints, listed with how their deliveries go (a failing or
paused one stands out), each with its last attempts; paused, resumed and given a new secret by
an action. Deliveries are a record: read, never written here."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from limits.channels import channels, noun
from limits.models.stream import WebhookDelivery, WebhookEndpoint
from limits.stream.events import EVENT_TYPES
from limits.stream.webhooks import (
    WebhookFields,
    webhook_change,
    webhook_create,
    webhook_delete,
    webhook_lag,
    webhook_problems,
)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class WebhookForm(forms.ModelForm):
    types = forms.MultipleChoiceField(
        choices=[(t, t) for t in EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The events it gets. None ticked: every type.",
    )
    channels = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Only these channels' events (suppressions of every channel and preference "
        "changes too). None ticked: every channel.",
    )
    campaigns = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Only these campaigns' decisions, outcomes and dead addresses, one a line. "
        "Empty: any.",
    )
    start = forms.ChoiceField(
        choices=[("end", "With what comes next"), ("0", "With everything the stream keeps")],
        initial="end",
        required=False,
        help_text="Where its deliveries start (a new endpoint).",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "description", "types", "channels", "campaigns"]
        help_texts = {
            "url": "Where the events are POSTed, signed (Standard Webhooks): http or https.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["channels"].choices = [(c, noun(c, 2)) for c in channels()]  # type: ignore[attr-defined]
        if self.instance.pk:
            self.fields.pop("start")
            self.initial["campaigns"] = "\n".join(self.instance.campaigns)

    def typed(self) -> WebhookFields:
        data = self.cleaned_data
        return WebhookFields(
            url=(data.get("url") or "").strip(),
            description=data.get("description") or "",
            types=tuple(data.get("types") or ()),
            channels=tuple(data.get("channels") or ()),
            campaigns=tuple(_lines(data.get("campaigns") or "")),
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for field, problems in webhook_problems(self.typed()).items():
            if field in self.fields and field not in self.errors:
                for problem in problems:
                    self.add_error(field, problem)
        return data


class DeliveryInline(admin.TabularInline):
    model = WebhookDelivery
    fields = readonly_fields = ("at", "message_id", "events", "ok", "status_code", "error",
                                "milliseconds")  # fmt: skip
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ["-id"]
    verbose_name_plural = "last deliveries (kept a week)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDelivery]:
        # The last 20 (a slice cannot be filtered further: by id instead).
        ids = list(super().get_queryset(request).order_by("-id").values_list("id", flat=True)[:20])
        return WebhookDelivery.objects.filter(id__in=ids).order_by("-id")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookForm
    list_display = ["url", "description", "state_shown", "delivered", "behind", "last_success_at",
                    "last_error"]  # fmt: skip
    list_filter = ["state"]
    readonly_fields = ("state", "secret", "position", "delivered", "failures", "failing_since",
                       "next_at", "last_error", "last_success_at", "created_at", "created_by")  # fmt: skip
    inlines = [DeliveryInline]
    actions = ["pause", "resume", "new_secret"]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        main = ["url", "description", "types", "channels", "campaigns"]
        if obj is None:
            return [(None, {"fields": [*main, "start"]})]
        return [
            (None, {"fields": main}),
            ("Deliveries", {"fields": list(self.readonly_fields)}),
        ]

    @admin.display(description="state", ordering="state")
    def state_shown(self, endpoint: WebhookEndpoint) -> str:
        if endpoint.state == WebhookEndpoint.State.FAILING:
            return format_html("<strong>{}</strong>", endpoint.get_state_display())
        if endpoint.failures:
            return f"active, retrying ({endpoint.failures} failed in a row)"
        return str(endpoint.get_state_display())

    @admin.display(description="batches behind")
    def behind(self, endpoint: WebhookEndpoint) -> int:
        return webhook_lag(endpoint)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        # Through the one write path, so every change is in the history with who made it.
        fields = form.typed()
        if change:
            saved = webhook_change(obj, fields=fields, by=request.user, via="admin")
        else:
            start = form.cleaned_data.get("start") or "end"
            saved = webhook_create(fields=fields, by=request.user, start=start, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        webhook_delete(obj, by=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_delete(endpoint, by=request.user, via="admin")

    @admin.action(description="Pause the selected endpoints", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_change(endpoint, active=False, by=request.user, via="admin")
        self.message_user(request, f"{queryset.count()} paused.", messages.SUCCESS)

    @admin.action(
        description="Resume the selected endpoints (from where they stopped)",
        permissions=["change"],
    )
    def resume(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_change(endpoint, active=True, by=request.user, via="admin")
        self.message_user(request, f"{queryset.count()} resumed.", messages.SUCCESS)

    @admin.action(description="Give the selected endpoints a new secret", permissions=["change"])
    def new_secret(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_change(endpoint, new_secret=True, by=request.user, via="admin")
        self.message_user(
            request,
            f"{queryset.count()} signed with a new secret from now on: give it to the receiver.",
            messages.WARNING,
        )
