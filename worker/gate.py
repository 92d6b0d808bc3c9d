"""The gate: segments + caps + limiter, one decision per request.

`gate_check` is what the REST API, the send worker and the admin's what-if all call. Per batch it
resolves every user's segment in memory (one bitmap operation), looks up the caps from the
in-process cache, and asks the limiter in one round trip per Redis node.
"""

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from django.core.exceptions import ValidationError

from limits.channels import validate_channel
from limits.limiter import Decision, Limiter, Policy, get_limiter
from limits.selectors import CapsCache, caps_cache, policy_from
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
        caps: CapsCache | None = None,
        index: SegmentResolver | None = None,
        record_stats: bool = True,
    ) -> None:
        self._limiter = limiter
        self._caps = caps
        self._index = index
        self.record_stats = record_stats

    @property
    def limiter(self) -> Limiter:
        return self._limiter or get_limiter()

    @property
    def caps(self) -> CapsCache:
        return self._caps or caps_cache()

    def index(self) -> SegmentResolver | None:
        return self._index if self._index is not None else get_index()

    def check(
        self,
        *,
        channel: str,
        requests: Sequence[tuple[int, str]],
        campaign: str = "",
        category: str = MARKETING,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[Decision]:
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
                _own(u, m, channel, segment=s, allowed=True, reason=EXEMPT)
                for (u, m), s in zip(requests, segments, strict=True)
            ]
        elif index is None:
            _log_no_snapshot()
            decisions = [
                _own(u, m, channel, segment=None, allowed=False, reason=UNAVAILABLE)
                for u, m in requests
            ]
        else:
            decisions = self._decide(channel, requests, segments, dry_run=dry_run, now=now)
        if self.record_stats and not dry_run:
            stats.record(channel=channel, decisions=decisions)
        return decisions

    def _decide(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        segments: Sequence[str | None],
        *,
        dry_run: bool,
        now: float | None,
    ) -> list[Decision]:
        table = self.caps.table()
        policies: dict[str | None, Policy] = {}
        per_request: list[Policy] = []
        for segment in segments:
            policy = policies.get(segment)
            if policy is None:
                policy = policies[segment] = policy_from(table, segment=segment, channel=channel)
            per_request.append(policy)
        decisions = self.limiter.acquire(channel, requests, per_request, now=now, dry_run=dry_run)
        for decision, segment in zip(decisions, segments, strict=True):
            decision.segment = segment
        return decisions

    def release(self, *, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
        _checked(channel)
        return self.limiter.release(channel, requests)


def _own(
    user_id: int, message_id: str, channel: str, *, segment: str | None, allowed: bool, reason: str
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
        scope=channel,
        segment=segment,
    )


_default_gate = Gate()


def gate_check(
    *,
    channel: str,
    requests: Sequence[tuple[int, str]],
    campaign: str = "",
    category: str = MARKETING,
    dry_run: bool = False,
    now: float | None = None,
) -> list[Decision]:
    """One decision per request, in request order. Raises GateError for an unknown channel."""
    return _default_gate.check(
        channel=channel,
        requests=requests,
        campaign=campaign,
        category=category,
        dry_run=dry_run,
        now=now,
    )


def gate_release(*, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
    """Take recorded sends back out (their dispatch failed for good)."""
    return _default_gate.release(channel=channel, requests=requests)
