"""The gate: segments + rules + limiter, one decision per request.

`gate_check` is what the REST API, the send worker and the admin's what-if all call. Per batch it
resolves every user's segment in memory (one bitmap operation), takes the rules from the
in-process cache, resolves per segment and time zone the rules that apply (a calendar window in
the user's own zone), and asks the limiter in one round trip per Redis node.
"""

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from django.core.exceptions import ValidationError

from limits.channels import validate_channel
from limits.limiter import Decision, Limiter, get_limiter
from limits.policy import DEFAULT_PRIORITY, PolicyTable, RuleSet
from limits.selectors import PolicyCache, policy_cache
from limits.windows import resolve_zone
from segments.index import get_index
from worker import stats

logger = logging.getLogger(__name__)

MARKETING = "marketing"
TRANSACTIONAL = "transactional"
CATEGORIES = (MARKETING, TRANSACTIONAL)
UNAVAILABLE = "unavailable"
EXEMPT = "exempt"


class SegmentResolver(Protocol):
    version: str

    def resolve_many(self, ids: Sequence[int]) -> list[str]: ...


class GateError(ValueError):
    """A request the gate cannot decide at all (unknown channel or category)."""


def validate_category(value: str) -> None:
    """The one rule for a send's category (the REST bodies spell the same two as a Literal)."""
    if value not in CATEGORIES:
        raise ValidationError(
            f"Unknown category '{value}'. Choose one of: {', '.join(CATEGORIES)}.",
            code="category",
        )


def _checked(channel: str, category: str = MARKETING) -> None:
    try:
        validate_channel(channel)
        validate_category(category)
    except ValidationError as exc:
        raise GateError(exc.messages[0]) from None


_last_unavailable_log = 0.0


def _log_no_snapshot() -> None:
    # Once a minute at most: a worker gating millions of users must not write millions of lines.
    global _last_unavailable_log
    if time.monotonic() - _last_unavailable_log > 60:
        _last_unavailable_log = time.monotonic()
        logger.error(
            "No segment snapshot is loaded and none is cached on disk: every marketing send is "
            "refused as 'unavailable' until a snapshot is published (manage.py build_segments)."
        )


class Gate:
    def __init__(
        self,
        *,
        limiter: Limiter | None = None,
        policy: PolicyCache | None = None,
        index: SegmentResolver | None = None,
        record_stats: bool = True,
    ) -> None:
        self._limiter = limiter
        self._policy = policy
        self._index = index
        self.record_stats = record_stats

    @property
    def limiter(self) -> Limiter:
        return self._limiter or get_limiter()

    @property
    def policy(self) -> PolicyCache:
        return self._policy or policy_cache()

    def index(self) -> SegmentResolver | None:
        return self._index if self._index is not None else get_index()

    def check(
        self,
        *,
        channel: str,
        requests: Sequence[tuple[int, str]],
        campaign: str = "",
        category: str = MARKETING,
        tags: tuple[str, ...] = (),
        priority: int = DEFAULT_PRIORITY,
        time_zones: Sequence[str | None] | None = None,
        dry_run: bool = False,
        now: float | None = None,
        table: PolicyTable | None = None,
    ) -> list[Decision]:
        """`time_zones`: per request, the user's zone (None: the segment's, else the setting's).
        `table`: decide by these rules instead of the live ones (the what-if)."""
        _checked(channel, category)
        if not requests:
            return []
        index = self.index()
        segments: Sequence[str | None]
        if index is None:
            segments = [None] * len(requests)
        else:
            segments = index.resolve_many([user_id for user_id, _ in requests])

        if category == TRANSACTIONAL:
            # Receipts and one-time codes: never refused, never counted.
            decisions = [
                _own(u, m, segment=s, allowed=True, reason=EXEMPT)
                for (u, m), s in zip(requests, segments, strict=True)
            ]
        elif index is None:
            _log_no_snapshot()
            decisions = [
                _own(u, m, segment=None, allowed=False, reason=UNAVAILABLE) for u, m in requests
            ]
        else:
            decisions = self._decide(
                table or self.policy.table(),
                channel,
                requests,
                segments,
                campaign=campaign,
                tags=tags,
                priority=priority,
                time_zones=time_zones,
                dry_run=dry_run,
                now=now,
            )
        if self.record_stats and not dry_run:
            stats.record(channel=channel, decisions=decisions)
        return decisions

    def _decide(
        self,
        table: PolicyTable,
        channel: str,
        requests: Sequence[tuple[int, str]],
        segments: Sequence[str | None],
        *,
        campaign: str,
        tags: tuple[str, ...],
        priority: int,
        time_zones: Sequence[str | None] | None,
        dry_run: bool,
        now: float | None,
    ) -> list[Decision]:
        now_ms = round((time.time() if now is None else now) * 1000)
        sets: dict[tuple[str | None, str], RuleSet] = {}
        per_request: list[RuleSet] = []
        zoned: dict[str | None, bool] = {}
        for i, segment in enumerate(segments):
            needs_zone = zoned.get(segment)
            if needs_zone is None:
                needs_zone = zoned[segment] = table.needs_zone(segment=segment, channel=channel)
            zone = ""
            if needs_zone:
                zone = resolve_zone(
                    requested=time_zones[i] if time_zones is not None else None,
                    segment_zone=table.zone_of(segment),
                )
            rule_set = sets.get((segment, zone))
            if rule_set is None:
                rule_set = sets[(segment, zone)] = table.rule_set(
                    segment=segment,
                    channel=channel,
                    campaign=campaign,
                    tags=tags,
                    priority=priority,
                    zone=zone,
                    now_ms=now_ms,
                )
            per_request.append(rule_set)
        decisions = self.limiter.acquire(
            channel,
            requests,
            per_request,
            campaign=campaign,
            tags=tags,
            priority=priority,
            retention_ms=table.retention_ms,
            now=now,
            dry_run=dry_run,
        )
        for decision, segment in zip(decisions, segments, strict=True):
            decision.segment = segment
        return decisions

    def release(self, *, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
        _checked(channel)
        return self.limiter.release(channel, requests)


def _own(
    user_id: int, message_id: str, *, segment: str | None, allowed: bool, reason: str
) -> Decision:
    """A decision the gate makes without the limiter (exempt, unavailable)."""
    return Decision(
        user_id=user_id,
        message_id=message_id,
        allowed=allowed,
        reason=reason,
        counts={},
        limits={},
        retry_after=None,
        segment=segment,
    )


_default_gate = Gate()


def gate_check(
    *,
    channel: str,
    requests: Sequence[tuple[int, str]],
    campaign: str = "",
    category: str = MARKETING,
    tags: tuple[str, ...] = (),
    priority: int = DEFAULT_PRIORITY,
    time_zones: Sequence[str | None] | None = None,
    dry_run: bool = False,
    now: float | None = None,
    table: PolicyTable | None = None,
) -> list[Decision]:
    """One decision per request, in request order. Raises GateError for an unknown channel."""
    return _default_gate.check(
        channel=channel,
        requests=requests,
        campaign=campaign,
        category=category,
        tags=tags,
        priority=priority,
        time_zones=time_zones,
        dry_run=dry_run,
        now=now,
        table=table,
    )


def gate_release(*, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
    """Take recorded sends back out (their dispatch failed for good)."""
    return _default_gate.release(channel=channel, requests=requests)
