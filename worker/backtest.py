"""Backtests: the ledger's marketing requests of a period replayed, in time order, under the
policy in force and under a draft (limits.policy.drafts), by the decision model
(limits/engine/model.py, through worker.modelled.job_decided): what the draft would have
changed, per day x segment x channel x campaign.

What is replayed. Every decision the ledger holds for the period, call by call (rows of one
instant and one call's fields, in the order the gate wrote them), from the users' logs as they
stood at the period's start (the ledger's admitted sends before it, within the longer retention
of the two policies). The stages a draft cannot change keep the ledger's answer under both
policies: suppression, preferences and pauses, the control group, a person's own frequency
(rule 0), a reservation's hold, transactional sends, and what was unavailable. Quiet hours and
the rules are decided again, each user in the zone their request named (else their segment's,
else the setting's) and in the segment the ledger recorded. A send the gate admitted whose
quota was later given back (outcome failed or released) is taken out of the replayed log as
soon as it is admitted again; the gate gave it back a little later, which the ledger does not
record. Replaying the policy in force therefore reproduces the ledger: the result counts the
decisions that differ (`reproduced`), 0 unless the policy changed during the period, an
experiment ended, or a quota was given back before a later send of the same user.

Users are independent (a decision reads and writes only its user's log), so a backtest is
split by user id (`user_id % parts`), each part replayed on its own (a Celery task each) and
the parts' results summed.
"""

import itertools
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from hashlib import blake2b
from typing import Any, cast

import msgspec
import numpy as np
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from limits.engine import log
from limits.engine.model import Entries, ModelLogs, hash_int, sorted_distinct
from limits.engine.table import PolicyTable
from limits.ledger.drain import TABLE
from limits.ledger.table import row_time
from limits.models.ledger import LEDGER_OUTCOME_CODES, LedgerKind
from limits.models.policy import Rule, SettingChange
from limits.people.preferences import PreferenceCache
from limits.people.suppression import SuppressionCache
from limits.policy.bodies import DraftBody
from limits.policy.drafts import draft_applied
from limits.policy.selectors import policy_read
from limits.reasons import GIVEN_BACK, NOT_REPLAYED, Category, Reason
from worker.modelled import CODES, REASONS, job_decided
from worker.models import Backtest, BacktestPart

logger = logging.getLogger(__name__)

EXAMPLES_MAX = 20  # differences from the ledger shown, per part
NO_RULE = -(1 << 62)

ALLOWED = CODES[Reason.ALLOWED]


class _Nobody:
    """The stages before the rules, as a replay asks them: nobody is suppressed, nobody's
    preferences refuse, nobody has their own frequency (the ledger's answers for those stand)."""

    def suppressed(self, channel: str, users: Any) -> None:
        return None

    def erased(self, users: Any) -> None:
        return None

    def refusals(self, channel: str, topic: Any, users: Any, now_ms: int) -> None:
        return None

    def own_rules(self, channel: str, topic: Any, users: Any) -> None:
        return None


_NOBODY = _Nobody()


@dataclass
class _Kind:
    """A ledger kind as the replay reads it."""

    call: int  # the call's fields (channel, campaign, tags, priority, category, topic): a code
    channel: str
    campaign: str
    tags: tuple[str, ...]
    priority: int
    topic: str
    segment: int  # a code into the replay's segment names
    zone: str | None
    reason: int  # CODES
    kept: bool
    rule_id: int | None
    group: int  # (segment, channel, campaign): a code into the result's groups
    admitted: bool  # a marketing send the gate admitted (its log counts it)


@dataclass
class PartResult:
    """One part's sums: per group (day, segment, channel, campaign) the decisions by reason
    under each policy, sends gained and lost, users affected, and per rule the sends it took
    (`lost`) or gave back (`gained`); how far the policy in force reproduced the ledger."""

    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: int = 0
    differences: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)
    # The day's users with a decision that differs, per group, until the day is counted.
    affected: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def day_counted(self) -> None:
        """Count each group's users affected on the day just replayed (a user once a group)."""
        for key, found in self.affected.items():
            self.groups[key]["users_affected"] += int(sorted_distinct(np.concatenate(found)).size)
        self.affected.clear()

    def as_json(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "decisions": self.decisions,
            "differences": self.differences,
            "examples": self.examples,
        }


