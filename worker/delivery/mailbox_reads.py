"""Reads of deliverability for the admin and the REST API: what waits for a paused group's
brake, a warm-up plan's day as it stands (per group its volume, what went out and what waits),
and what a send job's waiting chunks are held for. The writes are worker/delivery/
mailbox_settings.py's.

What waits is counted in recipients: the `size` of the queued waiting chunks whose `held`
names the hold (worker/delivery/deliverability.py).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.db.models import Min, Sum
from django.utils import timezone

from gatekeeper.lib.redis_client import REDIS_DOWN
from worker.delivery.deliverability import BRAKE, WARMUP, brake_hold, hold_read
from worker.delivery.mailbox_settings import braked_waiting
from worker.delivery.warmup import plan_of, warmup_taken
from worker.models import MailboxProvider, WarmupPlan, chunks_waiting


def _waiting() -> Any:
    return chunks_waiting()


def braked_waiting_count(slug: str) -> int:
    """Recipients whose email waits for the group's brake."""
    return int(braked_waiting(slug).aggregate(n=Sum("size"))["n"] or 0)


def braked_waiting_counts(slugs: Iterable[str]) -> dict[str, int]:
    """braked_waiting_count of each group, in one query."""
    holds = {brake_hold(slug): slug for slug in slugs}
    found = (
        _waiting()
        .filter(held__in=list(holds))
        .values_list("held")
        .annotate(n=Sum("size"))
        .order_by()
    )
    counts = dict.fromkeys(holds.values(), 0)
    for held, n in found:
        counts[holds[held]] = int(n or 0)
    return counts


def warmup_waiting(domain: str) -> dict[str, int]:
    """Recipients waiting for a next day of the domain's plan, per group."""
    prefix = f"{WARMUP}:{domain}:"
    found = (
        _waiting()
        .filter(held__startswith=prefix)
        .values_list("held")
        .annotate(n=Sum("size"))
        .order_by()
    )
    return {hold_read(held)[2]: int(n or 0) for held, n in found}


def warmup_today(row: WarmupPlan, *, now: datetime | None = None) -> dict[str, Any]:
    """The plan's day at `now` in its zone: {"day" (1 on its first day; None before it),
    "date", "next_day_at", "groups": {group: {"volume" (None: not held that day: before the
    start, or its ramp ended), "sent" (None: Redis did not answer), "waiting"}}}."""
    now = now or timezone.now()
    plan = plan_of(row)
    index, today, following = plan.day(now)
    try:
        taken: dict[str, int] | None = warmup_taken(plan, today)
    except REDIS_DOWN:
        taken = None  # the figures from the database still stand
    waiting = warmup_waiting(row.domain)
    groups = {
        group: {
            "volume": plan.volume(group, index),
            "sent": None if taken is None else taken.get(group, 0),
            "waiting": waiting.get(group, 0),
        }
        for group in sorted(row.volumes)
    }
    return {
        "day": index + 1 if index >= 0 else None,
        "date": today,
        "next_day_at": following,
        "groups": groups,
    }


def ramp_words(ramp: list[int]) -> str:
    """A group's daily volumes in words: "50, 100, 200 … 700,000 over 20 days"."""
    days = f"{len(ramp)} day{'s' if len(ramp) != 1 else ''}"
    if len(ramp) <= 6:
        return f"{', '.join(f'{v:,}' for v in ramp)} ({days})"
    return f"{', '.join(f'{v:,}' for v in ramp[:3])} … {ramp[-1]:,} over {days}"


# --- a send job's holds -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    """What some of a job's waiting sends wait for: a paused group (`brake`) or a next day of a
    warm-up plan (`warmup`), how many recipients, and when they are looked at again."""

    held: str
    kind: str
    group: str
    domain: str
    recipients: int
    release_at: datetime | None
    # A warm-up hold's plan as it stands (None: the plan is gone, the sends go at their time).
    plan_day: int | None = None
    plan_date: date | None = None
    next_day_at: datetime | None = None
    paused_at: datetime | None = None  # a brake hold's group, while paused


def job_holds(job_id: int, *, now: datetime | None = None) -> list[Hold]:
    """The holds of the job's queued waiting chunks, each with its recipients waiting."""
    now = now or timezone.now()
    found = (
        _waiting()
        .filter(job_id=job_id)
        .exclude(held="")
        .values_list("held")
        .annotate(n=Sum("size"), release=Min("not_before"))
        .order_by("held")
    )
    plans = {row.domain: row for row in WarmupPlan.objects.all()}
    paused = dict(
        MailboxProvider.objects.filter(paused_at__isnull=False).values_list("slug", "paused_at")
    )
    holds = []
    for held, n, release in found:
        kind, domain, group = hold_read(held)
        if kind == BRAKE:
            holds.append(
                Hold(held, kind, group, "", int(n or 0), release, paused_at=paused.get(group))
            )
        elif kind == WARMUP:
            row = plans.get(domain)
            day: int | None = None
            today: date | None = None
            following: datetime | None = None
            if row is not None:
                index, today, following = plan_of(row).day(now)
                day = index + 1 if index >= 0 else None
            holds.append(
                Hold(held, kind, group, domain, int(n or 0), release, day, today, following)
            )
    return holds


def paused_groups() -> list[dict[str, Any]]:
    """The groups the brake paused, each with the brake's figures and the recipients waiting."""
    rows = list(MailboxProvider.objects.filter(paused_at__isnull=False).order_by("paused_at"))
    waiting = braked_waiting_counts(row.slug for row in rows)
    return [
        {
            "slug": row.slug,
            "name": row.name,
            "paused_at": row.paused_at,
            "why": row.paused_why or {},
            "figures": why_figures(row.paused_why or {}),
            "waiting": waiting[row.slug],
        }
        for row in rows
    ]


def why_figures(why: dict[str, Any]) -> str:
    """The brake's figures in words: "12 complaints of 3,400 delivered (0.35 %); 20 hard
    bounces (0.59 %)"; what it did not say is left out."""
    parts = []

    def number(value: Any) -> str:
        return f"{value:,}" if isinstance(value, int) else str(value)

    def rate(value: Any) -> str:
        return f" ({value * 100:.2f} %)" if isinstance(value, int | float) else ""

    if "complaints" in why:
        of = f" of {number(why['delivered'])} delivered" if "delivered" in why else ""
        parts.append(f"{number(why['complaints'])} complaints{of}{rate(why.get('complaint_rate'))}")
    elif "delivered" in why:
        parts.append(f"{number(why['delivered'])} delivered")
    if "bounces" in why:
        parts.append(f"{number(why['bounces'])} hard bounces{rate(why.get('bounce_rate'))}")
    return "; ".join(parts)
