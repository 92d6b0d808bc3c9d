"""Reservations: the slots a reserved scheduled job's predicted sends hold (worker/plan.py makes
them from the plan), and how the gate applies them: as extra rule records in the same limiter
call, on the same log.

A reserved job R (priority p, starting at t) is predicted to send to some users. For each of
them and each rule r that counts R's send, the window r will count at t is held: a send of a
priority below p before t that r counts, and that falls into that window, is admitted only if
the window, with every reserved send still to come in it (R's and any other reserved job's that
r counts), stays within r's limit. A refusal is reason `reserved`, names the rule, how many
slots are held (`reserved`) and the job (`reserved_for`). Sends of priority p or higher, and
R's own, are never held back by R; once R starts (or is cancelled) its hold is gone.

The window at t is encoded as a calendar record whose period runs from the window's start to t:
a rolling window of W from t - W (the entries that will still count at t; a send now falls into
it only when now is after t - W), a calendar window from its period's start in the user's zone
(only when now is in the same period). Its limit is r's less the reserved sends to come in it.

What Redis holds: nothing. The holds live in the processes, read from one binary value the plan
writes (`<prefix>{holds}`): per reserved job a header and its users' ids, 8 bytes each
(docs/worker.md, "Reservations").
"""

import struct
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from django.conf import settings

from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.log import calendar_record
from limits.policy import ALL, RuleSet, RuleView
from limits.reasons import Reason
from limits.windows import period_bounds

# Under the limiter's prefix; one hash tag, so that both are written in one transaction on a
# cluster too.
HOLDS_KEY = "{holds}"
HOLDS_VERSION_KEY = "{holds}:version"  # changes with every plan that changes them
# version 1 | jobs, then per job: id, priority, start ms, channel, campaign, tags, users
_HEAD = struct.Struct(">BI")
_JOB = struct.Struct(">QBQHHHI")  # id, priority, start, len channel, campaign, tags, users


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
        if rule.channel not in (ALL, self.channel):
            return False
        if rule.match == "tag":
            return rule.tag in self.tags
        if rule.match == "campaign":
            return self.campaign == campaign
        return True


@dataclass(frozen=True, slots=True)
class HoldView(RuleView):
    """A rule's window at a reserved job's start, as the limiter counts it for a send now."""

    job: int = 0
    window_start_ms: int = 0
    start_ms: int = 0
    held: int = 0  # reserved sends to come in the window

    def record(self, *, limit: int, zone: str, now_ms: int) -> bytes:
        return calendar_record(
            kind=self.match,
            every_channel=self.channel == ALL,
            limit=limit,
            starts=(self.window_start_ms, self.start_ms, self.start_ms + 1),
            tag=self.tag,
        )

    def reason(self) -> Reason:
        return Reason.RESERVED

    def reserved_count(self, effective: int, used: int) -> int | None:
        return self.held

    @property
    def reserved_for(self) -> int | None:
        return self.job

    def retry_after(self, retry: int, now_ms: int) -> float | None:
        # Held until the job starts (a hold of limit 0 has no room before then at all).
        return max(0.0, (self.start_ms - now_ms) / 1000)


