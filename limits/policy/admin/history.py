"""The one history page of every setting (SettingChange, written by the one write path:
limits/policy/authored.py): caps, rules, quiet hours, topics, the control group, experiments
and webhook endpoints, newest first, filtered by kind, action, who, via and date, searched by
what a change was about and its words. Read, never written. Each kind's page links here,
filtered to its own (`history_url`)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from limits.models.policy import SettingChange
from limits.policy.admin.base import AuditLogAdmin


class ByFilter(admin.SimpleListFilter):
    """Who made the changes: the people who made any, or nobody known (a command)."""

    title = "who"
    parameter_name = "by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        people = (
            SettingChange.objects.filter(by__isnull=False)
            .values_list("by_id", "by__username")
            .distinct()
            .order_by("by__username")
        )
        return [(str(pk), name) for pk, name in people] + [("none", "nobody known")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value == "none":
            return queryset.filter(by__isnull=True)
        if value and value.isdigit():
            return queryset.filter(by_id=int(value))
        return queryset


@admin.register(SettingChange)
class SettingChangeAdmin(AuditLogAdmin):
    """Every change of every setting, deleted objects' included."""

    list_display = ["at", "kind", "object_label", "action", "words", "by", "via"]
    list_filter = ["kind", "action", ByFilter, "via", "at"]
    search_fields = ["object_label", "words"]
    date_hierarchy = "at"
    list_select_related = ["by"]
