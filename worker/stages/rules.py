"""The rules: every enabled rule that applies to a send (its segment's and every segment's, its
channel's and `all`'s, every send, its tags, its campaign), resolved per segment and time zone (a
calendar window in the user's own zone), with the person's own frequency on the channel added as
rules of theirs (limits.people.preferences: the same log, the same call), and asked of the limiter
in one round trip per Redis node. A reserved scheduled job's holds (limits.engine.reservations)
lower the limits of the rules that count its sends, for the users it will reach, in the same call.
Admitted sends are recorded (unless a dry run); a refusal names the rule (`kind` person: their own;
reason `reserved`: a reservation's hold)."""

from typing import Any

from limits.engine.limiter import Decision
from limits.engine.table import RuleSet
from limits.reasons import CAPPED, Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    """The pending requests decided by the limiter, and those refused before whose decision
    shows what the rules would have done (`Batch.dry`) asked as a dry run in the same go: one
    round trip per Redis node for both."""
    if not batch.pending and not batch.dry:
        return
    positions = sorted([*batch.pending, *batch.dry]) if batch.dry else batch.pending
    for i, decision in zip(positions, asked(batch, parts, positions), strict=True):
        refused = batch.dry.get(i)
        if refused is None or decision.reason == Reason.UNAVAILABLE:
            # Decided here; a dry run the limiter could not answer: as any other send (its
            # refusal would claim to know what it would have got).
            batch.decisions[i] = decision
        else:
            batch.refuse(i, refused, would=decision)
    batch.pending = []
    batch.dry = {}


def asked(batch: Batch, parts: Parts, positions: list[int]) -> list[Decision]:
    """The limiter's decisions of the requests at `positions` under every rule that applies
    to each (theirs included), recorded unless a dry run (the batch's, or `Batch.dry`'s)."""
    table = batch.table
    now_ms = batch.clock_ms
    # Per segment and arm: whether a rule reads the user's zone.
    zoned: dict[tuple[str | None, tuple[int, int] | None], bool] = {}
    sets: dict[tuple[str | None, str, tuple[int, int] | None], RuleSet] = {}
    with_own: dict[tuple[Any, ...], RuleSet] = {}
    per_request: list[RuleSet] = []
    users = [batch.requests[i][0] for i in positions]
    owns = parts.preferences.own_rules(batch.channel, batch.topic, users)
    holds = parts.holds
    # Per request, the reserved jobs that hold a send of this user against this one.
    held = holds.of(users, priority=batch.priority, now_ms=now_ms) if holds else None
    with_holds: dict[tuple[Any, ...], RuleSet] = {}
    calendars: dict[int, bool] = {}  # per rule set: whether any window is a calendar one
    arms = batch.arms()
    for k, i in enumerate(positions):
        segment = batch.segment(i)
        arm = arms[i] if arms else None
        arm_key = None if arm is None else (arm[0].id, arm[1])
        reads_zone = zoned.get((segment, arm_key))
        if reads_zone is None:
            reads_zone = zoned[(segment, arm_key)] = table.needs_zone(
                segment=segment, channel=batch.channel, arm=arm
            )
        zone = batch.zone(i) if reads_zone else ""  # no zone read: one rule set for every zone
        rule_set = sets.get((segment, zone, arm_key))
        if rule_set is None:
            rule_set = sets[(segment, zone, arm_key)] = table.rule_set(
                segment=segment,
                channel=batch.channel,
                campaign=batch.campaign,
                tags=batch.tags,
                priority=batch.priority,
                zone=zone,
                now_ms=now_ms,
                arm=arm,
            )
        own = owns[k] if owns is not None else ()
        if own:
            own_zone = batch.zone(i) if any(rule.calendar for rule in own) else ""
            key = (segment, zone or own_zone, arm_key, own)
            combined = with_own.get(key)
            if combined is None:
                combined = with_own[key] = rule_set.with_own(
                    own, zone=zone or own_zone, now_ms=now_ms
                )
            rule_set = combined
        if held is not None and held[k]:
            # The user's zone only when a calendar window's period depends on it.
            calendar = calendars.get(id(rule_set))
            if calendar is None:
                calendar = calendars[id(rule_set)] = any(r.calendar for r in rule_set.rules)
            hold_zone = batch.zone(i) if calendar else ""
            hold_key = (id(rule_set), held[k], hold_zone)
            holding = with_holds.get(hold_key)
            if holding is None:
                holding = with_holds[hold_key] = holds.rule_set(
                    rule_set,
                    held[k],
                    channel=batch.channel,
                    campaign=batch.campaign,
                    zone=hold_zone,
                    now_ms=now_ms,
                )
            rule_set = holding
        per_request.append(rule_set)
    whole = len(positions) == len(batch.requests)
    decided = parts.decider.acquire(
        batch.channel,
        batch.requests if whole else [batch.requests[i] for i in positions],
        per_request,
        campaign=batch.campaign,
        tags=batch.tags,
        priority=batch.priority,
        retention_ms=table.retention_ms,
        now_ms=batch.now_ms,
        dry_run=batch.dry_run or ([i in batch.dry for i in positions] if batch.dry else False),
        holder=batch.holder,
    )
    for i, decision in zip(positions, decided, strict=True):
        decision.segment = batch.segment(i)
    return decided


STAGE = Stage(
    "rules",
    (
        Reason.ALLOWED,
        Reason.DUPLICATE,
        *CAPPED,
        Reason.BLOCKED,
        Reason.RESERVED,
        Reason.UNAVAILABLE,
    ),
    run,
)
