"""A chunk of email as its run sees its mailbox providers: each recipient's group (the rates its
sends are paced at, worker/delivery/mailboxes.py), and the sends held before the gate:

- **braked**: its group is paused by the brake (worker/delivery/brakes.py). The send waits in a
  deferred chunk (`held` = `brake:<group>`) for BRAKE_RECHECK, and is gated again then; a
  resume hands those chunks out at once.
- **warming_up**: beyond the day's volume of the sending domain's warm-up plan for its group
  (worker/delivery/warmup.py). It waits (`held` = `warmup:<domain>:<group>`) for the next
  day's start in the plan's zone. A chunk of retries does not count again: its sends took their
  volume when the gate first admitted them.

A held send is not gated, so no cap is charged for it; its job counts it under its reason and
it goes through the gate when its hold ends. The job's expiry still ends it, as any waiting
send.

The sending domain is the domain of DEFAULT_FROM_EMAIL, the address every dispatcher sends
from.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from email.utils import parseaddr
from typing import Any

from django.conf import settings

from limits.channels import EMAIL
from limits.engine.limiter import Decision
from limits.reasons import Reason
from worker.delivery.mailboxes import Mailboxes, domain_of, mailboxes
from worker.delivery.warmup import Plan, warmup_ended, warmup_plans, warmup_take

# How long a braked send waits before it is looked at again (a resume releases it at once).
BRAKE_RECHECK = timedelta(hours=1)
BRAKE, WARMUP = "brake", "warmup"


def sending_domain() -> str:
    """The domain the email goes out from (DEFAULT_FROM_EMAIL's)."""
    return domain_of(parseaddr(settings.DEFAULT_FROM_EMAIL)[1])


def brake_hold(group: str) -> str:
    """A waiting chunk's `held` for a braked group's sends."""
    return f"{BRAKE}:{group}"


def warmup_hold(domain: str, group: str) -> str:
    return f"{WARMUP}:{domain}:{group}"


def hold_read(held: str) -> tuple[str, str, str]:
    """A chunk's `held` read back: (BRAKE or WARMUP, the sending domain ("" for a brake), the
    group)."""
    kind, _, rest = held.partition(":")
    domain, _, group = rest.rpartition(":")
    return kind, domain, group


@dataclass
class Delivery:
    """A chunk's mailbox providers, as its run reads them."""

    boxes: Mailboxes
    groups: list[str]  # each recipient's group
    # Per recipient: a decision made before the gate (outranked, braked, warming_up), or None;
    # None for all when none was.
    before: list[Decision | None] | None
    holds: dict[int, tuple[str, datetime]] = field(default_factory=dict)  # i -> (held, release)
    plan: Plan | None = None
    day: date | None = None
    took: dict[str, int] = field(default_factory=dict)  # group -> warm-up volume taken


def _held(recipient: Any, reason: Reason) -> Decision:
    return Decision(
        user_id=recipient.user_id,
        message_id=recipient.message_id,
        allowed=False,
        reason=reason,
        counts={},
        limits={},
        retry_after=None,
    )


def delivery_read(
    *,
    channel: str,
    retries: bool,
    recipients: Sequence[Any],
    before: list[Decision | None] | None,
    now: datetime,
) -> Delivery | None:
    """The chunk's groups and holds; None when it is not email (or GATEKEEPER_DELIVERABILITY is
    off). `retries`: a chunk of sends
    the gate admitted before (they took their warm-up volume then). `before`: decisions made
    already (a round's outranked), kept."""
    if channel != EMAIL or not settings.GATEKEEPER_DELIVERABILITY:
        return None
    boxes = mailboxes()
    delivery = Delivery(
        boxes=boxes, groups=boxes.groups_of(r.address for r in recipients), before=before
    )
    if boxes.paused:
        release = now + BRAKE_RECHECK
        for i, group in enumerate(delivery.groups):
            if group in boxes.paused:
                decided = _decided(delivery, len(recipients))
                if decided[i] is None:
                    decided[i] = _held(recipients[i], Reason.BRAKED)
                    delivery.holds[i] = (brake_hold(group), release)
    plan = warmup_plans().get(sending_domain())
    if plan is not None and not plan.over and not retries:
        _warmed(delivery, plan, recipients, now)
    return delivery


def _decided(delivery: Delivery, size: int) -> list[Decision | None]:
    """The decisions made before the gate, as a list (None for each send, when none was)."""
    if delivery.before is None:
        delivery.before = [None] * size
    return delivery.before


def _warmed(delivery: Delivery, plan: Plan, recipients: Sequence[Any], now: datetime) -> None:
    index, today, following = plan.day(now)
    groups = delivery.groups
    volumes = {
        group: volume for group in set(groups) if (volume := plan.volume(group, index)) is not None
    }
    if not volumes:
        return
    before = delivery.before
    if before is None:
        wanted = Counter(g for g in groups if g in volumes)
    else:
        wanted = Counter(
            g for g, d in zip(groups, before, strict=True) if d is None and g in volumes
        )
    if not wanted:
        return
    granted = warmup_take(plan, today, {g: (n, volumes[g]) for g, n in wanted.items()})
    delivery.plan, delivery.day = plan, today
    delivery.took = {group: got for group, (got, _) in granted.items() if got}
    ended = [
        group
        for group, (_, used) in granted.items()
        if index >= len(plan.volumes[group]) - 1 and used >= volumes[group]
    ]
    if ended:
        warmup_ended(plan, ended, today)
    short = {group for group, (got, _) in granted.items() if got < wanted[group]}
    if not short:
        return  # every send had its volume: nothing held (the usual chunk)
    left = {group: granted[group][0] for group in short}
    for i, group in enumerate(groups):
        if group not in short or (before is not None and before[i] is not None):
            continue
        if left[group] > 0:
            left[group] -= 1
        else:
            _decided(delivery, len(recipients))[i] = _held(recipients[i], Reason.WARMING_UP)
            delivery.holds[i] = (warmup_hold(plan.domain, group), following)


def delivery_give_back(delivery: Delivery, decisions: Sequence[Decision]) -> None:
    """Warm-up volume taken for sends the gate then refused, given back: a send of a group
    that took volume, decided by the gate (not held, nor decided before it), refused."""
    if delivery.plan is None or delivery.day is None or not delivery.took:
        return
    took, before = delivery.took, delivery.before
    back = Counter(
        group
        for i, (group, decision) in enumerate(zip(delivery.groups, decisions, strict=True))
        if group in took and not decision.allowed and (before is None or before[i] is None)
    )
    if back:
        warmup_take(delivery.plan, delivery.day, {g: (-n, 0) for g, n in back.items()})


def mail_waiting() -> dict[tuple[str, str], int]:
    """Email waiting for its mailbox provider, by (group, hold: `brake` or `warmup`)."""
    from django.db.models import Sum

    from worker.models import chunks_waiting

    rows = chunks_waiting().filter(held__gt="").values_list("held").annotate(n=Sum("size"))
    found: dict[tuple[str, str], int] = {}
    for held, n in rows.order_by():
        kind, _, group = hold_read(held)
        found[(group, kind)] = found.get((group, kind), 0) + (n or 0)
    return found
