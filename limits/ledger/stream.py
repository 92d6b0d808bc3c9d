"""The send ledger's Redis stream: what the gate and the worker append, and the format of its
entries.

The ledger keeps every gate decision of a marketing send (and every exempt transactional one;
never a dry run) durably in the database, for a user's history, capped-send analytics and
rebuilding Redis's logs after Redis lost them. It is written in two steps, the database kept off
the hot path:

1. **Append** (here; the gate, per call, the one cost it pays): one XADD to the Redis stream
   `<prefix>ledger` holding the whole batch packed with msgpack (the call's own fields once,
   then per decision its user id, message id, segment, reason and deciding rule, and on one a
   round outranked the send job that won and that job's value): one round trip and about 30
   bytes per decision, however large the batch. The worker appends what became of the admitted
   sends (sent, failed, ambiguous, released), and a round's run the sends it outranked, the
   same way.
2. **Drain** (limits/ledger/drain.py, beat every 2 s): the entries written into the database
   exactly once.

What a crash can lose (docs/ledger.md): a gate process that dies between the limiter's answer
and the XADD loses that call's decisions from the ledger (Redis's logs have them); Redis losing
its data loses the entries not drained yet (a few seconds' worth) together with its logs.
Nothing else.
"""

import logging
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from django.conf import settings

from gatekeeper.lib.redis_client import REDIS_DOWN, RedisClient, get_redis
from limits.reasons import OUTCOMES, Reason

logger = logging.getLogger(__name__)

STREAM = "ledger"
DECIDED_ROWS = 1  # a stream entry of decisions, a list per decision (the first version)
DECIDED = 3  # a stream entry of decisions, a column at a time
OUTCOMES_ENTRY = 2  # a stream entry of outcomes (sent, failed, ambiguous, released), not decisions


def stream_key() -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}{STREAM}"


def ledger_enabled() -> bool:
    return bool(settings.GATEKEEPER_LEDGER)


def ledger_append(
    *,
    at_ms: int,
    channel: str,
    campaign: str,
    tags: Sequence[str],
    priority: int,
    category: str,
    snapshot_version: str,
    decisions: Sequence[Any],
    topic: str = "",
    time_zones: Sequence[str | None] | None = None,
    outranked: Sequence[tuple[int, float] | None] | None = None,
    client: RedisClient | None = None,
) -> bool:
    """Append one gate call's decisions, made at `at_ms` (epoch ms, the gate's clock), to the
    ledger's stream. `time_zones`: per decision, the zone its request named (None: none),
    aligned with `decisions`; None when no request named one. `outranked`: per decision, the
    send job a round gave the user's slot to and what its send was worth to them, (job id,
    value), on a decision of reason `outranked` (None on any other), aligned with `decisions`;
    None when none was outranked. False (and a warning) when Redis cannot take them: the
    decisions stand, the ledger misses them. ValueError for zones or outranked sends not one
    per decision, or an outranked send that is not a decision's of reason `outranked`, or not a
    job id (1 or more) and a value (a finite number, 0 or more), before anything is appended."""
    if not decisions:
        return True
    if time_zones is not None and len(time_zones) != len(decisions):
        raise ValueError(f"{len(time_zones)} time zones for {len(decisions)} decisions")
    by, values = _outranked(decisions, outranked)
    packed = msgspec.msgpack.encode(
        Decided(
            at_ms=at_ms,
            channel=channel,
            campaign=campaign,
            tags=list(tags),
            priority=priority,
            category=category,
            version=snapshot_version,
            users=[d.user_id for d in decisions],
            messages=[d.message_id for d in decisions],
            segments=[d.segment or "" for d in decisions],
            reasons=[d.reason for d in decisions],
            rules=[d.rule["id"] if d.rule else None for d in decisions],
            topic=topic,
            arms=_arm_codes(decisions),
            zones=_zones(time_zones),
            by=by,
            values=values,
        )
    )
    return _append(packed, f"{len(decisions)} decisions", client)


