"""Reservations: the slots a reserved scheduled job's predicted sends hold (worker/plan.py makes
them from the plan), and how the gate applies them: as a priority reserve does, by lowering the
rule's limit in the same limiter call, on the same log.

A reserved job R (priority p, starting at t) is predicted to send to some users. For each of
them and each rule r that counts R's send, a send of a priority below p before t that r counts,
and that falls into the window r will count at t (a rolling window: its length back from t; a
calendar window: t's period in the user's zone), sees r's limit lowered by the reserved sends to
come that it shares a window with (R's, and any other reserved job's r counts). It is admitted
only if r still has room: a refusal that only the hold caused is reason `reserved`, names the
rule, the sends held (`reserved`) and the first job (`reserved_for`), with `retry_after` until
that job starts. Sends of priority p or higher, and R's own, are never held back by R; once R
starts (or is cancelled) its hold is gone.

Like a priority reserve, a hold counts the rule's window as it is now: an entry that will have
left the window by t still counts against the send now (it errs toward holding the slot).

What Redis holds: no state per hold. The holds live in the processes, read from one binary value
the plan writes (`<prefix>{holds}`): per reserved job a header and its users' ids, 4 bytes each
(8 when an id is 2^32 or more) (docs/worker.md, "Reservations").
"""

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from django.conf import settings

from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.engine.log import RULE_RECORD
from limits.engine.table import ARM, RULE, RuleSet, RuleView
from limits.engine.windows import period_bounds

# Under the limiter's prefix; one hash tag, so that both are written in one transaction on a
# cluster too.
HOLDS_KEY = "{holds}"
HOLDS_VERSION_KEY = "{holds}:version"  # changes with every plan that changes them
# version 1 | jobs, then per job: id, priority, start ms, channel, campaign, tags, users
_HEAD = struct.Struct(">BI")
# id, priority, start ms, lengths of channel, campaign and tags, bytes an id, users
_JOB = struct.Struct(">QBQHHHBI")


@dataclass(frozen=True)
class HeldJob:
    """A reserved job as its holds need it."""

    id: int
    priority: int
    start_ms: int
    channel: str
    campaign: str
    tags: tuple[str, ...]

    def counted_by(self, rule: RuleView, campaign: str) -> bool:
        """Whether `rule`, applying to a send of `campaign`, counts this job's send too."""
        return rule.counts(
            channel=self.channel, tags=self.tags, campaign=self.campaign, asked=campaign
        )


