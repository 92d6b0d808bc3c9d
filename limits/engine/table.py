"""Which rules apply to a send, as the gate, the quota and the what-if read them.

`PolicyTable` is every enabled rule (classic caps' rules included), the classic caps and the
segments' time zones, read from the database in one go and kept in process for a couple of
seconds (limits.policy.selectors). For one gate call it resolves, per segment and time zone, the
rules that apply and encodes them for the limiter (`RuleSet`): a calendar rule's period starts are
computed here, in the user's zone, and a priority reserve is applied to the limit.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from gatekeeper.lib.instants import ms_checked
from gatekeeper.lib.integers import INT32_MAX
from limits.channels import ALL
from limits.engine.assignment import HoldoutView, arms_of
from limits.engine.log import calendar_record, rolling_record
from limits.engine.quiet import QuietView, quiet_until
from limits.engine.topics import TopicView
from limits.engine.windows import LONGEST, period_starts
from limits.reasons import Reason

DAY_SECONDS, WEEK_SECONDS = 86_400, 604_800
MIN_RETENTION = timedelta(days=7)
# A person may always count their own week, any 7 days or a calendar one (Monday to Sunday in
# their zone: 7 days and an hour when the clocks go back that week).
OWN_WEEK = LONGEST["week"]
ROLLING_SECONDS = (60, 7_776_000)  # 1 minute to 90 days
PRIORITIES = (0, 9)
DEFAULT_PRIORITY = 5
# Whose a rule is: a marketer's, a person's own frequency, or an experiment's arm's.
RULE, PERSON, ARM = "rule", "person", "arm"
# A rule of an arm as decisions name it: -(the arm's id * ARM_RULE_IDS + its place + 1), so
# that it never meets a rule's id (positive) nor a person's own frequency (0) in the ledger.
ARM_RULE_IDS = 100


def arm_rule_id(arm_pk: int, place: int) -> int:
    return -(arm_pk * ARM_RULE_IDS + place + 1)


def arm_of_rule_id(rule_id: int) -> tuple[int, int] | None:
    """(the arm's id, the rule's place in it) of an arm rule's id; None for any other id."""
    if rule_id >= 0:
        return None
    arm_pk, place = divmod(-rule_id - 1, ARM_RULE_IDS)
    return arm_pk, place


@dataclass(frozen=True, slots=True)
class RuleView:
    """An enabled rule, as decisions need it."""

    id: int
    name: str
    segment: str | None
    channel: str
    match: str
    tag: str
    window_kind: str
    window_seconds: int | None
    window_unit: str
    limit: int
    reserve_below_priority: int | None
    reserve_slots: int | None
    classic: bool = False
    kind: str = RULE  # or PERSON: a person's own frequency (limits.people.preferences)

    @property
    def calendar(self) -> bool:
        return self.window_kind == "calendar"

    def window(self) -> dict[str, Any]:
        if self.calendar:
            return {"kind": "calendar", "unit": self.window_unit}
        return {"kind": "rolling", "seconds": self.window_seconds}

    def reason(self) -> Reason:
        """The reason of a refusal by this rule (DESIGN.md, Gate): a person's own is `cap`."""
        if self.kind == PERSON:
            return Reason.CAP
        if self.limit == 0:
            return Reason.BLOCKED
        if self.window_seconds == DAY_SECONDS or self.window_unit == "day":
            return Reason.DAILY_CAP
        if self.window_seconds == WEEK_SECONDS or self.window_unit == "week":
            return Reason.WEEKLY_CAP
        return Reason.CAP

    def counts(self, *, channel: str, tags: tuple[str, ...], campaign: str, asked: str) -> bool:
        """Whether this rule, deciding a send of campaign `asked`, counts a send on `channel`
        carrying `tags` of `campaign` (the one place that says so in Python; the limiter's
        function counts the log by the same terms)."""
        if self.channel not in (channel, ALL):
            return False
        if self.match == "tag":
            return self.tag in tags
        if self.match == "campaign":
            return bool(asked) and campaign == asked
        return True

    def limit_for(self, priority: int) -> int:
        """The limit a send of `priority` must fit: less the reserve when it is below it."""
        if (
            self.reserve_below_priority is not None
            and self.reserve_slots
            and priority < self.reserve_below_priority
        ):
            return max(0, self.limit - self.reserve_slots)
        return self.limit

    def keeps(self) -> timedelta:
        """How long the log must keep entries for this rule to count them."""
        if self.calendar:
            return LONGEST[self.window_unit]
        return timedelta(seconds=self.window_seconds or 0)

    def record(self, *, limit: int, zone: str, now_ms: int) -> bytes:
        every_channel = self.channel == ALL
        if self.calendar:
            return calendar_record(
                kind=self.match,
                every_channel=every_channel,
                limit=limit,
                starts=period_starts(zone, self.window_unit, now_ms),
                tag=self.tag,
            )
        return rolling_record(
            kind=self.match,
            every_channel=every_channel,
            limit=limit,
            seconds=int(self.window_seconds or 0),
            tag=self.tag,
        )

    def as_decision(self, used: int) -> dict[str, Any]:
        """The decision's `rule` object."""
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "window": self.window(),
            "limit": self.limit,
            "used": used,
        }


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules one request must fit, encoded for the limiter, and what its decision shows:
    the rules (by position), each one's limit after the reserve, and the classic caps of the
    request's channel."""

    records: bytes
    rules: tuple[RuleView, ...]
    effective: tuple[int, ...]
    limits: dict[str, int | None]
    # Per rule, a reservation's hold on it (limits.engine.reservations): (sends held, the job, its
    # start in ms), or None; empty: no hold at all.
    held: tuple[tuple[int, int, int] | None, ...] = ()

    def with_own(self, own: Sequence[RuleView], *, zone: str, now_ms: int) -> "RuleSet":
        """These rules and a person's own (their frequency on the channel), counted on the same
        log in the same call: a refusal by one of theirs names it (`kind` person)."""
        if not own:
            return self
        return RuleSet(
            records=self.records
            + b"".join(rule.record(limit=rule.limit, zone=zone, now_ms=now_ms) for rule in own),
            rules=self.rules + tuple(own),
            effective=self.effective + tuple(rule.limit for rule in own),
            limits=self.limits,
        )


