"""The admin site marketers work in: Django's admin, plus the marketing console's pages, which
each app keeps in its `admin_pages` module (URLs and index links):

- worker: the dashboard, the what-if;
- limits: looking up a user (with the audited quota reset), a segment's cap grid;
- segments: snapshots (build and publish, make live) and a build's progress.

Every page's context has the banner of the mailbox providers the brake paused
(worker/mailbox_banner.py), shown by the index, the dashboard and the providers' list.

Every page checks a Django permission (gatekeeper/lib/groups.py), so a staff user without a
group sees none of them.
"""

from functools import partial
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse

from limits import admin_pages as limits_pages
from segments import admin_pages as segments_pages
from worker import admin_pages as worker_pages
from worker.mailbox_banner import mailbox_banner

APPS = (worker_pages, segments_pages, limits_pages)  # in the order of the index's links


class GatekeeperAdminSite(admin.AdminSite):
    site_header = "Gatekeeper"
    site_title = "Gatekeeper"
    index_title = "Caps, segments and sends"
    index_template = "admin/gatekeeper/index.html"

    def get_urls(self) -> list[Any]:
        return [*(url for app in APPS for url in app.urls(self)), *super().get_urls()]

    def console_links(self, request: HttpRequest) -> list[dict[str, str]]:
        return [
            {"title": link.title, "url": reverse(f"admin:{link.url_name}"), "help": link.help}
            for app in APPS
            for link in app.LINKS
            if request.user.has_perm(link.perm)
        ]

    def each_context(self, request: HttpRequest) -> dict[str, Any]:
        # Read by the pages that show the banner only (a template calls it): no query on others.
        return {**super().each_context(request), "mailbox_banner": partial(mailbox_banner, request)}

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**(extra_context or {}), "console": self.console_links(request)}
        return super().index(request, context)
