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
        "status",
        "progress",
        "total",
        "sent",
        "failed",
        "created_at",
    ]
    list_filter = ["status", "channel"]
    readonly_fields = [f.name for f in SendJob._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
