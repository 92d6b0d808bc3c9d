"""Admin for send jobs: progress and counts, read-only."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from worker.models import SendJob


@admin.register(SendJob)
class SendJobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "campaign",
        "channel",
        "tags_shown",
        "priority",
        "status",
        "progress",
        "total",
        "sent",
        "failed",
        "capped",
        "ambiguous",
        "duplicate",
        "invalid",
        "pending",
        "created_at",
    ]
    list_filter = ["status", "channel", "priority"]
    readonly_fields = [*(f.name for f in SendJob._meta.fields), "pending"]

    @admin.display(description="tags")
    def tags_shown(self, job: SendJob) -> str:
        return ", ".join(job.tags) or "-"

    @admin.display(description="pending")
    def pending(self, job: SendJob) -> int:
        return job.pending

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