@dataclass
class Holds:
    """Every reserved job's held users: one sorted array of user ids, and beside it which job
    (its place in `jobs`) holds each."""

    jobs: tuple[HeldJob, ...] = ()
    users: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    owners: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint16))
    version: bytes = b""

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
        live = [k for k, j in enumerate(self.jobs) if j.priority > priority and j.start_ms > now_ms]
        if not live or not self.users.size:
            return out
        ids = np.asarray(user_ids, dtype=np.uint64)
        left = np.searchsorted(self.users, ids, side="left")
        right = np.searchsorted(self.users, ids, side="right")
        wanted = set(live)
        for i in np.flatnonzero(right > left):
            places = tuple(int(k) for k in self.owners[left[i] : right[i]] if int(k) in wanted)
            if places:
                out[int(i)] = places
        return out

    def rule_set(
        self,
        base: RuleSet,
        places: tuple[int, ...],
        *,
        campaign: str,
        zone: str,
        now_ms: int,
    ) -> RuleSet:
        """`base` with the windows these jobs hold for this user, each a record of its own."""
        jobs = [self.jobs[k] for k in places]
        extra: list[HoldView] = []
        for rule in base.rules:
            if rule.kind != "rule" and rule.kind != "arm":
                continue  # a person's own frequency holds nothing for anyone
            counted = [j for j in jobs if j.counted_by(rule, campaign)]
            for job in counted:
                window = _window(rule, job.start_ms, zone=zone, now_ms=now_ms)
                if window is None:
                    continue  # a send now does not fall into the window the job will count
                held = sum(1 for j in counted if window <= j.start_ms <= job.start_ms)
                extra.append(
                    HoldView(
                        **{f: getattr(rule, f) for f in RULE_FIELDS},
                        job=job.id,
                        window_start_ms=window,
                        start_ms=job.start_ms,
                        held=held,
                    )
                )
        if not extra:
            return base
        limits = tuple(max(0, hold.limit - hold.held) for hold in extra)
        return RuleSet(
            records=base.records
            + b"".join(
                hold.record(limit=limit, zone=zone, now_ms=now_ms)
                for hold, limit in zip(extra, limits, strict=True)
            ),
            rules=base.rules + tuple(extra),
            effective=base.effective + limits,
            limits=base.limits,
        )


RULE_FIELDS = tuple(f for f in RuleView.__dataclass_fields__)


def _window(rule: RuleView, start_ms: int, *, zone: str, now_ms: int) -> int | None:
    """Where `rule`'s window at `start_ms` starts (the first ms it counts), when a send at
    `now_ms` falls into it; None otherwise."""
    if rule.calendar:
        first, end = period_bounds(zone or "UTC", rule.window_unit, start_ms)
        return first if first <= now_ms < end else None
    first = start_ms - int(rule.window_seconds or 0) * 1000 + 1
    return first if first <= now_ms < start_ms else None


def holds_encode(jobs: list[tuple[HeldJob, np.ndarray]]) -> bytes:
    """The holds as the plan stores them: a header per job and its users (uint64, big-endian)."""
    parts = [_HEAD.pack(1, len(jobs))]
    for job, users in jobs:
        names = [job.channel.encode(), job.campaign.encode(), ",".join(job.tags).encode()]
        parts.append(
            _JOB.pack(job.id, job.priority, job.start_ms, *(len(n) for n in names), users.size)
        )
        parts += names
        parts.append(np.asarray(users, dtype=">u8").tobytes())
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
        job_id, priority, start_ms, a, b, c, n = _JOB.unpack_from(blob, pos)
        pos += _JOB.size
        channel, campaign, tags = (
            blob[pos : pos + a].decode(),
            blob[pos + a : pos + a + b].decode(),
            blob[pos + a + b : pos + a + b + c].decode(),
        )
        pos += a + b + c
        ids = np.frombuffer(blob, dtype=">u8", count=n, offset=pos).astype(np.uint64)
        pos += 8 * n
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
        return Holds(version=blob)
    all_users = np.concatenate(users)
    order = np.argsort(all_users, kind="stable")
    return Holds(
        jobs=tuple(jobs),
        users=all_users[order],
        owners=np.concatenate(owners)[order],
        version=blob[:64],
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

    def get(self, client: Any, prefix: str, *, now: float | None = None) -> Holds:
        now = time.monotonic() if now is None else now
        if now - self._read_at < self.ttl:
            return self._holds
        with self._lock:
            if now - self._read_at >= self.ttl:
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
                self._read_at = now
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


def holds_without(client: Any, prefix: str, job_id: int) -> bool:
    """Drop one job's holds at once (it started, was cancelled or edited; the next plan makes
    them again if they still stand). True when it held any."""
    blob = client.get(f"{prefix}{HOLDS_KEY}")
    if not blob:
        return False
    holds = holds_decode(blob)
    kept = [(job, users) for job, users in holds.by_job() if job.id != job_id]
    if len(kept) == len(holds.jobs):
        return False
    holds_store(client, prefix, holds_encode(kept), version=f"without {job_id} {time.time()}")
    return True
