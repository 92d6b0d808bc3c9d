"""What the limits app's admin pages share: the read-only audit-log admin, segment names, and
an authored record's "created and changed" line and history table."""

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

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


def history_table(
    changes: Any, words: Callable[[Any, dict[str, str]], str], *, table_id: str
) -> str:
    """The last 50 changes of a rule or quiet-hours entry as a table, each read out by `words`."""
    recent = changes.select_related("changed_by")[:50]
    if not recent:
        return "No changes recorded."
    names = segment_names()
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (f"{c.changed_at:%Y-%m-%d %H:%M:%S}", c.changed_by or "-", c.via, words(c, names))
            for c in recent
        ),
    )
    return format_html(
        '<table class="gk-table" id="{}"><thead><tr><th>When (UTC)</th>'
        "<th>Who</th><th>Via</th><th>What</th></tr></thead><tbody>{}</tbody></table>",
        table_id,
        rows,
    )
