"""The admin's banner while the brake has paused a mailbox provider: which group, the figures
the brake read, since when, the email waiting, and a Resume button for those who may change
the group. The admin site puts it in every page's context (gatekeeper/admin_site.py), read
only by the pages that show it (the index, the dashboard, the mailbox providers)."""

from typing import Any

from django.http import HttpRequest

from gatekeeper.lib.permissions import CHANGE_MAILBOX_PROVIDERS, VIEW_MAILBOX_PROVIDERS
from worker.delivery.mailbox_reads import paused_groups


def mailbox_banner(request: HttpRequest) -> dict[str, Any] | None:
    """{"groups": the paused groups (worker.delivery.mailbox_reads.paused_groups), "can_resume"};
    None when none is paused or the user may not see the groups."""
    user = getattr(request, "user", None)
    if user is None or not user.is_active or not user.has_perms(VIEW_MAILBOX_PROVIDERS):
        return None
    groups = paused_groups()
    if not groups:
        return None
    return {
        "groups": groups,
        "can_resume": user.has_perms(CHANGE_MAILBOX_PROVIDERS),
        "back": request.get_full_path(),
    }