class _Kinds:
    """The kinds the replay met, and per kind (by its place: `place(ids)`) the columns it reads
    of them."""

    def __init__(self) -> None:
        self.by_id: dict[int, _Kind] = {}
        self.calls: dict[tuple[Any, ...], int] = {}
        self.segments: list[str | None] = []
        self.groups: list[tuple[str, str, str]] = []
        self._group_codes: dict[tuple[str, str, str], int] = {}
        self.ids = np.empty(0, dtype=np.int64)  # sorted
        self.list: list[_Kind] = []  # by place
        self.columns: dict[str, np.ndarray] = {}

    def segment_code(self, slug: str) -> int:
        name = slug or None
        if name not in self.segments:
            self.segments.append(name)
        return self.segments.index(name)

    def place(self, ids: np.ndarray) -> np.ndarray:
        """Each kind id's place in the columns (every kind read first)."""
        distinct = sorted_distinct(ids)
        missing = distinct[~np.isin(distinct, self.ids)] if self.ids.size else distinct
        if missing.size:
            self._read([int(k) for k in missing])
        return np.searchsorted(self.ids, ids)

    def _read(self, missing: list[int]) -> None:
        for row in LedgerKind.objects.filter(pk__in=missing):
            tags = tuple(row.tags or ())
            call = (row.channel, row.campaign, tags, row.priority, row.category, row.topic)
            group = (row.segment, row.channel, row.campaign)
            self.by_id[row.pk] = _Kind(
                call=self.calls.setdefault(call, len(self.calls)),
                channel=row.channel,
                campaign=row.campaign,
                tags=tags,
                priority=row.priority,
                topic=row.topic,
                segment=self.segment_code(row.segment),
                zone=row.zone or None,
                reason=CODES[Reason(row.reason)],
                kept=(
                    row.reason in NOT_REPLAYED  # the ledger's answer stands under both
                    or row.category != Category.MARKETING
                    or (row.rule_id == 0 and row.reason != Reason.ALLOWED)
                ),
                rule_id=row.rule_id,
                group=self._group_codes.setdefault(group, len(self._group_codes)),
                admitted=row.category == Category.MARKETING and row.reason == Reason.ALLOWED,
            )
            if len(self.groups) < len(self._group_codes):
                self.groups.append(group)
        self.ids = np.asarray(sorted(self.by_id), dtype=np.int64)
        self.list = [self.by_id[k] for k in self.ids.tolist()]
        slots = max((len(k.tags) for k in self.list), default=0)
        tag_slots = np.zeros((len(self.list), slots), dtype=np.uint32)
        for i, kind in enumerate(self.list):
            if kind.tags:
                packed = np.frombuffer(log.tags_bytes(kind.tags), dtype=">u4")
                tag_slots[i, : packed.size] = packed
        self.columns = {
            "call": np.asarray([k.call for k in self.list], dtype=np.int64),
            "segment": np.asarray([k.segment for k in self.list], dtype=np.int64),
            "reason": np.asarray([k.reason for k in self.list], dtype=np.int64),
            "kept": np.asarray([k.kept for k in self.list], dtype=bool),
            "admitted": np.asarray([k.admitted for k in self.list], dtype=bool),
            "rule": np.asarray(
                [NO_RULE if k.rule_id is None else k.rule_id for k in self.list], dtype=np.int64
            ),
            "group": np.asarray([k.group for k in self.list], dtype=np.int64),
            "campaign": np.asarray([_text_key(k.campaign) for k in self.list], dtype=np.uint64),
            "campaign_hash": np.asarray(
                [hash_int(log.short_hash(k.campaign)) for k in self.list], dtype=np.uint32
            ),
            "held": np.asarray(
                [(k.priority & 0xF) << log.HOLDER_BITS for k in self.list], dtype=np.uint32
            ),
            "tags": tag_slots,
        }


