"""Seed a demo on the first start of `make run`, so a newcomer sees something real at once."""

import io
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db import transaction

from gatekeeper.lib.groups import MARKETER, VIEWER
from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
from limits.channels import scopes
from limits.rules import RuleFields
from limits.services import RULES, cap_set
from segments.index import refresh
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import
from worker.chunks import send_chunk_run
from worker.delivery.local import NullDispatcher
from worker.gate import gate_check
from worker.services import send_job_create
from worker.stats import flush

DEMO_SEGMENTS = [
    # slug, name, priority, {scope: (daily, weekly)}
    ("vip", "VIP riders", 10, {"email": (2, 5), "push": (3, 10), "all": (4, 12)}),
    ("active", "Active riders", 20, {"email": (1, 4), "push": (2, 7), "all": (3, 9)}),
    ("new", "New sign-ups", 30, {"email": (1, 3), "push": (1, 3), "all": (2, 5)}),
    ("dormant", "Dormant", 40, {"email": (1, 2), "push": (0, 0), "all": (1, 2)}),
]
DEFAULT_CAPS = {"email": (1, 3), "push": (1, 3), "all": (2, 4)}
# Rules beyond the classic caps: name, segment, channel, match, tag, window, limit, reserve.
DEMO_RULES = [
    ("1 promo a day", None, "all", "tag", "promo", ("calendar", "day"), 1, None),
    ("One push per campaign a week", None, "push", "campaign", "", ("calendar", "week"), 1, None),
    ("4 hours between pushes", "vip", "push", "any", "", ("rolling", 4 * 3600), 1, None),
    ("At most 2 texts a week", None, "sms", "any", "", ("calendar", "week"), 2, None),
    (
        "VIP: 10 a month, 2 kept for priority 8+",
        "vip",
        "all",
        "any",
        "",
        ("calendar", "month"),
        10,
        (8, 2),
    ),
]
DEMO_USERS = 200_000
DEMO_USER = "marketer"
DEMO_VIEWER = "viewer"
DEMO_SERVICE = "campaigns"
DEMO_PASSWORD = "gatekeeper-demo"


class Command(BaseCommand):
    help = (
        "Create demo segments, caps and a marketer login, unless the database already has segments."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if Segment.objects.filter(is_default=False).exists():
            self.stdout.write("Demo data already there; nothing seeded.")
            return
        with transaction.atomic():
            for slug, name, priority, caps in DEMO_SEGMENTS:
                segment = Segment.objects.create(
                    slug=slug,
                    name=name,
                    priority=priority,
                    time_zone="Asia/Singapore" if slug == "vip" else "",
                )
                for scope, (daily, weekly) in caps.items():
                    cap_set(
                        segment=segment, channel=scope, daily=daily, weekly=weekly, via="command"
                    )
            default = Segment.objects.get(is_default=True)
            for scope, (daily, weekly) in DEFAULT_CAPS.items():
                cap_set(segment=default, channel=scope, daily=daily, weekly=weekly, via="command")
            for name, segment_slug, channel, match, tag, window, limit, reserve in DEMO_RULES:
                if channel not in scopes():
                    continue  # GATEKEEPER_CHANNELS leaves it out here
                kind, size = window
                RULES.create(
                    fields=RuleFields(
                        name=name,
                        segment=segment_slug,
                        channel=channel,
                        match=match,
                        tag=tag,
                        window_kind=kind,
                        window_seconds=size if kind == "rolling" else None,  # type: ignore[arg-type]
                        window_unit=size if kind == "calendar" else "",  # type: ignore[arg-type]
                        limit=limit,
                        reserve_below_priority=reserve[0] if reserve else None,
                        reserve_slots=reserve[1] if reserve else None,
                    ),
                    via="command",
                )
            rng = np.random.default_rng(2026)
            for slug, share in (("vip", 0.05), ("active", 0.35), ("new", 0.15), ("dormant", 0.25)):
                # Overlapping random lists, so the build has overlaps to resolve by priority.
                ids = rng.choice(DEMO_USERS, int(DEMO_USERS * share), replace=False)
                body = ("user_id\n" + "\n".join(map(str, ids.tolist())) + "\n").encode()
                user_list_import(
                    segment=Segment.objects.get(slug=slug),
                    fileobj=io.BytesIO(body),
                    name=f"{slug}-demo.txt",
                )
            User = get_user_model()
            for username, group in ((DEMO_USER, MARKETER), (DEMO_VIEWER, VIEWER)):
                if not User.objects.filter(username=username).exists():
                    # Staff in a group, not superusers: the demo shows what a marketer sees.
                    user = User.objects.create_user(
                        username, f"{username}@example.com", DEMO_PASSWORD, is_staff=True
                    )
                    user.groups.add(Group.objects.get(name=group))
            if not User.objects.filter(username=DEMO_SERVICE).exists():
                # The campaign system's account: calls the gate over REST, no admin login.
                service = User.objects.create_user(DEMO_SERVICE)
                service.set_unusable_password()
                service.save()
                service.user_permissions.add(
                    *(
                        Permission.objects.get(content_type__app_label=app, codename=codename)
                        for app, codename in (p.split(".") for p in CAMPAIGN_SYSTEM)
                    )
                )
        build = build_run(build_id=build_start(queue=False).pk)
        self.stdout.write(
            f"Published snapshot {build.version} with {build.total_users:,} users in lists."
        )
        self._first_sends()
        self._finished_job()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo seeded. Admin: http://127.0.0.1:8000/admin/  "
                f"login {DEMO_USER} / {DEMO_PASSWORD} (Marketer; {DEMO_VIEWER} / "
                f"{DEMO_PASSWORD} is read-only)"
            )
        )

    def _first_sends(self) -> None:
        """Gate a first campaign per channel so the dashboard has something to show."""

        refresh()
        rng = np.random.default_rng(7)
        for channel in ("email", "push"):
            users = rng.choice(DEMO_USERS + 50_000, 20_000, replace=False).tolist()
            for round_ in range(2):
                requests = [(u, f"demo-{channel}-{round_}:{u}") for u in users]
                for start in range(0, len(requests), 1000):
                    gate_check(
                        channel=channel,
                        requests=requests[start : start + 1000],
                        campaign=f"demo-{channel}-{round_}",
                    )
        flush()
        self.stdout.write("Gated two demo campaigns per channel (see the dashboard).")

    def _finished_job(self) -> None:
        """One finished send job, so the send-job pages show what a campaign looks like: 2,000
        push recipients (some capped by the demo campaigns, three with tokens that cannot be
        sent to, skipped as invalid), delivered to no one (the null push backend)."""

        rng = np.random.default_rng(11)
        users = rng.choice(DEMO_USERS, 2_000, replace=False).tolist()
        recipients = [{"user_id": u, "address": f"demo-push-token-{u}"} for u in users]
        for row in (5, 500, 1500):
            recipients[row]["address"] = "not a token"
        job = send_job_create(
            channel="push",
            campaign="demo-welcome",
            template="welcome",
            recipients=recipients,
            on_invalid="skip",
            queue=False,
        )
        for chunk_id in job.chunks.order_by("pk").values_list("pk", flat=True):
            send_chunk_run(chunk_id=chunk_id, dispatcher=NullDispatcher())
        job.refresh_from_db()
        self.stdout.write(
            f"Ran demo send job #{job.pk}: {job.sent:,} sent, {job.capped:,} capped, "
            f"{job.invalid:,} invalid (see Send jobs)."
        )
