"""Seed a demo on the first start of `make run`, so a newcomer sees something real at once.

Everything goes through the product's own write paths (the REST API's and the admin's), never
rows written by hand: segments, caps and rules; topics; people's preferences (an import, as a
company brings them from another tool); user lists and a published snapshot; a running cap
experiment, a newsletter that brings users into it and outcome events from them; demo campaigns
through the gate; a finished send job; two scheduled jobs, one reserving its slots, and their
plan."""

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from gatekeeper.lib.groups import MARKETER, VIEWER
from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
from limits.channels import channels, scopes
from limits.engine.topics import TopicFields
from limits.ledger.drain import ledger_drain_all
from limits.models.studies import StudyMember
from limits.people.preferences_import import preferences_import
from limits.policy.rules import RuleFields
from limits.policy.selectors import policy_cache
from limits.policy.services import RULES, TOPICS, cap_set
from limits.studies.experiments import ArmFields, ExperimentFields, experiment_create
from limits.studies.measures import Event, events_record
from segments.index import refresh
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import
from worker.chunks import send_chunk_run
from worker.delivery.local import NullDispatcher
from worker.gate import gate_check
from worker.models import SendJob
from worker.plan import plan_latest, plan_refresh
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
# slug, name, channels (none: every channel), default
DEMO_TOPICS = [
    ("offers", "Offers and promotions", [], "subscribed"),
    ("product-news", "Product news", ["email", "push"], "subscribed"),
    ("partner-offers", "Our partners' offers", ["email"], "unsubscribed"),
    ("safety", "Safety notices", [], "required"),
]
DEMO_PREFERENCES = 2_000  # people whose preferences are imported
DEMO_EVENTS = 400  # outcome events posted for the experiment's users
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
            for slug, name, topic_channels, topic_default in DEMO_TOPICS:
                TOPICS.create(
                    fields=TopicFields(
                        slug=slug,
                        name=name,
                        channels=[c for c in topic_channels if c in channels()],
                        default=topic_default,
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
        self._preferences()
        experiment = self._experiment()
        self._experiment_sends()
        self._outcomes(experiment)
        self._first_sends()
        self._finished_job()
        self._scheduled_jobs()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo seeded. Admin: http://127.0.0.1:8000/admin/  "
                f"login {DEMO_USER} / {DEMO_PASSWORD} (Marketer; {DEMO_VIEWER} / "
                f"{DEMO_PASSWORD} is read-only)"
            )
        )

    def _preferences(self) -> None:
        """People's preferences, imported as a company brings them from another tool (JSON
        lines, limits.people.preferences_import): some switched offers off on push or email, some
        switched partners' offers on, a few paused everything for two weeks, the others
        switched texts off."""

        rng = np.random.default_rng(5)
        users = np.sort(rng.choice(DEMO_USERS, DEMO_PREFERENCES, replace=False)).tolist()
        pause = (datetime.now(UTC) + timedelta(days=14)).replace(microsecond=0).isoformat()
        lines = []
        for n, user in enumerate(users):
            said: dict[str, Any] = {"user_id": user}
            if n % 4 == 0:
                said["topics"] = {"offers": {"push": False}}
            elif n % 4 == 1:
                said["topics"] = {"offers": {"email": False}, "product-news": {"email": True}}
            elif n % 4 == 2:
                said["topics"] = {"partner-offers": {"email": True}}
            elif n % 40 == 3:
                said["paused_until"] = pause
            else:  # texts switched off (email, where GATEKEEPER_CHANNELS has no sms)
                said["channels"] = {"sms" if "sms" in channels() else "email": False}
            lines.append(json.dumps(said))
        done = preferences_import(
            fileobj=io.BytesIO(("\n".join(lines) + "\n").encode()), file_format="jsonl"
        )
        self.stdout.write(f"Imported {done.people:,} people's preferences.")

    def _experiment(self) -> int:
        """A cap experiment running from now for four weeks on Active riders' email: half get
        at most 3 a week (the reference), half 5."""

        now = timezone.now()

        def weekly(limit: int) -> list[dict[str, Any]]:
            week = {"kind": "calendar", "unit": "week"}
            name = f"{limit} emails a week"
            return [{"name": name, "channel": "email", "window": week, "limit": limit}]

        row = experiment_create(
            ExperimentFields(
                name="Active riders: 3 or 5 emails a week",
                segment="active",
                arms=[ArmFields("3 a week", 0.5, weekly(3)), ArmFields("5 a week", 0.5, weekly(5))],
                starts_at=now,
                ends_at=now + timedelta(days=28),
            ),
            via="command",
            now=now,
        )
        policy_cache().invalidate()  # this process gates with it at once (others: within a TTL)
        return row.pk

    def _experiment_sends(self) -> None:
        """A first email newsletter to 3,000 users, its decisions drained into the ledger at
        once: those of them in Active riders enter the running experiment (in its arms), so
        that the outcome events posted next count for them. (The demo campaigns after it are
        drained by the upkeep worker once it runs.)"""

        refresh()
        users = np.random.default_rng(17).choice(DEMO_USERS, 3_000, replace=False).tolist()
        requests = [(u, f"demo-newsletter:{u}") for u in users]
        for start in range(0, len(requests), 1000):
            gate_check(
                channel="email",
                requests=requests[start : start + 1000],
                campaign="demo-newsletter",
                topic="product-news",
            )
        ledger_drain_all(wait=0)

    def _first_sends(self) -> None:
        """Gate a first campaign per channel so the dashboard has something to show (the first
        rounds name the topic `offers`: some are refused by people's preferences)."""

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
                        topic="offers" if round_ == 0 else "",
                    )
        flush()
        self.stdout.write("Gated two demo campaigns per channel (see the dashboard).")

    def _outcomes(self, experiment: int) -> None:
        """Outcome events (rides taken, with their fare) from some of the experiment's users,
        as the company posts them (POST /api/v1/events/)."""

        members = list(
            StudyMember.objects.filter(study=experiment)
            .order_by("user_id")
            .values_list("user_id", flat=True)
        )
        rng = np.random.default_rng(3)
        chosen = rng.choice(members, min(DEMO_EVENTS, len(members)), replace=False).tolist()
        now = timezone.now()
        events = [
            Event(
                event_id=f"demo-ride-{user}",
                user_id=user,
                name="ride",
                at=now,
                value=round(float(rng.uniform(4, 40)), 2),
            )
            for user in chosen
        ]
        with transaction.atomic():
            recorded = events_record(events)
        self.stdout.write(
            f"Experiment #{experiment} running with {len(members):,} users; "
            f"{recorded['counted']:,} ride events posted for it (see Experiments)."
        )

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

    def _scheduled_jobs(self) -> None:
        """Two push campaigns scheduled a week ahead, both tagged promo (the rule "1 promo a
        day" lets a user have one of them): a weekly offer at 09:00 UTC, and at 12:00 a
        priority-8 launch that reserves its slots, so the plan shows what each will send, what
        the reservation takes from the earlier one, and who loses what. Then their plan."""

        day = (timezone.now() + timedelta(days=7)).astimezone(UTC).date()
        rng = np.random.default_rng(13)
        users = rng.choice(DEMO_USERS, 4_000, replace=False).tolist()
        for campaign, chosen, hour, priority, reserve, topic in (
            ("demo-weekly-offer", users[:3_000], 9, 5, False, "offers"),
            ("demo-launch", users[1_500:], 12, 8, True, "product-news"),
        ):
            send_job_create(
                channel="push",
                campaign=campaign,
                template="welcome",
                tags=["promo"],
                priority=priority,
                topic=topic,
                start_at=datetime(day.year, day.month, day.day, hour, tzinfo=UTC),
                reserve=reserve,
                recipients=[{"user_id": u, "address": f"demo-push-token-{u}"} for u in chosen],
                queue=False,
            )
        plan_refresh(force=True)
        planned = (plan_latest() or {}).get("jobs", [])
        self.stdout.write(
            f"Scheduled {SendJob.objects.filter(status=SendJob.Status.SCHEDULED).count()} demo "
            f"push jobs for {day:%a %d %b}; planned to send "
            + ", ".join(f"{job['sent']:,} of {job['recipients']:,}" for job in planned)
            + " (see The plan)."
        )
