"""Admin of erasures (limits/privacy/erasure.py): who asked, when, how many, how far each got;
never whom. Made from the user lookup ("Erase this person everywhere") or over REST, never
written or deleted here."""

from typing import Any

from django.contrib import admin

from limits.models.privacy import Erasure
from limits.policy.admin.base import AuditLogAdmin
from limits.privacy.erasure import erasure_progress


@admin.register(Erasure)
class ErasureAdmin(AuditLogAdmin):
    list_display = ["id", "requested_at", "requested_by", "via", "count", "status", "progress"]
    list_filter = ["status", "via"]
    readonly_fields = fields = (
        "requested_at", "requested_by", "via", "count", "status", "progress", "removed",
        "waiting", "passes", "finished_at",
    )  # fmt: skip

    @admin.display(description="progress")
    def progress(self, erasure: Erasure) -> str:
        return f"{erasure_progress(erasure):.0f} %"

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).select_related("requested_by")
