"""Admin of the suppression list and its journal: users added and removed through
limits.people.suppression (journalled; every worker's gate follows within seconds)."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import (
    NotAWholeNumber,
    WholeNumberField,
    whole_number,
)
from limits.channels import scope_label, scopes
from limits.models.people import Suppression, SuppressionChange
from limits.people.suppression import suppress, unsuppress
from limits.policy.admin.base import AuditLogAdmin


class SuppressionForm(forms.ModelForm):
    """One user put on a channel's list; the user id read by the one rule for whole numbers."""

    channel = forms.ChoiceField(
        choices=lambda: [(scope, scope_label(scope)) for scope in scopes()],
        help_text="“all channels together”: no marketing on any channel.",
    )
    user_id = forms.CharField(label="User id")  # replaced in __init__: the bound is a setting

    class Meta:
        model = Suppression
        fields = ["channel", "user_id", "reason", "note"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user_id"] = WholeNumberField(
            maximum=max_user_id(), what="A user id", label="User id"
        )


@admin.register(Suppression)
class SuppressionAdmin(admin.ModelAdmin):
    """Who gets no marketing on which channel, and why. Search by user id; adding and deleting
    go through limits.people.suppression (journalled, and every worker's gate follows within
    seconds)."""

    form = SuppressionForm
    list_display = ["user_id", "channel", "reason", "source", "note", "created_at", "created_by"]
    list_filter = ["channel", "reason", "source"]
    search_fields = ["=user_id"]
    search_help_text = "A user id (exactly)."
    ordering = ["-id"]
    show_full_result_count = False  # the list may hold millions: no COUNT(*) per page

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # added or removed, never edited: the journal says what happened

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> Any:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            user_id = whole_number(term, maximum=max_user_id(), what="A user id")
        except NotAWholeNumber as exc:
            messages.warning(request, str(exc))
            return queryset.none(), False
        return queryset.filter(user_id=user_id), False

    def save_model(self, request: HttpRequest, obj: Suppression, form: Any, change: bool) -> None:
        suppress(
            channel=obj.channel,
            user_ids=[obj.user_id],
            reason=obj.reason,
            source="admin",
            by=request.user,
            note=obj.note,
        )
        saved = Suppression.objects.get(channel=obj.channel, user_id=obj.user_id)
        obj.pk, obj.reason = saved.pk, saved.reason

    def delete_model(self, request: HttpRequest, obj: Suppression) -> None:
        unsuppress(channel=obj.channel, user_ids=[obj.user_id], source="admin", by=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        per_channel: dict[str, list[int]] = {}
        for channel, user_id in queryset.values_list("channel", "user_id"):
            per_channel.setdefault(channel, []).append(user_id)
        for channel, user_ids in per_channel.items():
            unsuppress(channel=channel, user_ids=user_ids, source="admin", by=request.user)


@admin.register(SuppressionChange)
class SuppressionChangeAdmin(AuditLogAdmin):
    """The suppression list's journal: every user added or removed, by whom, from where."""

    list_display = ["at", "user_id", "channel", "action", "reason", "source", "by"]
    list_filter = ["channel", "action", "source"]
    search_fields = ["=user_id"]
    show_full_result_count = False