def _outranked(
    decisions: Sequence[Any], outranked: Sequence[tuple[int, float] | None] | None
) -> tuple[list[int], list[float]]:
    """Per decision, the job that outranked it (0: none) and that job's value to the user (0:
    none); both empty when none was outranked. ValueError for what ledger_append refuses."""
    if outranked is None:
        return [], []
    if len(outranked) != len(decisions):
        raise ValueError(f"{len(outranked)} outranked sends for {len(decisions)} decisions")
    if all(found is None for found in outranked):
        return [], []
    by, values = [], []
    for place, (decision, found) in enumerate(zip(decisions, outranked, strict=True)):
        if found is None:
            by.append(0)
            values.append(0.0)
            continue
        if decision.reason != Reason.OUTRANKED:
            raise ValueError(
                f"decision {place} is {decision.reason!r}: only an outranked one names the job "
                f"that outranked it"
            )
        job, value = found
        if isinstance(job, bool) or not isinstance(job, int) or job < 1:
            raise ValueError(f"decision {place} is outranked by {job!r}, not a send job's id")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"decision {place}'s outranking value {value!r} is not a number")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"decision {place}'s outranking value {value!r} is not 0 or more")
        by.append(job)
        values.append(float(value))
    return by, values


def _zones(time_zones: Sequence[str | None] | None) -> list[str]:
    """Per decision, the zone its request named ("": none); empty when none named one."""
    if time_zones is None or not any(time_zones):
        return []
    return [zone or "" for zone in time_zones]


ARM_CODES = 8  # an arm's code: experiment id * ARM_CODES + its place + 1 (0: none)


def _arm_codes(decisions: Sequence[Any]) -> list[int]:
    """Per decision, its experiment and arm as one number (0: none); empty when none is in
    one."""
    if all(d.experiment is None for d in decisions):
        return []
    return [
        d.experiment["id"] * ARM_CODES + d.arm_place + 1 if d.experiment is not None else 0
        for d in decisions
    ]


def arm_of_code(code: int) -> tuple[int, int] | None:
    """(experiment id, arm place) of an arm's code; None for 0."""
    if not code:
        return None
    experiment, place = divmod(code - 1, ARM_CODES)
    return experiment, place


def ledger_outcomes(
    *,
    channel: str,
    since_ms: int,
    outcomes: Sequence[tuple[int, str, str]],
    client: RedisClient | None = None,
) -> bool:
    """Append what became of admitted sends: (user id, message id, outcome) with an outcome of
    OUTCOMES (limits.reasons). The drain writes it on the send's rows: every decision admitting
    that message to that user on `channel` at or after `since_ms` (epoch ms). `released` (its
    quota given back) does not replace an outcome already known (a send that failed is released
    too).
    ValueError for an outcome of another name, before anything is appended."""
    if not outcomes:
        return True
    for _, _, outcome in outcomes:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown send outcome {outcome!r}; one of {', '.join(OUTCOMES)}")
    packed = msgspec.msgpack.encode(
        Outcomes(since_ms=since_ms, channel=channel, rows=list(outcomes))
    )
    return _append(packed, f"{len(outcomes)} send outcomes", client)


def _append(packed: bytes, what: str, client: RedisClient | None) -> bool:
    try:
        (client or get_redis()).xadd(
            stream_key(),
            {"d": packed},
            maxlen=settings.GATEKEEPER_LEDGER_BUFFER_MAX,
            approximate=True,
        )
    except REDIS_DOWN as exc:
        logger.warning("%s could not be written to the ledger: %s", what, exc)
        return False
    return True


