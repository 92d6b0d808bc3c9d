"""The limits app's console pages as the admin site finds them: their URLs and the index's
links. The pages are their wings': a segment's cap grid (limits/policy/pages.py), a user's
lookup with the audited quota reset (limits/people/pages.py), the person's export as a file and
their erasure (limits/privacy/pages.py); the cap rules and the quiet hours are limits.admin's."""

from django.contrib.admin import AdminSite
from django.urls import URLPattern

from gatekeeper.lib.console import ConsoleLink, page
from limits.people.pages import quota_reset, user_lookup
from limits.policy.pages import cap_grid
from limits.privacy.pages import person_download, person_erase

LINKS = [
    ConsoleLink(
        "Look up a user",
        "user_lookup",
        "limits.view_cap",
        "A user's segment, quota and recent sends.",
    ),
    ConsoleLink(
        "Cap rules",
        "limits_rule_changelist",
        "limits.view_rule",
        "Every rule in plain words, and the ones that never decide.",
    ),
    ConsoleLink(
        "Quiet hours",
        "limits_quiethours_changelist",
        "limits.view_quiethours",
        "When each segment gets no marketing, on the user's own clock.",
    ),
]  # the grid is reached from each segment


def urls(site: AdminSite) -> list[URLPattern]:
    return [
        page(site, "segments/segment/<int:segment_id>/caps/", cap_grid, "cap_grid"),
        page(site, "users/", user_lookup, "user_lookup"),
        page(site, "users/<int:user_id>/reset/", quota_reset, "quota_reset"),
        page(site, "users/<int:user_id>/export/", person_download, "person_export"),
        page(site, "users/<int:user_id>/erase/", person_erase, "person_erase"),
    ]
