"""The gate: segments + rules + limiter, one decision per request.

`gate_check` is what the REST API, the send worker and the admin's what-if all call. Per batch it
resolves every user's segment in memory (one bitmap operation), takes the rules from the
in-process cache, holds the sends that fall in the user's quiet hours (decided here, in
Python: they cost Redis nothing), resolves per segment and time zone the rules that apply (a
calendar window in the user's own zone), and asks the limiter about the rest in one round trip
per Redis node.
"""

import logging
import math
import time
from collections.abc import Sequence
from typing import Protocol, cast

from django.core.exceptions import ValidationError

from limits.channels import validate_channel
from limits.ledger.stream import ledger_append, ledger_enabled, ledger_outcomes
from limits.limiter import Decision, Limiter, get_limiter
from limits.policy import DEFAULT_PRIORITY, PolicyTable, RuleSet
from limits.quiet import QuietView, release_at
from limits.reasons import Category, Outcome, Reason, validate_category
from limits.selectors import PolicyCache, policy_cache
from limits.suppression import SuppressionCache, SuppressionUnavailable, suppression_cache
from limits.windows import resolve_zone
from segments.index import get_index
from worker import stats

logger = logging.getLogger(__name__)

_UNKNOWN: object = object()


class SegmentResolver(Protocol):
    version: str

    def resolve_many(self, ids: Sequence[int]) -> list[str]: ...


class GateError(ValidationError):
    """A request the gate cannot decide at all (unknown channel or category), naming the field
    (the REST API's base answers it as that field's 400)."""