# No rule at all: what the logs hold of a send, and a claim that counts against nothing.
NO_RULES = RuleSet(records=b"", rules=(), effective=(), limits={})


@dataclass(frozen=True, slots=True)
class ArmView:
    """One arm of a running experiment (limits/studies/experiments.py): its rules (kind `arm`),
    which replace the segment's own rules on the channels they name, or are added to them."""

    name: str
    mode: str  # "replace" or "add"
    rules: tuple[RuleView, ...]

    def replaces(self, rule: RuleView, segment: str | None) -> bool:
        """Whether `rule` gives way to this arm's rules for the users of `segment`'s
        experiment: a rule of the segment's own (not every segment's, not a classic cap's) on a
        channel the arm names (every channel, for an arm rule on `all`)."""
        if self.mode != "replace" or rule.classic or rule.segment != segment:
            return False
        return any(own.channel in (ALL, rule.channel) for own in self.rules)


@dataclass(frozen=True, slots=True)
class ExperimentView:
    """A live experiment as the gate reads it: whose users it splits, when, and its arms."""

    id: int
    segment: str | None  # None: every segment
    salt: str
    starts_ms: int
    ends_ms: int
    shares: tuple[float, ...]
    arms: tuple[ArmView, ...]

    def running(self, now_ms: int) -> bool:
        return self.starts_ms <= now_ms < self.ends_ms


