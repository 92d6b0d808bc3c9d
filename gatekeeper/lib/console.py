"""The marketing console: the admin pages that are not one model's. Each app keeps its own
(`<app>/admin_pages.py`: its URLs and its links on the admin index); the admin site
(gatekeeper/admin_site.py) lists them. This is what the pages share.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path


@dataclass(frozen=True)
class ConsoleLink:
    """A console page's entry on the admin index, shown to users with `perm`."""

    title: str
    url_name: str
    perm: str
    help: str


def page(site: AdminSite, route: str, view: Callable[..., Any], name: str) -> URLPattern:
    """A console page at `route` under the admin, as the site's logged-in, staff-only view;
    `view(request, site=..., **kwargs)`."""
    return path(route, site.admin_view(partial(view, site=site)), name=name)


def require(request: HttpRequest, *perms: str) -> None:
    """Every console page checks the Django permissions of what it shows or changes."""
    if not request.user.has_perms(perms):
        raise PermissionDenied


def render(
    request: HttpRequest, site: AdminSite, template: str, title: str, **context: Any
) -> TemplateResponse:
    return TemplateResponse(
        request,
        f"admin/gatekeeper/{template}",
        {**site.each_context(request), "title": title, **context},
    )


def ago(seconds: float) -> str:
    """A duration in words: "45 s", "12 min", "3 h 5 min", "2 days 4 h"."""
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} days {seconds % 86400 // 3600} h"
