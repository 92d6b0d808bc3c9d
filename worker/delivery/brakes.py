"""Brakes: a mailbox provider whose recipients complain, or whose addresses bounce, is paused
before it stops taking the sender's mail at all.

Gmail and Yahoo (and Microsoft) hold bulk senders to a spam-complaint rate under 0.3%; a list
that bounces is a list bought or gone stale. Per group (worker/delivery/mailboxes.py), over the
last 24 hours (since a person resumed it, when later):

- **sent**: the email the workers handed to the provider (each chunk run adds its own);
- **complaints**: spam complaints, and **bounces**: hard bounces, from the email providers'
  tracking webhooks (worker/delivery/tracking.py), by the recipient's address;
- **delivered**: sent less bounced.

A group is paused (`mailbox_pause`, a change in the one history) when, with at least
GATEKEEPER_BRAKE_MIN_DELIVERED delivered (1,000), its complaints reach
GATEKEEPER_BRAKE_COMPLAINT_RATE of them (0.003), or its bounces reach
GATEKEEPER_BRAKE_BOUNCE_RATE of its sent (0.05). Beat's `mailbox_brakes` checks every 15 s
(worker.delivery.mailbox_settings.brakes_check),
and every worker reads the groups at most 5 s old: a group is paused, and its email waits,
within 20 s of the event that tripped it. Its sends then wait (worker/delivery/deliverability.py)
until a person resumes it; the count starts again then.

The counts are one Redis hash per group (`<prefix>brake:{<group>}`): a field per figure and
5-minute slot, kept 25 hours, so that the 24 hours are read to within 5 minutes.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis

logger = logging.getLogger(__name__)

SLOT_SECONDS = 300
WINDOW = timedelta(hours=24)
KEPT_SECONDS = 25 * 3600
SENT, COMPLAINED, BOUNCED = "sent", "complained", "bounced"
FIGURES = (SENT, COMPLAINED, BOUNCED)


def brake_key(group: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}brake:{{{group}}}"


def _slot(at: datetime) -> int:
    return int(at.timestamp()) // SLOT_SECONDS


def brake_count(figure: str, counts: Mapping[str, int], *, at: datetime | None = None) -> None:
    """Add `counts` (group -> n) to a figure of each group's, at `at` (now). A Redis that does
    not answer loses the counts (logged), never the sends."""
    counts = {group: n for group, n in counts.items() if n}
    if not counts:
        return
    field = f"{figure}:{_slot(at or timezone.now())}"
    try:
        with get_redis().pipeline(transaction=False) as pipe:
            for group, n in counts.items():
                pipe.hincrby(brake_key(group), field, n)
                pipe.expire(brake_key(group), KEPT_SECONDS)
            pipe.execute()
    except REDIS_DOWN as exc:
        logger.warning("The brakes' counts of %s were not kept: %s", figure, exc)


def brake_forget(group: str) -> None:
    """Start a group's count again (it was resumed)."""
    get_redis().delete(brake_key(group))


@dataclass(frozen=True)
class Figures:
    sent: int
    complaints: int
    bounces: int

    @property
    def delivered(self) -> int:
        return max(0, self.sent - self.bounces)

    @property
    def complaint_rate(self) -> float:
        return self.complaints / self.delivered if self.delivered else 0.0

    @property
    def bounce_rate(self) -> float:
        return self.bounces / self.sent if self.sent else 0.0


def brake_figures(group: str, *, now: datetime | None = None) -> Figures:
    """A group's figures over the last 24 hours (slots older than that are dropped)."""
    now = now or timezone.now()
    client = get_redis()
    key = brake_key(group)
    first = _slot(now - WINDOW)
    found = dict.fromkeys(FIGURES, 0)
    old = []
    for name, value in client.hgetall(key).items():
        field = name.decode() if isinstance(name, bytes) else name
        figure, _, slot = field.partition(":")
        if int(slot) < first:
            old.append(field)
        elif figure in found:
            found[figure] += int(value)
    if old:
        client.hdel(key, *old)
    return Figures(sent=found[SENT], complaints=found[COMPLAINED], bounces=found[BOUNCED])


def brake_tripped(figures: Figures) -> str | None:
    """Which brake the figures trip, in words; None when neither."""
    if figures.delivered < settings.GATEKEEPER_BRAKE_MIN_DELIVERED:
        return None
    complaint_limit = settings.GATEKEEPER_BRAKE_COMPLAINT_RATE
    if figures.complaint_rate >= complaint_limit:
        return (
            f"{figures.complaints:,} spam complaints in {figures.delivered:,} delivered over the "
            f"last 24 hours: {figures.complaint_rate:.2%}, at or above {complaint_limit:.2%}."
        )
    bounce_limit = settings.GATEKEEPER_BRAKE_BOUNCE_RATE
    if figures.bounce_rate >= bounce_limit:
        return (
            f"{figures.bounces:,} hard bounces in {figures.sent:,} sent over the last 24 hours: "
            f"{figures.bounce_rate:.2%}, at or above {bounce_limit:.2%}."
        )
    return None
