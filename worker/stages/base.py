"""What a stage of the gate works on: one gate call's marketing requests (`Batch`), the
decisions made so far and the requests still pending; and what a stage is.

A stage (`Stage.run`) looks at the pending requests, decides some of them (a refusal with its
reason, or the limiter's decisions) and leaves the rest pending for the next. The gate runs the
stages in the order DESIGN.md gives (worker/gate.py, STAGES), so that a new check is a new stage
in that list and not a new branch inside another; every decision is a
limits.engine.limiter.Decision.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from limits.engine.limiter import Decider, Decision
from limits.engine.reservations import Holds
from limits.engine.table import ExperimentView, PolicyTable
from limits.engine.topics import TopicView
from limits.engine.windows import resolve_zone
from limits.people.preferences import PreferenceCache
from limits.people.suppression import SuppressionCache
from limits.reasons import Reason


@dataclass(slots=True, eq=False)
class Batch:
    """One gate call's marketing requests and what is decided of them so far."""

    channel: str
    campaign: str
    tags: tuple[str, ...]
    priority: int
    dry_run: bool
    # Epoch milliseconds, as the engine counts time: the stages are the engine's callers.
    now_ms: int | None  # the caller's clock (tests, replays); None: Redis's
    clock_ms: int  # `now_ms`, or this process's clock: what Python decides by (quiet hours)
    requests: Sequence[tuple[int, str]]
    segments: Sequence[str | None] | None  # None: no snapshot is loaded
    time_zones: Sequence[str | None] | None  # per request, the zone it names (None: none)
    table: PolicyTable
    holder: int = 0  # the send job whose run asks (0: none): what its entries are recorded for
    topic: TopicView | None = None  # what the sends are about (None: no topic)
    decisions: list[Decision | None] = field(init=False)
    pending: list[int] = field(init=False)  # positions no stage has decided, in order
    # Positions refused before the rules whose decision shows what the rules would have done
    # (the control group's): the rules stage asks for them as a dry run, in its own round trip,
    # and refuses them again with the reason given here and what it would have been.
    dry: dict[int, Reason] = field(init=False, default_factory=dict)
    _fallbacks: dict[str | None, str] = field(init=False, default_factory=dict)
    # Per request, its arm of a running experiment (the experiment and the arm's place), or
    # None; the list itself None until asked, and empty when no experiment runs.
    _arms: list[tuple[ExperimentView, int] | None] | None = field(init=False, default=None)
    _armed: list[int] = field(init=False, default_factory=list)  # positions with an arm

    def __post_init__(self) -> None:
        self.decisions = [None] * len(self.requests)
        self.pending = list(range(len(self.requests)))

    def segment(self, i: int) -> str | None:
        return self.segments[i] if self.segments is not None else None

    def zone(self, i: int) -> str:
        """The time zone request `i` is decided in: its own, else its segment's, else the
        setting's (limits.engine.windows.resolve_zone)."""
        requested = self.time_zones[i] if self.time_zones is not None else None
        if requested:
            return requested
        segment = self.segment(i)
        fallback = self._fallbacks.get(segment)
        if fallback is None:
            fallback = self._fallbacks[segment] = resolve_zone(
                requested=None, segment_zone=self.table.zone_of(segment)
            )
        return fallback

    def arms(self) -> list[tuple[ExperimentView, int] | None]:
        """Per request, its arm of a running experiment (limits.engine.table.ExperimentView: the
        experiment and the arm's place), or None: its user is in none; empty when no
        experiment runs."""
        if self._arms is None:
            self._arms = self._assigned()
        return self._arms

    def _assigned(self) -> list[tuple[ExperimentView, int] | None]:
        if not self.table.experiments:
            return []
        segments = self.segments if self.segments is not None else [None] * len(self.requests)
        found = self.table.arms(
            [user_id for user_id, _ in self.requests], segments, now_ms=self.clock_ms
        )
        self._armed = [i for i, arm in enumerate(found) if arm is not None]
        return found

    def mark_arms(self) -> None:
        """Put on every decision its user's experiment and arm (DESIGN.md: `experiment`, for
        any reason), once every stage has decided."""
        if self._arms is None:
            self._arms = self._assigned()
        named: dict[tuple[int, int], dict[str, Any]] = {}  # one per arm, shared, never changed
        for i in self._armed:
            decision, found = self.decisions[i], self._arms[i]
            if found is not None and decision is not None:
                experiment, place = found
                key = (experiment.id, place)
                shown = named.get(key)
                if shown is None:
                    shown = named[key] = {"id": experiment.id, "arm": experiment.arms[place].name}
                decision.experiment = shown
                decision.arm_place = place

    def refuse(
        self,
        i: int,
        reason: Reason,
        *,
        retry_after: float | None = None,
        preference: dict[str, Any] | None = None,
        would: Decision | None = None,
    ) -> None:
        """Decide request `i` as refused for `reason` (`preference`: what the person switched
        off; `would`: the rules' dry-run decision, whose rule and counts it then shows)."""
        user_id, message_id = self.requests[i]
        self.decisions[i] = Decision(
            user_id=user_id,
            message_id=message_id,
            allowed=False,
            reason=reason,
            counts=would.counts if would is not None else {},
            limits=would.limits if would is not None else {},
            retry_after=retry_after,
            rule=would.rule if would is not None else None,
            segment=self.segment(i),
            preference=preference,
        )

    def refuse_pending(self, reason: Reason) -> None:
        """Decide every request still pending as refused for `reason` (a check that cannot
        answer for anyone: the list never read, no snapshot)."""
        for i in self.pending:
            self.refuse(i, reason)
        self.pending = []


class Parts(Protocol):
    """What a stage may ask of the gate that runs it (a test's gate gives its own)."""

    @property
    def decider(self) -> Decider: ...

    @property
    def suppressions(self) -> SuppressionCache: ...

    @property
    def preferences(self) -> PreferenceCache: ...

    @property
    def holds(self) -> Holds: ...


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    reasons: tuple[Reason, ...]  # what it decides with
    run: Callable[[Batch, Parts], None]