# --- message ids, as the replay tells them apart ---------------------------------------------------
# The replay's logs are made from the ledger alone, never read from Redis, so a message is known
# by a key of the replay's own (56 bits, as an entry keeps a message): `<text>:<digits>`, the form
# of a campaign's own message ids (which the ledger does not store), by its text's hash mixed with
# the number, at once for a whole column; any other message id by its hash.

_NUMBERED = re.compile(r"(.*):(0|[1-9][0-9]{0,18})", re.DOTALL)
_KEY_MASK = np.uint64((1 << 56) - 1)


def _mixed(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 column."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _text_key(text: str) -> int:
    return int.from_bytes(blake2b(text.encode(), digest_size=8).digest(), "big")


def _numbered_keys(texts: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """The keys of `<text>:<number>` message ids, from their texts' keys and their numbers."""
    with np.errstate(over="ignore"):
        return (
            _mixed(texts ^ _mixed(numbers.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
            & _KEY_MASK
        )


def _message_key(message_id: str) -> int:
    numbered = _NUMBERED.fullmatch(message_id)
    if numbered is not None and int(numbered[2]) < 1 << 64:
        key = _numbered_keys(
            np.asarray([_text_key(numbered[1])], dtype=np.uint64),
            np.asarray([int(numbered[2])], dtype=np.uint64),
        )
        return int(key[0])
    return _text_key(message_id) & int(_KEY_MASK)


def _instant(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


@dataclass
class _Rows:
    """Ledger rows as columns, in the order the gate wrote them: when (epoch ms), whose, their
    kind's place (_Kinds.place), their outcome's code, their message's key, their id."""

    at: np.ndarray
    user: np.ndarray
    kind: np.ndarray
    outcome: np.ndarray
    message: np.ndarray
    id: np.ndarray

    def __len__(self) -> int:
        return int(self.at.size)

    def take(self, rows: np.ndarray) -> "_Rows":
        return _Rows(
            *(getattr(self, f)[rows] for f in ("at", "user", "kind", "outcome", "message", "id"))
        )


_ROW = np.dtype(
    [("at", ">i8"), ("user", ">i8"), ("kind", ">i4"), ("outcome", ">i2"), ("id", ">i8")]
)
_GIVEN_BACK_CODES = [LEDGER_OUTCOME_CODES[o] for o in GIVEN_BACK]


def _where(
    start: datetime, end: datetime, part: int, parts: int, admitted: bool
) -> tuple[str, list[Any]]:
    where = "e.at >= %s AND e.at < %s"
    params: list[Any] = [start, end]
    if parts > 1:
        where += " AND e.user_id %% %s = %s"
        params += [parts, part]
    if admitted:
        # Not given back; which kinds admitted is told from the kinds' columns afterwards: a
        # join with the kinds here was planned as a scan per kind on day partitions never
        # analyzed (143 s for 250,000 rows where the rows alone take a second).
        codes = ", ".join(str(code) for code in _GIVEN_BACK_CODES)
        where += f" AND e.outcome NOT IN ({codes})"
    return where, params


def _read(
    start: datetime, end: datetime, kinds: _Kinds, *, part: int, parts: int, admitted: bool = False
) -> _Rows:
    """The ledger's rows of the part's users in [start, end), in the order written (`admitted`:
    only the marketing sends the gate admitted whose quota was not given back). On PostgreSQL
    the columns come back as one packed binary value, read as an array at once."""
    where, params = _where(start, end, part, parts, admitted)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT string_agg(int8send(round(extract(epoch FROM e.at) * 1000)::int8) || "
                "int8send(e.user_id) || int4send(e.kind_id) || int2send(e.outcome) || "
                f"int8send(e.id), ''::bytea ORDER BY e.at, e.id) FROM {TABLE} e WHERE {where}",
                params,
            )
            packed = cursor.fetchone()[0]
            found = np.frombuffer(bytes(packed or b""), dtype=_ROW)
            at = found["at"].astype(np.int64)
            user = found["user"].astype(np.uint64)
            kind_id = found["kind"].astype(np.int64)
            outcome = found["outcome"].astype(np.int64)
            ids = found["id"].astype(np.int64)
        else:
            cursor.execute(
                f"SELECT e.at, e.user_id, e.kind_id, e.outcome, e.id FROM {TABLE} e "
                f"WHERE {where} ORDER BY e.at, e.id",
                params,
            )
            fetched = cursor.fetchall()
            at = np.fromiter(
                (round(row_time(r[0]).timestamp() * 1000) for r in fetched), np.int64, len(fetched)
            )
            user = np.fromiter((r[1] for r in fetched), np.uint64, len(fetched))
            kind_id = np.fromiter((r[2] for r in fetched), np.int64, len(fetched))
            outcome = np.fromiter((r[3] for r in fetched), np.int64, len(fetched))
            ids = np.fromiter((r[4] for r in fetched), np.int64, len(fetched))
        cursor.execute(
            f"SELECT e.id, e.message_id FROM {TABLE} e WHERE {where} AND e.message_id IS NOT NULL",
            params,
        )
        stored = dict(cursor.fetchall())
    kind = kinds.place(kind_id) if kind_id.size else kind_id
    message = (
        _numbered_keys(kinds.columns["campaign"][kind], user)
        if kind.size
        else np.empty(0, dtype=np.uint64)
    )
    if stored:
        at_stored = np.flatnonzero(np.isin(ids, np.fromiter(stored, np.int64, len(stored))))
        message[at_stored] = [_message_key(stored[i]) for i in ids[at_stored].tolist()]
    return _Rows(at=at, user=user, kind=kind, outcome=outcome, message=message, id=ids)


def logs_at(start: datetime, keep_ms: int, kinds: _Kinds, *, part: int, parts: int) -> ModelLogs:
    """The part's users' logs as they stood at `start`: the marketing sends the ledger says
    the gate admitted in the `keep_ms` before it, less those whose quota was given back."""
    logs = ModelLogs()
    since = start - timedelta(milliseconds=keep_ms)
    rows = _read(since, start, kinds, part=part, parts=parts, admitted=True)
    if len(rows):
        rows = rows.take(np.flatnonzero(kinds.columns["admitted"][rows.kind]))
    if len(rows):
        codes = np.asarray([logs.code(k.channel) for k in kinds.list], dtype=np.int32)
        columns = kinds.columns
        logs.record(
            Entries(
                user=rows.user,
                channel=codes[rows.kind],
                at=rows.at,
                message=rows.message,
                campaign=columns["campaign_hash"][rows.kind],
                held=columns["held"][rows.kind],
                uncounted=np.zeros(len(rows), dtype=bool),
                tags=columns["tags"][rows.kind],
            )
        )
    return logs


@dataclass
class _Replay:
    """One policy's replay: its table (the control group's answers are the ledger's), its logs,
    and per row of the day its reason and deciding rule's id."""

    table: PolicyTable
    logs: ModelLogs
    reason: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    rule: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def backtest_part(
    *,
    start: date,
    end: date,
    in_force: PolicyTable,
    draft: PolicyTable,
    part: int = 0,
    parts: int = 1,
    progress: Callable[[int], None] | None = None,
) -> PartResult:
    """Replay the part's users' decisions of the UTC days `start` to `end` (inclusive) under
    both policies. `progress(n)`: called with the decisions replayed so far, after each day."""
    kinds = _Kinds()
    keep_ms = max(in_force.retention_ms, draft.retention_ms)
    logs = logs_at(_instant(start), keep_ms, kinds, part=part, parts=parts)
    replays = [
        _Replay(replace(in_force, holdout=None), logs),
        _Replay(replace(draft, holdout=None), logs.fork()),
    ]
    result = PartResult()
    day = start
    while day <= end:
        rows = _read(
            _instant(day), _instant(day + timedelta(days=1)), kinds, part=part, parts=parts
        )
        if len(rows):
            _replayed(rows, day, kinds, replays, result)
        result.decisions += len(rows)
        result.day_counted()
        if progress is not None:
            progress(result.decisions)
        day += timedelta(days=1)
    return result


def _calls(at: np.ndarray, call: np.ndarray) -> Iterator[tuple[int, int]]:
    """Each call's rows: runs of one instant and one call's fields."""
    n = at.size
    if n == 0:
        return
    cut = np.flatnonzero((at[1:] != at[:-1]) | (call[1:] != call[:-1])) + 1
    yield from itertools.pairwise([0, *cut.tolist(), n])


def _turns(users: np.ndarray) -> np.ndarray:
    """Each request's turn among its user's in the call (0 for the first)."""
    order = np.argsort(users, kind="stable")
    ranked = users[order]
    new = np.ones(users.size, dtype=bool)
    new[1:] = ranked[1:] != ranked[:-1]
    first = np.maximum.accumulate(np.where(new, np.arange(users.size), 0))
    turn = np.empty(users.size, dtype=np.int64)
    turn[order] = np.arange(users.size) - first
    return turn


def _replayed(
    rows: _Rows, day: date, kinds: _Kinds, replays: list[_Replay], result: PartResult
) -> None:
    columns = kinds.columns
    recorded = columns["reason"][rows.kind]
    kept = columns["kept"][rows.kind]
    segment = columns["segment"][rows.kind]
    given_back = np.isin(rows.outcome, _GIVEN_BACK_CODES)
    for replay in replays:
        replay.reason = recorded.copy()
        replay.rule = columns["rule"][rows.kind]
    for a, b in _calls(rows.at, columns["call"][rows.kind]):
        redo = a + np.flatnonzero(~kept[a:b])
        if redo.size == 0:
            continue
        kind = kinds.list[int(rows.kind[a])]
        now_ms = int(rows.at[a])
        turn = _turns(rows.user[redo]) if redo.size > 1 else np.zeros(1, dtype=np.int64)
        for k in range(int(turn.max()) + 1):
            these = redo[turn == k] if turn.any() else redo
            zones = [kinds.list[i].zone for i in rows.kind[these].tolist()]
            for replay in replays:
                _decided(replay, kind, these, rows, segment, zones, kinds, now_ms)
        # Given back after the call (a user's later request in the call saw it in the log).
        for replay in replays:
            back = redo[given_back[redo] & (replay.reason[redo] == ALLOWED)]
            if back.size:
                _given_back(replay.logs, kind.channel, rows.user[back], rows.message[back], now_ms)
    _summed(day, rows, kinds, recorded, replays, result)


def _decided(
    replay: _Replay,
    kind: _Kind,
    these: np.ndarray,
    rows: _Rows,
    segment: np.ndarray,
    zones: list[str | None],
    kinds: _Kinds,
    now_ms: int,
) -> None:
    decided = job_decided(
        channel=kind.channel,
        campaign=kind.campaign,
        tags=kind.tags,
        priority=kind.priority,
        topic=replay.table.topics.get(kind.topic) if kind.topic else None,
        holder=0,
        users=rows.user[these],
        messages=rows.message[these],
        zones=zones,
        now_ms=now_ms,
        table=replay.table,
        segments=(segment[these], kinds.segments),
        suppressions=cast(SuppressionCache, _NOBODY),
        preferences=cast(PreferenceCache, _NOBODY),
        holds=None,
        logs=replay.logs,
    )
    assert decided is not None  # a turn's users are distinct
    replay.reason[these] = decided.reason
    ids = np.asarray([rule.id for rule in decided.rules] + [NO_RULE], dtype=np.int64)
    replay.rule[these] = ids[decided.rule]  # -1 picks NO_RULE


def _given_back(
    logs: ModelLogs, channel: str, users: np.ndarray, messages: np.ndarray, now_ms: int
) -> None:
    """Take the sends just admitted (`users[k]` sending `messages[k]` at `now_ms`) out of the
    logs: their quota was given back."""
    order = np.argsort(users)
    users, messages = users[order], messages[order]
    entries, owner, where = logs.gathered(users)
    if not len(entries):
        return
    mask = (
        (entries.at == now_ms)
        & (entries.message == messages[owner])
        & (entries.channel == logs.code(channel))
        & ~entries.uncounted
    )
    logs.drop(where, mask)


def _summed(
    day: date,
    rows: _Rows,
    kinds: _Kinds,
    recorded: np.ndarray,
    replays: list[_Replay],
    result: PartResult,
) -> None:
    in_force, draft = replays
    group = kinds.columns["group"][rows.kind]
    width = len(REASONS)
    differs = in_force.reason != recorded
    result.differences += int(differs.sum())
    for i in np.flatnonzero(differs)[: max(0, EXAMPLES_MAX - len(result.examples))].tolist():
        result.examples.append(
            {
                "at": datetime.fromtimestamp(int(rows.at[i]) / 1000, tz=UTC).isoformat(),
                "user_id": int(rows.user[i]),
                "ledger": REASONS[int(recorded[i])].value,
                "replayed": REASONS[int(in_force.reason[i])].value,
            }
        )
    gained = (draft.reason == ALLOWED) & (in_force.reason != ALLOWED)
    lost = (in_force.reason == ALLOWED) & (draft.reason != ALLOWED)
    changed = in_force.reason != draft.reason
    order = np.argsort(group, kind="stable")
    present_groups, starts = np.unique(group[order], return_index=True)
    bounds = [*starts.tolist(), order.size]
    for g, lo, hi in zip(present_groups.tolist(), bounds[:-1], bounds[1:], strict=True):
        at = order[lo:hi]
        segment, channel, campaign = kinds.groups[g]
        key = f"{day.isoformat()}|{segment}|{channel}|{campaign}"
        entry = result.groups.setdefault(
            key,
            {
                "day": day.isoformat(),
                "segment": segment,
                "channel": channel,
                "campaign": campaign,
                "in_force": [0] * width,
                "draft": [0] * width,
                "gained": 0,
                "lost": 0,
                "users_affected": 0,
                "rules": {},
            },
        )
        for name, replay in (("in_force", in_force), ("draft", draft)):
            counts = np.bincount(replay.reason[at], minlength=width).tolist()
            entry[name] = _summed_lists(entry[name], counts)
        entry["gained"] += int(gained[at].sum())
        entry["lost"] += int(lost[at].sum())
        differing = at[changed[at]]
        if differing.size:
            result.affected.setdefault(key, []).append(rows.user[differing])
        for which, mask, rules in (("gained", gained, in_force.rule), ("lost", lost, draft.rule)):
            picked = at[mask[at]]
            if not picked.size:
                continue
            ids, counts = np.unique(rules[picked], return_counts=True)
            for rule_id, count in zip(ids.tolist(), counts.tolist(), strict=True):
                if rule_id == NO_RULE:
                    continue
                tally = entry["rules"].setdefault(str(rule_id), {"gained": 0, "lost": 0})
                tally[which] += count


# --- the job: a backtest's parts run by Celery, their sums merged ---------------------------------

PROGRESS_EVERY = 1.0  # seconds between writes of a part's progress


def policy_mark() -> int:
    """The last setting change's id (0: none): a backtest's parts all replay the policy as it
    was when it was asked for, or fail."""
    return int(SettingChange.objects.aggregate(m=Max("id"))["m"] or 0)


def backtest_part_run(*, backtest_id: int, index: int) -> bool:
    """Replay one part of a backtest, keep its sums, and merge them with the others' once every
    part is done. False when there is nothing to do (no such part, already done, or the
    backtest failed)."""
    part = (
        BacktestPart.objects.select_related("backtest")
        .filter(backtest_id=backtest_id, index=index)
        .first()
    )
    if part is None or part.finished_at is not None:
        return False
    backtest = part.backtest
    if backtest.status in (Backtest.Status.DONE, Backtest.Status.FAILED):
        return False
    Backtest.objects.filter(pk=backtest.pk, status=Backtest.Status.QUEUED).update(
        status=Backtest.Status.RUNNING
    )
    if policy_mark() != backtest.policy_mark:
        _failed(backtest, "The policy changed while the backtest waited or ran; ask again.")
        return False
    draft = draft_applied(msgspec.convert(backtest.changes, DraftBody))
    written = [time.monotonic()]

    def progress(done: int) -> None:
        if time.monotonic() - written[0] >= PROGRESS_EVERY:
            BacktestPart.objects.filter(pk=part.pk).update(done=done)
            written[0] = time.monotonic()

    try:
        result = backtest_part(
            start=backtest.start,
            end=backtest.end,
            in_force=policy_read(),
            draft=draft.table,
            part=index,
            parts=backtest.parts,
            progress=progress,
        )
    except Exception as exc:
        logger.exception("Backtest %s, part %s failed", backtest.pk, index)
        _failed(backtest, f"Part {index} failed: {exc}")
        return False
    with transaction.atomic():
        locked = Backtest.objects.select_for_update().get(pk=backtest.pk)
        BacktestPart.objects.filter(pk=part.pk).update(
            done=result.decisions,
            result={**result.as_json(), "added": {str(k): v for k, v in draft.added.items()}},
            finished_at=timezone.now(),
        )
        parts = list(locked.part_rows.order_by("index"))
        if locked.status == Backtest.Status.RUNNING and all(p.finished_at for p in parts):
            locked.result = merged([p.result for p in parts if p.result is not None])
            locked.status = Backtest.Status.DONE
            locked.finished_at = timezone.now()
            locked.save(update_fields=["result", "status", "finished_at"])
    return True


def _failed(backtest: Backtest, why: str) -> None:
    Backtest.objects.filter(pk=backtest.pk).exclude(status=Backtest.Status.DONE).update(
        status=Backtest.Status.FAILED, error=why, finished_at=timezone.now()
    )


def _summed_lists(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in itertools.zip_longest(a, b, fillvalue=0)]


def _reasons(counts: list[int]) -> dict[str, int]:
    return {REASONS[k].value: n for k, n in enumerate(counts) if n}


SUMS = ("gained", "lost", "users_affected")


def _sums() -> dict[str, Any]:
    return {"in_force": [], "draft": [], **dict.fromkeys(SUMS, 0), "rules": {}}


def _added(into: dict[str, Any], entry: dict[str, Any]) -> None:
    """Add one group's sums (a part's, or a row's) into `into`."""
    for which in ("in_force", "draft"):
        into[which] = _summed_lists(into[which], entry[which])
    for which in SUMS:
        into[which] += entry[which]
    for rule_id, tally in entry["rules"].items():
        sums = into["rules"].setdefault(rule_id, {"gained": 0, "lost": 0})
        sums["gained"] += tally["gained"]
        sums["lost"] += tally["lost"]


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The parts' sums as the backtest's result (docs/api.md, backtests)."""
    names: dict[int, tuple[str, bool]] = {
        pk: (name, False) for pk, name in Rule.objects.values_list("pk", "name")
    }
    groups: dict[str, dict[str, Any]] = {}
    examples: list[dict[str, Any]] = []
    for part in parts:
        names.update({int(k): (v, True) for k, v in part["added"].items()})
        examples.extend(part["examples"])
        for key, entry in part["groups"].items():
            _added(groups.setdefault(key, {**entry, **_sums()}), entry)

    def rules_shown(tallies: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
        shown = []
        for rule_id, tally in tallies.items():
            name, drafted = names.get(int(rule_id), ("", False))
            shown.append(
                {
                    "rule": None if drafted else int(rule_id),
                    "name": name or f"rule {rule_id} (deleted since)",
                    "in_draft_only": drafted,
                    **tally,
                }
            )
        return sorted(shown, key=lambda r: -(r["gained"] + r["lost"]))

    rows = []
    total = _sums()
    for key in sorted(groups):
        entry = groups[key]
        _added(total, entry)
        rows.append(
            {
                "day": entry["day"],
                "segment": entry["segment"],
                "channel": entry["channel"],
                "campaign": entry["campaign"],
                "in_force": _reasons(entry["in_force"]),
                "draft": _reasons(entry["draft"]),
                "gained": entry["gained"],
                "lost": entry["lost"],
                "users_affected": entry["users_affected"],
                "rules": rules_shown(entry["rules"]),
            }
        )
    decisions = sum(part["decisions"] for part in parts)
    return {
        "decisions": decisions,
        "reproduced": {
            "decisions": decisions,
            "differences": sum(part["differences"] for part in parts),
            "examples": examples[:EXAMPLES_MAX],
        },
        "totals": {
            **{which: total[which] for which in SUMS},
            "in_force": _reasons(total["in_force"]),
            "draft": _reasons(total["draft"]),
        },
        "rules": rules_shown(total["rules"]),
        "rows": rows,
    }