class Decided(msgspec.Struct, array_like=True, tag=DECIDED, frozen=True):
    """A stream entry of one gate call's decisions, as ledger_append packs it: the call's own
    fields once, then its decisions a column at a time (cheaper to pack and unpack than a list
    per decision)."""

    at_ms: int
    channel: str
    campaign: str
    tags: list[str]
    priority: int
    category: str
    version: str
    users: list[int]
    messages: list[str]
    segments: list[str]
    reasons: list[str]
    rules: list[int | None]  # the deciding rule's id
    # What the sends are about ("": no topic). Last and with a default: an entry written before
    # sends had topics reads as none, and a drainer of that version ignores it.
    topic: str = ""
    # Per decision, its experiment and arm (ARM_CODES; 0: none); empty: none in one. Last and
    # with a default, as the topic.
    arms: list[int] = []
    # Per decision, the time zone its request named ("": none, so its segment's, else the
    # setting's); empty: no request named one. Last and with a default, as the topic.
    zones: list[str] = []
    # Per decision of reason `outranked`, the send job a round gave the user's slot to (0: not
    # outranked), and what that job's send was worth to the user (0 where not outranked);
    # both empty: none outranked. Last and with defaults, as the topic.
    by: list[int] = []
    values: list[float] = []

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.at_ms / 1000, tz=UTC)

    def arm_codes(self) -> list[int]:
        return self.arms or [0] * len(self.users)

    def zone_names(self) -> list[str]:
        """Per decision, the zone its request named ("": none)."""
        return self.zones or [""] * len(self.users)

    def outranked_by(self) -> list[int]:
        """Per decision, the send job that outranked it (0: none)."""
        return self.by or [0] * len(self.users)

    def rows(self) -> Iterator[tuple[int, str, str, str, int | None]]:
        """(user id, message id, segment, reason, rule id) per decision."""
        return zip(self.users, self.messages, self.segments, self.reasons, self.rules, strict=True)


class DecidedRows(msgspec.Struct, array_like=True, tag=DECIDED_ROWS, frozen=True):
    """The first version's entry of decisions (a list per decision): still read, so that an
    upgrade loses none of what was waiting in the stream."""

    at_ms: int
    channel: str
    campaign: str
    tags: list[str]
    priority: int
    category: str
    version: str
    rows: list[tuple[int, str, str, str, int | None]]

    def decided(self) -> Decided:
        users, messages, segments, reasons, rules = (
            [list(column) for column in zip(*self.rows, strict=True)] if self.rows else [[]] * 5
        )
        return Decided(
            self.at_ms, self.channel, self.campaign, self.tags, self.priority, self.category,
            self.version, users, messages, segments, reasons, rules,
        )  # fmt: skip


class Outcomes(msgspec.Struct, array_like=True, tag=OUTCOMES_ENTRY, frozen=True):
    """A stream entry of send outcomes, as ledger_outcomes packs it."""

    since_ms: int
    channel: str
    rows: list[tuple[int, str, str]]  # user, message, outcome

    @property
    def since(self) -> datetime:
        return datetime.fromtimestamp(self.since_ms / 1000, tz=UTC)


_ENTRY = msgspec.msgpack.Decoder(Decided | DecidedRows | Outcomes)


def ledger_entry(packed: bytes) -> Decided | Outcomes:
    """A stream entry, its types checked: a gate call's decisions, or send outcomes. Raises
    msgspec.DecodeError (or ValueError) for what no gate of this version writes."""
    entry = _ENTRY.decode(packed)
    if isinstance(entry, DecidedRows):
        return entry.decided()
    if isinstance(entry, Outcomes):
        for _, _, outcome in entry.rows:
            if outcome not in OUTCOMES:
                raise ValueError(f"unknown send outcome {outcome!r}")
        return entry
    if (
        not (
            len(entry.users)
            == len(entry.messages)
            == len(entry.segments)
            == len(entry.reasons)
            == len(entry.rules)
        )
        or len(entry.zones) not in (0, len(entry.users))
        or not (len(entry.by) == len(entry.values) and len(entry.by) in (0, len(entry.users)))
    ):
        raise ValueError("a ledger entry's columns are not of one length")
    return entry
