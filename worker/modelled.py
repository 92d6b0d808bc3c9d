"""A send job's recipients decided at once: the gate's stages (worker/stages/, in the order
worker/gate.py's STAGES runs them) over arrays, the rules by the decision model
(limits/engine/model.py) over logs held in memory.

Each stage asks what the gate's asks, of the same objects (the suppression list's and
preferences' caches, the control group, the experiments' arms, quiet hours, the reservations'
holds, the policy table's rule sets): only the loop over recipients is numpy's. The rule sets
are made per group of recipients that share every input of one (segment, arm, zone where a
window reads it, their own frequency, the jobs that hold their sends), by the calls the rules
stage makes, so that each group's records are the gate's to the byte. Users are independent
(each decision reads and writes only its user's log), so a job's recipients decided together
are decided as the gate decides them chunk by chunk; a user listed twice in one job is not
(the caller then puts the job through the gate itself: `job_decided` answers None).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from limits.engine import log
from limits.engine.model import (
    ALLOWED,
    DUPLICATE,
    NO_LIMIT,
    ModelLogs,
    ascending_distinct,
    decide,
    grouped,
    present,
)
from limits.engine.reservations import Holds
from limits.engine.table import PolicyTable, RuleSet, RuleView
from limits.engine.topics import TopicView
from limits.engine.windows import resolve_zone
from limits.people.preferences import PreferenceCache, PreferencesUnavailable
from limits.people.suppression import SuppressionCache, SuppressionUnavailable
from limits.reasons import Reason

REASONS = tuple(Reason)
CODES = {reason: k for k, reason in enumerate(REASONS)}
_U64 = np.uint64
_MASK = (1 << 64) - 1


def user_offsets(users: np.ndarray, spread_seconds: int) -> np.ndarray:
    """limits.engine.quiet.user_offset over an array (whole seconds, int64)."""
    if spread_seconds <= 0:
        return np.zeros(users.size, dtype=np.int64)
    with np.errstate(over="ignore"):
        x = users.astype(_U64) + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        x ^= x >> _U64(31)
    return (x % _U64(spread_seconds)).astype(np.int64)


@dataclass(slots=True)
class JobDecisions:
    """Per recipient (in the order given): the reason (REASONS' index), the rule that decided or
    would have (the holdout's) as an index into `rules` (-1: none) and its count, the seconds
    after the job's start it may go (NaN: none), the job a reservation held it for (0: none),
    and the fewest sends its rules had room for (limits.engine.model.Answers.room; NO_LIMIT for
    none, and for a recipient no rule was asked about)."""

    users: np.ndarray
    reason: np.ndarray
    rule: np.ndarray
    used: np.ndarray
    retry_after: np.ndarray
    reserved_for: np.ndarray
    rules: list[RuleView]
    room: np.ndarray

    def count(self, reasons: Sequence[Reason]) -> int:
        return int(np.isin(self.reason, [CODES[r] for r in reasons]).sum())


def segment_codes(index: Any, users: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """The users' segments as job_decided takes them: each one's position in a list of
    segments, and that list (at once where the snapshot can say so, else one by one)."""
    codes = getattr(index, "resolve_codes", None)
    if codes is not None:
        return codes(users)
    return _codes(index.resolve_many(users))


def _codes(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Each value's code, and the distinct values by code (values hashable, None included)."""
    if not isinstance(values, list):
        values = list(values)
    if values and values.count(values[0]) == len(values):  # most: one value for all
        return np.zeros(len(values), dtype=np.int64), [values[0]]
    seen: dict[Any, int] = {}
    codes = np.fromiter((seen.setdefault(v, len(seen)) for v in values), np.int64, len(values))
    return codes, list(seen)


def job_decided(
    *,
    channel: str,
    campaign: str,
    tags: tuple[str, ...],
    priority: int,
    topic: TopicView | None,
    holder: int,
    users: np.ndarray,
    messages: np.ndarray,
    zones: Sequence[str | None] | None,
    now_ms: int,
    table: PolicyTable,
    segments: tuple[np.ndarray, list[str | None]] | None,
    suppressions: SuppressionCache,
    preferences: PreferenceCache,
    holds: Holds | None,
    logs: ModelLogs,
) -> JobDecisions | None:
    """The gate's decisions of one marketing call over every recipient of a job at `now_ms`
    (`users` distinct; `messages`: their message ids as limits.engine.model.message_int has
    them; `zones`: the zone each names, None for none; `segments`: as the snapshot resolves
    them, each one's position in a list of segments and that list (segment_codes), None when
    none is loaded), the rules decided by the model over `logs` (the admitted
    sends recorded there). None when a user is listed twice."""
    users = np.asarray(users, dtype=_U64)
    n = users.size
    if ascending_distinct(users).size != n:
        return None
    reason = np.full(n, -1, dtype=np.int64)
    retry_after = np.full(n, np.nan)
    out = JobDecisions(
        users=users,
        reason=reason,
        rule=np.full(n, -1, dtype=np.int64),
        used=np.zeros(n, dtype=np.int64),
        retry_after=retry_after,
        reserved_for=np.zeros(n, dtype=np.int64),
        rules=[],
        room=np.full(n, NO_LIMIT, dtype=np.int64),
    )
    if n == 0:
        return out
    listed = users.tolist()
    pending = np.ones(n, dtype=bool)

    def refuse(where: np.ndarray, why: Reason) -> None:
        reason[where & pending] = CODES[why]
        pending[where] = False

    # Suppressed (and erased people).
    try:
        suppressed = suppressions.suppressed(channel, listed)
        erased = suppressions.erased(listed)
    except SuppressionUnavailable:
        refuse(pending.copy(), Reason.UNAVAILABLE)
        return out
    for found in (erased, suppressed):
        if found is not None:
            refuse(np.asarray(found, dtype=bool), Reason.SUPPRESSED)
    # Preferences.
    asked = np.flatnonzero(pending)
    try:
        refusals = preferences.refusals(
            channel, topic, listed if asked.size == n else [listed[i] for i in asked], now_ms
        )
    except PreferencesUnavailable:
        refuse(pending.copy(), Reason.UNAVAILABLE)
        return out
    if refusals is not None:
        for i, refusal in zip(asked.tolist(), refusals, strict=True):
            if refusal is not None:
                why, _, wait = refusal
                reason[i] = CODES[why]
                retry_after[i] = np.nan if wait is None else wait
                pending[i] = False
    # No snapshot: nobody's rules are known.
    if segments is None:
        refuse(pending.copy(), Reason.UNAVAILABLE)
        return out
    segment_code, segment_names = segments
    # The control group: refused, their rules asked as a dry run (what they would have got).
    dry = np.zeros(n, dtype=bool)
    group = table.holdout
    if group is not None and pending.any():
        asked = np.flatnonzero(pending)
        held = group.held(
            [listed[i] for i in asked],
            [segment_names[c] for c in segment_code[asked].tolist()]
            if group.exclude_segments
            else [],
            tags,
        )
        if held is not None:
            dry[asked[held]] = True
            pending[asked[held]] = False
    # Each recipient's zone: their own, else their segment's, else the setting's.
    fallback = [resolve_zone(requested=None, segment_zone=table.zone_of(s)) for s in segment_names]
    zone_names = sorted(set(fallback))
    zone_code = np.asarray([zone_names.index(z) for z in fallback], dtype=np.int64)[segment_code]
    if zones is not None:
        named, names = _codes(zones)
        for k, name in enumerate(names):
            if name:
                if name not in zone_names:
                    zone_names.append(name)
                zone_code[named == k] = zone_names.index(name)
    # Quiet hours, per segment and zone.
    if table.has_quiet(channel=channel) and pending.any():
        asked = np.flatnonzero(pending)
        pairs = segment_code[asked] * len(zone_names) + zone_code[asked]
        for pair in present(pairs).tolist():
            s, z = divmod(pair, len(zone_names))
            segment = segment_names[s]
            if not table.quiet_for(segment=segment, channel=channel):
                continue
            until = table.quiet_release(
                segment=segment, channel=channel, zone=zone_names[z], now_ms=now_ms
            )
            if until is None:
                continue
            end, spread = until
            these = asked[pairs == pair]
            release = end + user_offsets(users[these], spread) * 1000
            reason[these] = CODES[Reason.QUIET_HOURS]
            retry_after[these] = (release - now_ms) / 1000
            pending[these] = False
    ruled = np.flatnonzero(pending | dry)
    if ruled.size:
        _rules(
            out,
            ruled,
            dry,
            channel=channel,
            campaign=campaign,
            tags=tags,
            priority=priority,
            topic=topic,
            holder=holder,
            messages=np.asarray(messages, dtype=_U64),
            now_ms=now_ms,
            table=table,
            segments=(segment_code, segment_names),
            zones=(zone_code, zone_names),
            preferences=preferences,
            holds=holds,
            logs=logs,
        )
    return out


def _rules(
    out: JobDecisions,
    ruled: np.ndarray,
    dry: np.ndarray,
    *,
    channel: str,
    campaign: str,
    tags: tuple[str, ...],
    priority: int,
    topic: TopicView | None,
    holder: int,
    messages: np.ndarray,
    now_ms: int,
    table: PolicyTable,
    segments: tuple[np.ndarray, list[Any]],
    zones: tuple[np.ndarray, list[Any]],
    preferences: PreferenceCache,
    holds: Holds | None,
    logs: ModelLogs,
) -> None:
    """The rules stage over the recipients at `ruled` (those of `dry` asked as a dry run)."""
    segment_code, segment_names = segments
    zone_code, zone_names = zones
    users = out.users[ruled]
    listed = users.tolist()
    m = ruled.size
    # Their arm of a running experiment.
    arms = (
        table.arms(listed, [segment_names[c] for c in segment_code[ruled].tolist()], now_ms=now_ms)
        if table.running(now_ms)
        else []
    )
    arm_keys = [None if a is None else (a[0].id, a[1]) for a in arms] if arms else [None] * m
    arm_code, arm_values = _codes(arm_keys)
    arm_of = dict(zip(arm_keys, arms, strict=True)) if arms else {None: None}
    owns = preferences.own_rules(channel, topic, listed)
    own_code, own_values = _codes(owns if owns is not None else [()] * m)
    held = holds.of(listed, priority=priority, now_ms=now_ms) if holds else None
    hold_code, hold_values = _codes(held if held is not None else [()] * m)
    seg = segment_code[ruled]
    zone = zone_code[ruled]
    # A group's key: segment, arm, zone (only where a rule reads it: a person's own rules and a
    # reservation's holds may read it too), their own rules, their holds.
    reads: dict[tuple[int, int], bool] = {}
    pair = seg * len(arm_values) + arm_code
    zoned = np.zeros(m, dtype=bool)
    for p in present(pair).tolist():
        s, a = divmod(p, len(arm_values))
        reads[(s, a)] = table.needs_zone(
            segment=segment_names[s], channel=channel, arm=arm_of[arm_values[a]]
        )
        if reads[(s, a)]:
            zoned[pair == p] = True
    personal = (own_code != own_values.index(())) if () in own_values else np.ones(m, bool)
    personal |= (hold_code != hold_values.index(())) if () in hold_values else True
    zone_key = np.where(zoned | personal, zone, -1)
    columns = [seg, arm_code, zone_key + 1, own_code, hold_code]
    key = np.zeros(m, dtype=np.int64)
    for column in columns:  # one number per group: each column a digit of its own base,
        # ranked again after each so that it stays below the recipients' count times a base
        key = grouped(key * (int(column.max()) + 1) + column)[0]
    group, first = grouped(key)
    sets: list[RuleSet] = []
    for at in first.tolist():
        s, a, z, o, h = (int(column[at]) for column in columns)
        z -= 1
        segment = segment_names[s]
        arm = arm_of[arm_values[a]]
        reads_zone = reads[(s, a)]
        user_zone = zone_names[z] if z >= 0 else ""
        zone_name = user_zone if reads_zone else ""
        rule_set = table.rule_set(
            segment=segment,
            channel=channel,
            campaign=campaign,
            tags=tags,
            priority=priority,
            zone=zone_name,
            now_ms=now_ms,
            arm=arm,
        )
        own = own_values[o]
        if own:
            own_zone = user_zone if any(rule.calendar for rule in own) else ""
            rule_set = rule_set.with_own(own, zone=zone_name or own_zone, now_ms=now_ms)
        places = hold_values[h]
        if places and holds is not None:
            calendar = any(rule.calendar for rule in rule_set.rules)
            rule_set = holds.rule_set(
                rule_set,
                places,
                channel=channel,
                campaign=campaign,
                zone=user_zone if calendar else "",
                now_ms=now_ms,
            )
        sets.append(rule_set)
    answers = decide(
        logs,
        channel=channel,
        users=users,
        messages=messages[ruled],
        sets=group,
        records=[rule_set.records for rule_set in sets],
        now_ms=now_ms,
        campaign=log.short_hash(campaign),
        tags=log.tags_bytes(tags),
        priority=priority,
        retention_ms=table.retention_ms,
        dry=dry[ruled],
        holder=holder,
    )
    _named(out, ruled, dry, answers, group, sets, priority=priority, now_ms=now_ms)


def _named(
    out: JobDecisions,
    ruled: np.ndarray,
    dry: np.ndarray,
    answers: Any,
    group: np.ndarray,
    sets: list[RuleSet],
    *,
    priority: int,
    now_ms: int,
) -> None:
    """The model's answers as the limiter's decisions name them (Limiter._decision): the
    reason of the deciding rule, or `reserved` when only a reservation's hold refused."""
    widest = max((len(s.rules) for s in sets), default=0)
    shape = (len(sets), max(widest, 1))
    why = np.zeros(shape, dtype=np.int64)
    rule_at = np.full(shape, -1, dtype=np.int64)
    hold_job = np.zeros(shape, dtype=np.int64)
    hold_start = np.zeros(shape, dtype=np.int64)
    limit_for = np.zeros(shape, dtype=np.int64)
    rules_index: dict[RuleView, int] = {}
    for k, rule_set in enumerate(sets):
        for place, view in enumerate(rule_set.rules):
            why[k, place] = CODES[view.reason()]
            rule_at[k, place] = rules_index.setdefault(view, len(rules_index))
            limit_for[k, place] = view.limit_for(priority)
            hold = rule_set.held[place] if rule_set.held else None
            if hold is not None:
                hold_job[k, place] = hold[1]
                hold_start[k, place] = hold[2]
    out.rules = list(rules_index)
    outcome = answers.outcome
    reason = np.where(outcome == ALLOWED, CODES[Reason.ALLOWED], CODES[Reason.DUPLICATE])
    refused = np.flatnonzero((outcome != ALLOWED) & (outcome != DUPLICATE))
    retry = np.full(ruled.size, np.nan)
    rule = np.full(ruled.size, -1, dtype=np.int64)
    used = np.zeros(ruled.size, dtype=np.int64)
    reserved_for = np.zeros(ruled.size, dtype=np.int64)
    if refused.size:
        s = group[refused]
        p = answers.rule[refused] - 1
        count = answers.used[refused]
        reason[refused] = why[s, p]
        rule[refused] = rule_at[s, p]
        used[refused] = count
        waits = answers.retry[refused]
        retry[refused] = np.where(waits > 0, (waits - 1) / 1000, np.nan)
        reserving = (hold_job[s, p] != 0) & (count < limit_for[s, p])
        if reserving.any():
            at = refused[reserving]
            reason[at] = CODES[Reason.RESERVED]
            reserved_for[at] = hold_job[s, p][reserving]
            retry[at] = np.maximum(0.0, (hold_start[s, p][reserving] - now_ms) / 1000)
    held_out = dry[ruled]
    reason[held_out] = CODES[Reason.HOLDOUT]
    retry[held_out] = np.nan
    reserved_for[held_out] = 0
    out.reason[ruled] = reason
    out.rule[ruled] = rule
    out.used[ruled] = used
    out.retry_after[ruled] = retry
    out.reserved_for[ruled] = reserved_for
    out.room[ruled] = answers.room