@dataclass(frozen=True)
class PolicyTable:
    rules: tuple[RuleView, ...]
    classic: dict[tuple[str, str], tuple[int | None, int | None]]
    zones: dict[str, str]
    quiet: tuple[QuietView, ...] = ()
    topics: dict[str, TopicView] = field(default_factory=dict)  # by slug
    # The longest window of any person's own frequency (limits.people.preferences), in ms: the logs
    # keep what it counts even after the rules that allowed it are gone.
    own_keeps_ms: int = 0
    holdout: HoldoutView | None = None  # the global control group (None: none)
    experiments: tuple[
        ExperimentView, ...
    ] = ()  # active and not ended (limits/studies/experiments.py)
    _candidates: dict[tuple[str | None, str], tuple[RuleView, ...]] = field(
        default_factory=dict, compare=False
    )
    _quiet: dict[tuple[str | None, str], tuple[QuietView, ...]] = field(
        default_factory=dict, compare=False
    )
    _released: dict[tuple[str | None, str, str, int], tuple[int, int] | None] = field(
        default_factory=dict, compare=False
    )
    _armed: dict[tuple[str | None, str, int, str], tuple[RuleView, ...]] = field(
        default_factory=dict, compare=False
    )

    @property
    def retention_ms(self) -> int:
        """How long logs keep entries: the longest window of any enabled rule or of any
        person's own frequency, 7 days at least."""
        return max(int(self.rules_keep().total_seconds() * 1000), self.own_keeps_ms)

    def rules_keep(self) -> timedelta:
        """The longest window of any enabled rule, 7 days at least."""
        arms = (rule for e in self.experiments for arm in e.arms for rule in arm.rules)
        longest = max((rule.keeps() for rule in (*self.rules, *arms)), default=MIN_RETENTION)
        return max(longest, MIN_RETENTION)

    def own_keep(self) -> timedelta:
        """The longest a person's own frequency may count: the longest window of the enabled
        rules, and a week whatever they are, a calendar week included (7 days and the hour of
        a DST change, as a calendar rule of a week keeps). The logs then keep what it counts
        (`own_keeps_ms`), as they keep what the rules count."""
        return max(self.rules_keep(), OWN_WEEK)

    def running(self, now_ms: int) -> tuple[ExperimentView, ...]:
        """The experiments running at `now_ms` (at most one on any user: limits.studies.experiments
        refuses overlaps)."""
        return tuple(e for e in self.experiments if e.running(now_ms))

    def arms(
        self, user_ids: Sequence[int], segments: Sequence[str | None], *, now_ms: int
    ) -> list[tuple[ExperimentView, int] | None]:
        """Per user (in their segment), their arm of the experiment running at `now_ms` (the
        experiment and the arm's place, by the keyed hash of their id), or None; an empty list
        when no experiment runs."""
        running = self.running(now_ms)
        if not running:
            return []
        found: list[tuple[ExperimentView, int] | None] = [None] * len(user_ids)
        for experiment in running:
            positions = (
                list(range(len(user_ids)))
                if experiment.segment is None
                else [k for k, s in enumerate(segments) if s == experiment.segment]
            )
            if not positions:
                continue
            places = arms_of([user_ids[k] for k in positions], experiment.salt, experiment.shares)
            for k, place in zip(positions, places.tolist(), strict=True):
                if place >= 0:
                    found[k] = (experiment, place)
        return found

    def candidates(
        self,
        *,
        segment: str | None,
        channel: str,
        arm: tuple[ExperimentView, int] | None = None,
    ) -> tuple[RuleView, ...]:
        """The rules of a segment (theirs and every segment's) on a channel and on `all`; for
        the users of an experiment's arm (`arm`: the experiment and the arm's place), what the
        arm replaces left out and its own rules added."""
        key = (segment, channel)
        found = self._candidates.get(key)
        if found is None:
            found = tuple(
                rule
                for rule in self.rules
                if rule.segment in (None, segment) and rule.channel in (channel, ALL)
            )
            self._candidates[key] = found
        if arm is None:
            return found
        experiment, place = arm
        armed_key = (segment, channel, experiment.id, experiment.arms[place].name)
        armed = self._armed.get(armed_key)
        if armed is None:
            view = experiment.arms[place]
            armed = self._armed[armed_key] = tuple(
                rule for rule in found if not view.replaces(rule, experiment.segment)
            ) + tuple(rule for rule in view.rules if rule.channel in (channel, ALL))
        return armed

    def applicable(
        self,
        *,
        segment: str | None,
        channel: str,
        campaign: str,
        tags: tuple[str, ...],
        arm: tuple[ExperimentView, int] | None = None,
    ) -> tuple[RuleView, ...]:
        """The rules a send must fit: every-send rules, tag rules of its tags, and per-campaign
        rules when it names a campaign (`arm`: the user's arm of a running experiment)."""
        return tuple(
            rule
            for rule in self.candidates(segment=segment, channel=channel, arm=arm)
            if rule.counts(channel=channel, tags=tags, campaign=campaign, asked=campaign)
        )

    def classic_limits(self, *, segment: str | None, channel: str) -> dict[str, int | None]:
        daily, weekly = self.classic.get((segment or "", channel), (None, None))
        return {"daily": daily, "weekly": weekly}

    def tags(self) -> set[str]:
        """The tags some rule counts."""
        return {rule.tag for rule in self.rules if rule.match == "tag"}

    def zone_of(self, segment: str | None) -> str:
        return self.zones.get(segment or "", "")

    def rule_set(
        self,
        *,
        segment: str | None,
        channel: str,
        campaign: str,
        tags: tuple[str, ...],
        priority: int,
        zone: str,
        now_ms: int,
        arm: tuple[ExperimentView, int] | None = None,
    ) -> RuleSet:
        rules = self.applicable(
            segment=segment, channel=channel, campaign=campaign, tags=tags, arm=arm
        )
        return encode(
            rules,
            priority=priority,
            zone=zone,
            now_ms=now_ms,
            limits=self.classic_limits(segment=segment, channel=channel),
        )

    def quiet_for(self, *, segment: str | None, channel: str) -> tuple[QuietView, ...]:
        """The quiet hours of a segment (its own and every segment's) on a channel and `all`."""
        key = (segment, channel)
        found = self._quiet.get(key)
        if found is None:
            found = tuple(
                entry
                for entry in self.quiet
                if entry.segment in (None, segment) and entry.channel in (channel, ALL)
            )
            self._quiet[key] = found
        return found

    def has_quiet(self, *, channel: str) -> bool:
        """Whether any enabled quiet hours hold sends on `channel` (their own or `all`'s)."""
        return any(entry.channel in (channel, ALL) for entry in self.quiet)

    def quiet_release(
        self, *, segment: str | None, channel: str, zone: str, now_ms: int
    ) -> tuple[int, int] | None:
        """When the quiet hours that hold a send at `now_ms` let it go: (epoch ms, spread in
        seconds), or None when none holds it. Kept per minute: a window opens and closes on a
        whole minute of the user's clock, and zones change offsets on whole minutes, so every
        send of that minute gets the same answer."""
        minute = ms_checked(now_ms) // 60_000
        key = (segment, channel, zone, minute)
        if key in self._released:
            return self._released[key]
        entries = self.quiet_for(segment=segment, channel=channel)
        end, spread = quiet_until(entries, zone, minute * 60_000)
        found = (end, spread) if end > minute * 60_000 else None
        if len(self._released) >= 100_000:
            self._released.clear()
        self._released[key] = found
        return found

    def needs_zone(
        self, *, segment: str | None, channel: str, arm: tuple[ExperimentView, int] | None = None
    ) -> bool:
        """Whether any rule of the segment on the channel (in `arm`) depends on the user's
        zone."""
        return any(
            rule.calendar for rule in self.candidates(segment=segment, channel=channel, arm=arm)
        )