@dataclass
class Holds:
    """Every reserved job's held users: one sorted array of user ids, and beside it which job
    (its place in `jobs`) holds each."""

    jobs: tuple[HeldJob, ...] = ()
    users: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    owners: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint16))
    _memo: dict[tuple[Any, ...], tuple[Any, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def by_job(self) -> list[tuple[HeldJob, np.ndarray]]:
        """Each job with its users (sorted), as holds_encode takes them."""
        return [
            (job, np.sort(self.users[self.owners == place])) for place, job in enumerate(self.jobs)
        ]

    def of(self, user_ids: list[int], *, priority: int, now_ms: int) -> list[tuple[int, ...]]:
        """Per user, the places of the jobs that hold one of their sends against a send of
        `priority` at `now_ms` (a higher priority, not started yet); () for most."""
        out: list[tuple[int, ...]] = [()] * len(user_ids)
        live = np.array(
            [j.priority > priority and j.start_ms > now_ms for j in self.jobs], dtype=bool
        )
        if not live.any() or not self.users.size:
            return out
        ids = np.asarray(user_ids, dtype=np.uint64)
        left = np.searchsorted(self.users, ids, side="left")
        right = np.searchsorted(self.users, ids, side="right")
        many = right - left
        one = np.flatnonzero(many == 1)
        if one.size:  # held by one job: the usual case, vectorised
            owners = self.owners[left[one]]
            keep = live[owners]
            for i, owner in zip(one[keep].tolist(), owners[keep].tolist(), strict=True):
                out[i] = (owner,)
        for i in np.flatnonzero(many > 1).tolist():
            places = tuple(k for k in self.owners[left[i] : right[i]].tolist() if live[k])
            if places:
                out[i] = places
        return out

    def rule_set(
        self,
        base: RuleSet,
        places: tuple[int, ...],
        *,
        channel: str,
        campaign: str,
        zone: str,
        now_ms: int,
    ) -> RuleSet:
        """`base` with each rule that counts these jobs' sends lowered by the reserved sends to
        come that a send now would share a window with (as a priority reserve lowers it): only
        the limits in its records change. Kept per rule set, jobs and zone for as long as no
        window boundary passes (a batch's users share a few)."""
        key = (base.records, channel, campaign, zone, places)
        hit = self._memo.get(key)
        if hit is None or not hit[0] <= now_ms < hit[1] or hit[3] != base.rules:
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            since, until, held, records, effective = self._held(
                base, places, campaign, zone, now_ms
            )
            made = (
                RuleSet(
                    records=records,
                    rules=base.rules,
                    effective=effective,
                    limits=base.limits,
                    held=held,
                )
                if held
                else None
            )
            # Kept with the rules it was made for (the policy table's, the same object while
            # the table stands, compared one by one): another table's rules are made again.
            hit = self._memo[key] = (since, until, made, base.rules)
        made = hit[2]
        if made is None:
            return base
        if made.limits != base.limits:
            return RuleSet(
                records=made.records,
                rules=base.rules,
                effective=made.effective,
                limits=base.limits,
                held=made.held,
            )
        return made

    def _held(
        self, base: RuleSet, places: tuple[int, ...], campaign: str, zone: str, now_ms: int
    ) -> tuple[Any, ...]:
        """(valid from, valid until, per rule its hold or None (() when none holds), records,
        effective limits) at `now_ms`."""
        jobs = [self.jobs[k] for k in places]
        held: list[tuple[int, int, int] | None] = []
        since, until = -(2**62), 2**62
        for rule in base.rules:
            counted = (
                [j for j in jobs if j.counted_by(rule, campaign)]
                if rule.kind in (RULE, ARM)  # a person's own frequency holds nothing
                else []
            )
            # The reserved sends whose window (the one the rule counts at their start) a send
            # now falls into; the first of them is named.
            sharing = []
            for job in counted:
                first, end = _window(rule, job.start_ms, zone=zone)
                if first < now_ms < end:
                    sharing.append(job)
                    since, until = max(since, first + 1), min(until, end)
                elif now_ms <= first:
                    until = min(until, first + 1)
                else:
                    since = max(since, end)
            sharing.sort(key=lambda j: j.start_ms)
            held.append((len(sharing), sharing[0].id, sharing[0].start_ms) if sharing else None)
        if not any(held):
            return (since, until, (), base.records, base.effective)
        records = bytearray(base.records)
        effective = list(base.effective)
        for n, hold in enumerate(held):
            if hold is not None:
                effective[n] = max(0, effective[n] - hold[0])
                LIMIT.pack_into(records, n * RULE_RECORD.size + LIMIT_AT, effective[n])
        return (since, until, tuple(held), bytes(records), tuple(effective))


MEMO_MAX = 100_000  # rule sets kept with their holds, per plan's holds

# A rule record's limit: its 4 bytes after kind, scope and calendar (limits.engine.log.RULE_RECORD).
LIMIT = struct.Struct(">I")
LIMIT_AT = 3


def _window(rule: RuleView, start_ms: int, *, zone: str) -> tuple[int, int]:
    """The sends at times in (first, end) fall into the window `rule` counts at `start_ms` (a
    rolling window: its length back from it; a calendar one: its period in the user's zone)."""
    if rule.calendar:
        first, end = period_bounds(zone or "UTC", rule.window_unit, start_ms)
        return first - 1, end
    return start_ms - int(rule.window_seconds or 0) * 1000, start_ms


def holds_encode(jobs: list[tuple[HeldJob, np.ndarray]]) -> bytes:
    """The holds as the plan stores them: a header per job and its users, big-endian, 4 bytes
    each when every id fits (ids below 2^32, the usual snapshot), else 8."""
    parts = [_HEAD.pack(1, len(jobs))]
    for job, users in jobs:
        names = [job.channel.encode(), job.campaign.encode(), ",".join(job.tags).encode()]
        ids = np.asarray(users, dtype=np.uint64)
        width = 4 if not ids.size or int(ids.max()) < 2**32 else 8
        parts.append(
            _JOB.pack(job.id, job.priority, job.start_ms, *(len(n) for n in names), width, ids.size)
        )
        parts += names
        parts.append(ids.astype(f">u{width}").tobytes())
    return b"".join(parts)


def holds_decode(blob: bytes) -> Holds:
    version, count = _HEAD.unpack_from(blob, 0)
    if version != 1:
        raise ValueError(f"holds format {version} is not known to this version")
    pos = _HEAD.size
    jobs: list[HeldJob] = []
    users: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for place in range(count):
        job_id, priority, start_ms, a, b, c, width, n = _JOB.unpack_from(blob, pos)
        pos += _JOB.size
        channel, campaign, tags = (
            blob[pos : pos + a].decode(),
            blob[pos + a : pos + a + b].decode(),
            blob[pos + a + b : pos + a + b + c].decode(),
        )
        pos += a + b + c
        ids = np.frombuffer(blob, dtype=f">u{width}", count=n, offset=pos).astype(np.uint64)
        pos += width * n
        jobs.append(
            HeldJob(
                job_id,
                priority,
                start_ms,
                channel,
                campaign,
                tuple(t for t in tags.split(",") if t),
            )
        )
        users.append(ids)
        owners.append(np.full(n, place, dtype=np.uint16))
    if not jobs:
        return Holds()
    all_users = np.concatenate(users)
    order = np.argsort(all_users, kind="stable")
    return Holds(
        jobs=tuple(jobs),
        users=all_users[order],
        owners=np.concatenate(owners)[order],
    )


class HoldsCache:
    """The holds the plan wrote, kept in process: every `ttl` seconds their version (a few
    bytes) is read, and the holds themselves only when it changed. A new plan's holds apply
    within seconds, as a rule's edit does."""

    def __init__(self, *, ttl: float) -> None:
        self.ttl = ttl
        self._holds = Holds()
        self._read_at = float("-inf")
        self._version: Any = None
        self._lock = threading.Lock()

    def get(self, client: Any, prefix: str, *, monotonic: float | None = None) -> Holds:
        """The holds, read again when `ttl` seconds have passed on `monotonic` (a reading of
        time.monotonic(), not an instant; None: this process's)."""
        reading = time.monotonic() if monotonic is None else monotonic
        if reading - self._read_at < self.ttl:
            return self._holds
        with self._lock:
            if reading - self._read_at >= self.ttl:
                try:
                    version = client.get(f"{prefix}{HOLDS_VERSION_KEY}")
                    if version != self._version:
                        blob = client.get(f"{prefix}{HOLDS_KEY}") if version else None
                        self._holds = holds_decode(blob) if blob else Holds()
                        self._version = version
                except REDIS_DOWN:
                    # The limiter answers `unavailable` for every send meanwhile: the holds
                    # read last stay, and are read again on the next call.
                    return self._holds
                self._read_at = reading
        return self._holds

    def clear(self) -> None:
        self._holds, self._read_at, self._version = Holds(), float("-inf"), None


def holds_store(client: Any, prefix: str, blob: bytes, version: str) -> None:
    """Write the holds (holds_encode) and then their version, in one transaction."""
    pipe = client.pipeline(transaction=True)
    pipe.set(f"{prefix}{HOLDS_KEY}", blob)
    pipe.set(f"{prefix}{HOLDS_VERSION_KEY}", version)
    pipe.execute()


@cache
def holds_cache() -> HoldsCache:
    """This process's copy of the reservations' holds (one per process)."""
    return HoldsCache(ttl=settings.GATEKEEPER_CAPS_TTL_SECONDS)


Pairs = list[tuple[HeldJob, np.ndarray]]


def _holds_rewritten(
    client: Any, prefix: str, kept_of: Callable[[Pairs], tuple[Pairs, int]], why: str
) -> int:
    """The holds in Redis rewritten as `kept_of` keeps them (each job with its users, and how
    many holds it dropped); nothing written when it drops none. Returns that count."""
    blob = client.get(f"{prefix}{HOLDS_KEY}")
    if not blob:
        return 0
    kept, dropped = kept_of(holds_decode(blob).by_job())
    if dropped:
        holds_store(client, prefix, holds_encode(kept), version=f"{why} {time.time()}")
    return dropped


def holds_without_users(client: Any, prefix: str, user_ids: list[int]) -> int:
    """Drop the users from every job's holds at once (an erasure). Returns the holds dropped."""
    gone = np.asarray(user_ids, dtype=np.uint64)

    def kept_of(pairs: Pairs) -> tuple[Pairs, int]:
        kept = [(job, users[~np.isin(users, gone)]) for job, users in pairs]
        return kept, sum(u.size for _, u in pairs) - sum(u.size for _, u in kept)

    return _holds_rewritten(client, prefix, kept_of, "erased")


def holds_without(client: Any, prefix: str, job_id: int) -> bool:
    """Drop one job's holds at once (it started, was cancelled or edited; the next plan makes
    them again if they still stand). True when it held any."""

    def kept_of(pairs: Pairs) -> tuple[Pairs, int]:
        kept = [(job, users) for job, users in pairs if job.id != job_id]
        return kept, len(pairs) - len(kept)

    return bool(_holds_rewritten(client, prefix, kept_of, f"without {job_id}"))
