"""A user's quota as the REST API and the admin's user lookup read it: their segment and time
zone, per channel the classic caps and every rule that applies (used, limit, remaining, when a
slot frees), their recent sends and their quiet hours. Reads only: nothing is recorded."""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gatekeeper.lib.instants import instant_ms, instant_or_now
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.channels import ALL, channels, scopes
from limits.engine.limiter import RuleUsage, get_limiter
from limits.engine.log import NO_HASH, short_hash
from limits.engine.quiet import quiet_describe, quiet_until, release_at
from limits.engine.table import DAY_SECONDS, WEEK_SECONDS, counting_rule, encode
from limits.engine.windows import resolve_zone
from limits.models.ledger import LedgerCount
from limits.policy.rules import rule_describe
from limits.policy.selectors import policy_cache
from segments.index import SegmentIndex, get_index, index_status
from segments.models import Segment

# The quota reads rules as a send of the highest priority would meet them: every limit whole.
QUOTA_PRIORITY = 9


class Unavailable(Exception):
    """The snapshot or Redis is missing: the read cannot be answered (the message says why)."""


def live_index() -> SegmentIndex:
    index = get_index()
    if index is None:
        raise Unavailable(f"No segment snapshot is loaded: {index_status()['error']}")
    return index


def redis_unavailable(exc: Exception) -> Unavailable:
    """What a read that needs Redis raises when Redis does not answer."""
    return Unavailable(f"Redis is not answering ({type(exc).__name__}: {exc}).")


def user_quota(
    user_id: int,
    *,
    now: datetime | None = None,
    time_zone: str | None = None,
    window_seconds: int | None = None,
    campaign: str = "",
) -> dict[str, Any]:
    """The user's segment and time zone; per channel and `all`, the classic caps (used, limit,
    remaining, next slot); every rule that applies, with the same figures; and with
    `window_seconds`, the sends per channel recorded in that recent interval. At `now` (None:
    Redis's clock for the logs, this process's for the rules' calendars)."""
    try:
        return _user_quota(
            user_id, now=now, time_zone=time_zone, window_seconds=window_seconds, campaign=campaign
        )
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc


def _user_quota(
    user_id: int,
    *,
    now: datetime | None,
    time_zone: str | None,
    window_seconds: int | None,
    campaign: str,
) -> dict[str, Any]:
    now_ms = instant_ms(instant_or_now(now))  # a bad `now` refused before anything is read
    index = live_index()
    segment = index.resolve(user_id)
    table = policy_cache().table()
    zone = resolve_zone(requested=time_zone, segment_zone=table.zone_of(segment))
    arm = next(iter(table.arms([user_id], [segment], now_ms=now_ms)), None)
    groups = []
    for scope in scopes():
        daily, weekly = table.classic_limits(segment=segment, channel=scope).values()
        counters = [
            counting_rule(channel=scope, seconds=DAY_SECONDS, limit=_or_max(daily)),
            counting_rule(channel=scope, seconds=WEEK_SECONDS, limit=_or_max(weekly)),
        ]
        if window_seconds is not None and scope != ALL:
            counters.append(counting_rule(channel=scope, seconds=window_seconds))
        own = [
            r
            for r in table.candidates(segment=segment, channel=scope, arm=arm)
            if r.channel == scope
        ]
        rule_set = encode([*counters, *own], priority=QUOTA_PRIORITY, zone=zone, now_ms=now_ms)
        groups.append((scope, rule_set))
    figures = get_limiter().usage(
        user_id, groups, campaign=campaign, now_ms=None if now is None else now_ms
    )
    if figures is None:
        raise Unavailable("Redis is not answering; quotas cannot be read.")
    by_scope: dict[str, list[RuleUsage]] = {}
    for usage in figures:
        by_scope.setdefault(usage.channel, []).append(usage)
    answer: dict[str, Any] = {
        "user_id": user_id,
        "segment": segment,
        "snapshot_version": index.version,
        "time_zone": zone,
        "experiment": (None if arm is None else {"id": arm[0].id, "arm": arm[0].arms[arm[1]].name}),
        "scopes": {},
        "rules": [],
    }
    sent: dict[str, int] = {}
    names = _segment_names()
    for scope, usages in by_scope.items():
        daily, weekly = table.classic_limits(segment=segment, channel=scope).values()
        day, week = usages[0], usages[1]
        waits = [u.next_slot_in for u in (day, week) if u.next_slot_in is not None]
        answer["scopes"][scope] = {
            "daily": _window(day.used, daily),
            "weekly": _window(week.used, weekly),
            "next_slot_in": max(waits) if waits else None,
        }
        rest = usages[2:]
        if window_seconds is not None and scope != ALL:
            sent[scope] = rest[0].used
            rest = rest[1:]
        for usage in rest:
            answer["rules"].append(_rule_figures(usage, names))
    if window_seconds is not None:
        answer["sent"] = sent
    return answer


