"""Admin of the classic caps (saved through `cap_set` and deleted through `cap_delete`, which
record every change in the one history) and the audit log of quota resets."""

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from gatekeeper.lib.integers import (
    INT32_MAX,
    WholeNumberField,
)
from limits.models.policy import Cap, QuotaReset
from limits.policy.admin.base import AuditLogAdmin
from limits.policy.services import cap_delete, cap_describe, cap_set, cap_warnings


@admin.register(Cap)
class CapAdmin(admin.ModelAdmin):
    list_display = ["segment", "channel", "daily", "weekly", "reading", "warning"]
    list_filter = ["segment", "channel"]
    ordering = ["segment__priority", "channel"]

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name in ("daily", "weekly"):
            # The one rule for whole numbers, as in the cap grid and the REST API.
            return WholeNumberField(
                maximum=INT32_MAX,
                what=db_field.name,
                required=False,
                label=db_field.name.capitalize(),
                help_text=db_field.help_text,
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description="in plain words")
    def reading(self, cap: Cap) -> str:
        return cap_describe(channel=cap.channel, daily=cap.daily, weekly=cap.weekly)

    @admin.display(description="check")
    def warning(self, cap: Cap) -> str:
        return " ".join(cap_warnings(daily=cap.daily, weekly=cap.weekly))

    def save_model(self, request: HttpRequest, obj: Cap, form: Any, change: bool) -> None:
        # Through the service, so every change is recorded with who made it.
        saved = cap_set(
            segment=obj.segment,
            channel=obj.channel,
            daily=obj.daily,
            weekly=obj.weekly,
            user=request.user,
            via="admin",
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: Cap) -> None:
        cap_delete(obj, user=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Cap]) -> None:
        for cap in queryset:
            cap_delete(cap, user=request.user, via="admin")


@admin.register(QuotaReset)
class QuotaResetAdmin(AuditLogAdmin):
    """The audit log of quota resets (made from "Look up a user")."""

    list_display = ["reset_at", "user_id", "segment_slug", "usage", "reason", "reset_by"]
    list_filter = ["segment_slug"]
    search_fields = ["=user_id", "reason"]
