"""What the limits app's admin pages share: the read-only audit-log admin, segment names, and
`AuthoredAdmin`, the admin of an authored kind (limits/policy/authored.py): its segment and channel
columns, the "created and changed" line and the history table, writes through the kind (so the
history records who did it), and the enable/disable actions."""

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, ClassVar
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.words import count
from limits.channels import scope_label
from limits.policy.authored import AuthoredKind
from segments.models import Segment


class AuditLogAdmin(admin.ModelAdmin):
    """A record of what was done: read, never written or deleted in the admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def segment_names() -> dict[str, str]:
    return dict(Segment.objects.values_list("slug", "name"))


def made_words(row: Any) -> str:
    """Who created a rule or quiet-hours entry and who changed it last, and when."""
    return (
        f"Created {row.created_at:%Y-%m-%d %H:%M} UTC by {row.created_by or 'nobody known'}; "
        f"last changed {row.changed_at:%Y-%m-%d %H:%M} UTC by "
        f"{row.changed_by or 'nobody known'}."
    )


def history_url(kind: str, object_id: int | None = None) -> str:
    """The one history page (limits/policy/admin/history.py) filtered to a kind, and to one
    object of it when given."""
    query: dict[str, Any] = {"kind__exact": kind}
    if object_id is not None:
        query["object_id"] = object_id
    return f"{reverse('admin:limits_settingchange_changelist')}?{urlencode(query)}"


def history_table(
    changes: Any, words: Callable[[Any, dict[str, str]], str], *, table_id: str, link: str
) -> str:
    """The last 50 changes of a rule or quiet-hours entry as a table, each read out by `words`,
    and a link to all of them on the history page."""
    recent = changes.select_related("by")[:50]
    every = format_html('<p><a href="{}">Every change on the history page</a></p>', link)
    if not recent:
        return format_html("No changes recorded.{}", every)
    names = segment_names()
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((f"{c.at:%Y-%m-%d %H:%M:%S}", c.by or "-", c.via, words(c, names)) for c in recent),
    )
    return format_html(
        '<table class="gk-table" id="{}"><thead><tr><th>When (UTC)</th>'
        "<th>Who</th><th>Via</th><th>What</th></tr></thead><tbody>{}</tbody></table>{}",
        table_id,
        rows,
        every,
    )


class AuthoredAdmin(admin.ModelAdmin):
    """The admin of an authored kind. A subclass names it (`authored`), the id of its history table,
    its form (whose `authored_fields()` gives the kind's fields as typed) and how a row reads
    (`reading_of`); it may add what is its own (a rule's findings) in `after_save`."""

    authored: ClassVar[AuthoredKind[Any, Any]]
    history_id: ClassVar[str]
    # Why the actions leave alone a row the kind's guard refuses (a Conflict), in words.
    guarded: ClassVar[str] = ""
    counted: ClassVar[tuple[str, str]]  # a row and rows, as the actions count them
    actions = ["delete_selected", "enable_selected", "disable_selected"]

    def reading_of(self, row: Any) -> str:
        raise NotImplementedError

    def after_save(self, request: HttpRequest, row: Any) -> None:
        """What to tell after a save besides how the row reads."""

    def with_segment(self, rows: QuerySet[Any]) -> QuerySet[Any]:
        """`rows` with their segment, for a kind whose rows have one (topics have none)."""
        if any(f.name == "segment" for f in self.model._meta.get_fields()):
            return rows.select_related("segment")
        return rows

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request).select_related("created_by", "changed_by")
        return self.with_segment(rows)

    @admin.display(description="in plain words")
    def reading(self, row: Any) -> str:
        return self.reading_of(row)

    @admin.display(description="segment", ordering="segment__priority")
    def who(self, row: Any) -> str:
        return row.segment.name if row.segment is not None else "every segment"

    @admin.display(description="channel", ordering="channel")
    def scope(self, row: Any) -> str:
        return scope_label(row.channel)

    @admin.display(description="created and changed")
    def made(self, row: Any) -> str:
        return made_words(row)

    @admin.display(description="changes")
    def history(self, row: Any) -> str:
        return history_table(
            self.authored.changes(row.pk),
            self.authored.change_words,
            table_id=self.history_id,
            link=history_url(self.authored.kind, row.pk),
        )

    # --- writes: through the kind, so the history records who did it ---

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        fields = form.authored_fields()
        if change:
            # The stored row, not `obj`: the form has put the typed text in its fields.
            stored = self.with_segment(self.model._default_manager.all()).get(pk=obj.pk)
            saved = self.authored.update(
                row=stored, changes=asdict(fields), user=request.user, via="admin"
            )
        else:
            saved = self.authored.create(fields=fields, user=request.user, via="admin")
        obj.pk = saved.pk
        obj.refresh_from_db()  # as stored, for the admin's messages and log
        messages.info(request, f"It reads: {self.reading_of(saved)}.")
        self.after_save(request, saved)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.authored.delete(row=obj, user=request.user, via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for row in self.with_segment(queryset):
            self.authored.delete(row=row, user=request.user, via="admin")

    @admin.action(description="Enable the selected %(verbose_name_plural)s", permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._switch(request, queryset, enabled=True)

    @admin.action(
        description="Disable the selected %(verbose_name_plural)s", permissions=["change"]
    )
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._switch(request, queryset, enabled=False)

    def _switch(self, request: HttpRequest, queryset: QuerySet[Any], *, enabled: bool) -> None:
        switched, guarded, refused = 0, [], []
        for row in self.with_segment(queryset):
            try:
                self.authored.update(
                    row=row, changes={"enabled": enabled}, user=request.user, via="admin"
                )
            except Conflict:
                guarded.append(str(row))
            except ValidationError as exc:
                # Stored before a setting changed (a channel removed): fixed on its own page.
                refused.append(f"{row} ({' '.join(exc.messages)})")
            else:
                switched += 1
        word = "Enabled" if enabled else "Disabled"
        messages.success(request, f"{word} {count(switched, *self.counted)}.")
        if guarded:
            messages.warning(request, f"Left alone ({self.guarded}): {', '.join(guarded)}.")
        if refused:
            messages.warning(request, f"Left alone: {'; '.join(refused)}.")