def encode(
    rules: Sequence[RuleView],
    *,
    priority: int,
    zone: str,
    now_ms: int,
    limits: dict[str, int | None] | None = None,
) -> RuleSet:
    """Rules as the limiter takes them, windows resolved at `now_ms` in `zone` and each limit
    less its reserve for a send of `priority`."""
    effective = tuple(rule.limit_for(priority) for rule in rules)
    records = b"".join(
        rule.record(limit=limit, zone=zone, now_ms=now_ms)
        for rule, limit in zip(rules, effective, strict=True)
    )
    return RuleSet(records=records, rules=tuple(rules), effective=effective, limits=limits or {})


def own_rule(*, channel: str, window: dict[str, Any], limit: int) -> RuleView:
    """A person's own frequency on a channel as a rule of theirs: every send on the channel,
    `window` as a rule's JSON has it ({"kind": "rolling", "seconds"} or {"kind": "calendar",
    "unit"}); no reserve (it binds every priority alike)."""
    calendar = window.get("kind") == "calendar"
    return RuleView(
        id=0,
        name="Their own frequency",
        segment=None,
        channel=channel,
        match="any",
        tag="",
        window_kind="calendar" if calendar else "rolling",
        window_seconds=None if calendar else int(window.get("seconds") or 0),
        window_unit=str(window.get("unit") or "") if calendar else "",
        limit=limit,
        reserve_below_priority=None,
        reserve_slots=None,
        kind=PERSON,
    )


def counting_rule(
    *, channel: str, seconds: int, limit: int = INT32_MAX, name: str = ""
) -> RuleView:
    """A rule that only counts (the quota's classic figures, sends in a recent interval)."""
    return RuleView(
        id=0,
        name=name,
        segment=None,
        channel=channel,
        match="any",
        tag="",
        window_kind="rolling",
        window_seconds=seconds,
        window_unit="",
        limit=limit,
        reserve_below_priority=None,
        reserve_slots=None,
    )