def _or_max(limit: int | None) -> int:
    return 2**31 - 1 if limit is None else limit


def _window(used: int, limit: int | None) -> dict[str, int | None]:
    return {
        "used": used,
        "limit": limit,
        "remaining": None if limit is None else max(limit - used, 0),
    }


def _segment_names() -> dict[str, str]:
    return dict(Segment.objects.values_list("slug", "name"))


def _rule_figures(usage: RuleUsage, names: Mapping[str, str]) -> dict[str, Any]:
    rule = usage.rule
    return {
        "id": rule.id,
        "kind": rule.kind,
        "name": rule.name,
        "channel": rule.channel,
        "description": rule_describe(rule, segment_name=names.get(rule.segment or "")),
        "match": rule.match,
        "tag": rule.tag or None,
        "window": rule.window(),
        "limit": rule.limit,
        "used": usage.used,
        "remaining": usage.remaining,
        "next_slot_in": usage.next_slot_in if usage.used >= usage.limit else None,
        "reserve": (
            {"below_priority": rule.reserve_below_priority, "slots": rule.reserve_slots}
            if rule.reserve_below_priority is not None
            else None
        ),
        "classic": rule.classic,
    }


def user_recent_sends(
    user_id: int, *, now: datetime | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Recorded sends of the last 7 days before `now` (None: Redis's clock), newest first:
    channel, time, priority, and the campaign's and tags' names where the ledger's counts or a
    rule name them (the log keeps hashes)."""
    now_ms = None if now is None else instant_ms(now)
    try:
        entries = get_limiter().history(user_id, now_ms=now_ms)[:limit]
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc
    campaigns = _campaign_names(min((e.at_ms for e in entries), default=0))
    tags = {short_hash(t): t for t in policy_cache().table().tags()}
    return [
        {
            "channel": entry.channel,
            "at": entry.at_ms / 1000,
            "priority": entry.priority,
            "campaign": campaigns.get(entry.campaign, "" if entry.campaign == NO_HASH else "?"),
            "tags": [tags.get(t, "?") for t in entry.tags],
            "message": entry.message.hex(),
        }
        for entry in entries
    ]


CAMPAIGNS_NAMED = 10_000  # campaign names read to name a user's recent sends


def _campaign_names(since_ms: int) -> dict[bytes, str]:
    """The campaigns the ledger counted since `since_ms`, by the hash the log keeps of them."""
    since = datetime.fromtimestamp(since_ms / 1000, UTC).replace(minute=0, second=0, microsecond=0)
    names = (
        LedgerCount.objects.filter(hour__gte=since)
        .exclude(campaign="")
        .values_list("campaign", flat=True)
        .distinct()[:CAMPAIGNS_NAMED]
    )
    return {short_hash(name): name for name in names}


def user_quiet_hours(
    user_id: int, *, segment: str, zone: str, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Per channel, the quiet hours that apply to the user (their segment's and every
    segment's, on the channel and `all`) in plain words, and whether they hold a marketing send
    now (None: this process's clock): until when (`until`, epoch seconds) and when the user's
    own send would go (`release`: the end plus their place in the spread), read in their
    `zone`."""
    now_ms = instant_ms(instant_or_now(now))
    table = policy_cache().table()
    names = _segment_names()
    answer = []
    for channel in channels():
        entries = table.quiet_for(segment=segment, channel=channel)
        end_ms, spread = quiet_until(entries, zone, now_ms)
        holds = end_ms > now_ms
        answer.append(
            {
                "channel": channel,
                "entries": [quiet_describe(entry, segment_names=names) for entry in entries],
                "quiet_now": holds,
                "until": end_ms / 1000 if holds else None,
                "release": release_at(end_ms, spread, user_id) / 1000 if holds else None,
                "spread_seconds": spread if holds else 0,
            }
        )
    return answer
