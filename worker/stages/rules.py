"""The rules: every enabled rule that applies to a send (its segment's and every segment's, its
channel's and `all`'s, every send, its tags, its campaign), resolved per segment and time zone (a
calendar window in the user's own zone), with the person's own frequency on the channel added as
rules of theirs (limits.preferences: the same log, the same call), and asked of the limiter in
one round trip per Redis node. Admitted sends are recorded (unless a dry run); a refusal names
the rule (`kind` person: their own)."""

from limits.policy import RuleSet, RuleView
from limits.reasons import CAPPED, Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    if not batch.pending:
        return
    table = batch.table
    now_ms = round(batch.clock * 1000)
    zoned: dict[str | None, bool] = {}  # per segment: whether a rule reads the user's zone
    sets: dict[tuple[str | None, str], RuleSet] = {}
    with_own: dict[tuple[str | None, str, tuple[RuleView, ...]], RuleSet] = {}
    per_request: list[RuleSet] = []
    owns = parts.preferences.own_rules(
        batch.channel, batch.topic, [batch.requests[i][0] for i in batch.pending]
    )
    for k, i in enumerate(batch.pending):
        segment = batch.segment(i)
        reads_zone = zoned.get(segment)
        if reads_zone is None:
            reads_zone = zoned[segment] = table.needs_zone(segment=segment, channel=batch.channel)
        zone = batch.zone(i) if reads_zone else ""  # no zone read: one rule set for every zone
        rule_set = sets.get((segment, zone))
        if rule_set is None:
            rule_set = sets[(segment, zone)] = table.rule_set(
                segment=segment,
                channel=batch.channel,
                campaign=batch.campaign,
                tags=batch.tags,
                priority=batch.priority,
                zone=zone,
                now_ms=now_ms,
            )
        own = owns[k] if owns is not None else ()
        if own:
            own_zone = batch.zone(i) if any(rule.calendar for rule in own) else ""
            key = (segment, zone or own_zone, own)
            combined = with_own.get(key)
            if combined is None:
                combined = with_own[key] = rule_set.with_own(own, zone=key[1], now_ms=now_ms)
            rule_set = combined
        per_request.append(rule_set)
    whole = len(batch.pending) == len(batch.requests)
    decided = parts.limiter.acquire(
        batch.channel,
        batch.requests if whole else [batch.requests[i] for i in batch.pending],
        per_request,
        campaign=batch.campaign,
        tags=batch.tags,
        priority=batch.priority,
        retention_ms=table.retention_ms,
        now=batch.now,
        dry_run=batch.dry_run,
        holder=batch.holder,
    )
    for i, decision in zip(batch.pending, decided, strict=True):
        decision.segment = batch.segment(i)
        batch.decisions[i] = decision
    batch.pending = []


STAGE = Stage(
    "rules",
    (Reason.ALLOWED, Reason.DUPLICATE, *CAPPED, Reason.BLOCKED, Reason.UNAVAILABLE),
    run,
)