def _checked(channel: str, category: str = Category.MARKETING) -> None:
    try:
        validate_channel(channel, field="channel")
        validate_category(category, field="category")
    except ValidationError as exc:
        raise GateError(exc.message_dict) from None


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
        suppressions: SuppressionCache | None = None,
        record_stats: bool = True,
        record_ledger: bool | None = None,
    ) -> None:
        """`record_ledger`: keep decisions in the send ledger (None: as GATEKEEPER_LEDGER says)."""
        self._limiter = limiter
        self._policy = policy
        self._index = index
        self._suppressions = suppressions
        self.record_stats = record_stats
        self.record_ledger = record_ledger

    @property
    def limiter(self) -> Limiter:
        return self._limiter or get_limiter()

    @property
    def policy(self) -> PolicyCache:
        return self._policy or policy_cache()

    @property
    def suppressions(self) -> SuppressionCache:
        return self._suppressions or suppression_cache()

    def index(self) -> SegmentResolver | None:
        return self._index if self._index is not None else get_index()

    def check(
        self,
        *,
        channel: str,
        requests: Sequence[tuple[int, str]],
        campaign: str = "",
        category: str = Category.MARKETING,
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

        if category == Category.TRANSACTIONAL:
            # Receipts and one-time codes: never refused, never counted.
            decisions = [
                _own(u, m, segment=s, allowed=True, reason=Reason.EXEMPT)
                for (u, m), s in zip(requests, segments, strict=True)
            ]
        else:
            decisions = self._marketing(
                channel,
                requests,
                segments if index is not None else None,
                table=table,
                campaign=campaign,
                tags=tags,
                priority=priority,
                time_zones=time_zones,
                dry_run=dry_run,
                now=now,
            )
        if not dry_run:
            if self.record_stats:
                stats.record(channel=channel, decisions=decisions)
            if self._ledger_on():
                ledger_append(
                    at=time.time() if now is None else now,
                    channel=channel,
                    campaign=campaign,
                    tags=tags,
                    priority=priority,
                    category=category,
                    snapshot_version=index.version if index is not None else "",
                    decisions=decisions,
                )
        return decisions

    def _marketing(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        segments: Sequence[str | None] | None,
        *,
        table: PolicyTable | None,
        campaign: str,
        tags: tuple[str, ...],
        priority: int,
        time_zones: Sequence[str | None] | None,
        dry_run: bool,
        now: float | None,
    ) -> list[Decision]:
        """Suppressed users first (in memory; they are refused and charged nothing, snapshot
        or not), then the rest by quiet hours and rules (`segments` None: no snapshot). A
        process that could never read the suppression list refuses all as `unavailable`."""
        decisions: list[Decision | None] = [None] * len(requests)
        try:
            suppressed = self.suppressions.suppressed(channel, [user_id for user_id, _ in requests])
        except SuppressionUnavailable:
            # Never read in this process: a send to someone who opted out is worse than a
            # send refused for now (the worker tries `unavailable` sends again).
            return [
                _own(u, m, segment=None, allowed=False, reason=Reason.UNAVAILABLE)
                for u, m in requests
            ]
        rest = list(range(len(requests)))
        if suppressed is not None:
            rest = []
            for i, (user_id, message_id) in enumerate(requests):
                if suppressed[i]:
                    segment = segments[i] if segments is not None else None
                    decisions[i] = _own(
                        user_id,
                        message_id,
                        segment=segment,
                        allowed=False,
                        reason=Reason.SUPPRESSED,
                    )
                else:
                    rest.append(i)
        if not rest:
            return decisions  # type: ignore[return-value]
        if segments is None:
            _log_no_snapshot()
            for i in rest:
                user_id, message_id = requests[i]
                decisions[i] = _own(
                    user_id, message_id, segment=None, allowed=False, reason=Reason.UNAVAILABLE
                )
            return decisions  # type: ignore[return-value]
        whole = len(rest) == len(requests)
        decided = self._decide(
            table or self.policy.table(),
            channel,
            requests if whole else [requests[i] for i in rest],
            segments if whole else [segments[i] for i in rest],
            campaign=campaign,
            tags=tags,
            priority=priority,
            time_zones=(
                time_zones if whole or time_zones is None else [time_zones[i] for i in rest]
            ),
            dry_run=dry_run,
            now=now,
        )
        if whole:
            return decided
        for i, decision in zip(rest, decided, strict=True):
            decisions[i] = decision
        return decisions  # type: ignore[return-value]

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
        clock = time.time() if now is None else now
        now_ms = round(clock * 1000)
        sets: dict[tuple[str | None, str], RuleSet] = {}
        # Per segment: its quiet hours on the channel, whether a rule reads the zone, and the
        # zone of a request that names none (resolve_zone's answer without a requested zone).
        per_segment: dict[str | None, tuple[tuple[QuietView, ...], bool, str]] = {}
        # Per (segment, zone): when its quiet hours let go (None: they hold nobody now).
        held: dict[tuple[str | None, str], tuple[float, int] | None] = {}
        decisions: list[Decision | None] = [None] * len(requests)
        asked: list[int] = []  # positions the limiter decides
        per_request: list[RuleSet] = []
        for i, segment in enumerate(segments):
            known = per_segment.get(segment)
            if known is None:
                known = per_segment[segment] = (
                    table.quiet_for(segment=segment, channel=channel),
                    table.needs_zone(segment=segment, channel=channel),
                    resolve_zone(requested=None, segment_zone=table.zone_of(segment)),
                )
            quiet, zoned, fallback = known
            zone = ""
            if quiet or zoned:
                # resolve_zone for this request: its own zone, else the segment's fallback.
                zone = (time_zones[i] if time_zones is not None else None) or fallback
            if quiet:
                key = (segment, zone)
                until = held.get(key, _UNKNOWN)
                if until is _UNKNOWN:
                    until = held[key] = table.quiet_release(
                        segment=segment, channel=channel, zone=zone, now=clock
                    )
                if until is not None:
                    user_id, message_id = requests[i]
                    end, spread = cast(tuple[float, int], until)
                    decision = _own(
                        user_id,
                        message_id,
                        segment=segment,
                        allowed=False,
                        reason=Reason.QUIET_HOURS,
                    )
                    # Rounded up to the millisecond: a send retried after it is never early.
                    wait = release_at(end, spread, user_id) - clock
                    decision.retry_after = math.ceil(wait * 1000) / 1000
                    decisions[i] = decision
                    continue
                if not zoned:
                    zone = ""  # the rules read no zone: one rule set for every zone
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
            asked.append(i)
            per_request.append(rule_set)
        if asked:
            limited = self.limiter.acquire(
                channel,
                requests if len(asked) == len(requests) else [requests[i] for i in asked],
                per_request,
                campaign=campaign,
                tags=tags,
                priority=priority,
                retention_ms=table.retention_ms,
                now=now,
                dry_run=dry_run,
            )
            for i, decision in zip(asked, limited, strict=True):
                decision.segment = segments[i]
                decisions[i] = decision
        return decisions  # type: ignore[return-value]  # every position is decided now

    def release(self, *, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
        _checked(channel)
        removed = self.limiter.release(channel, requests)
        released = [
            (user_id, message_id, Outcome.RELEASED)
            for (user_id, message_id), done in zip(requests, removed, strict=True)
            if done
        ]
        if released and self._ledger_on():
            # On the ledger's rows too, so that a rebuild of the logs leaves them out; a
            # send older than the longest window has no entry to give back.
            since = time.time() - self.policy.table().retention_ms / 1000
            ledger_outcomes(channel=channel, since=since, outcomes=released)
        return removed

    def outcomes(
        self, *, channel: str, since: float, outcomes: Sequence[tuple[int, str, str]]
    ) -> None:
        """Keep what became of admitted sends in the ledger: (user id, message id, outcome),
        an Outcome (limits.reasons); `since`: no earlier than their decision."""
        if self._ledger_on():
            ledger_outcomes(channel=channel, since=since, outcomes=outcomes)

    def _ledger_on(self) -> bool:
        return self.record_ledger if self.record_ledger is not None else ledger_enabled()


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
    category: str = Category.MARKETING,
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


def gate_outcomes(*, channel: str, since: float, outcomes: Sequence[tuple[int, str, str]]) -> None:
    """What became of admitted sends, for the ledger (Gate.outcomes)."""
    _default_gate.outcomes(channel=channel, since=since, outcomes=outcomes)
