"""What a decided round chose for each of its jobs (`RoundEntry`), in one layout written and read
here: the users chosen, and the users outranked with the job that won each one's slot and that
send's value to them. The round's decision writes it (worker/rounds.py); the job's run reads it
to refuse the outranked before the gate (worker/chunks.py), the plan to leave them out of its
predictions (worker/plan.py), a person's export and erasure to find them (worker/personal.py).

Layout, little-endian: `chosen` the users (uint64) ascending; `outranked` the users (uint64)
ascending, then per user the winning job (int64), then its value in millionths (int64).
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import F

from limits.engine.limiter import Decision
from limits.reasons import Reason
from worker.models import Round, RoundEntry, SendJob

logger = logging.getLogger(__name__)

MICROS = 1_000_000  # values are kept, summed and compared in millionths of their unit
_U64 = np.uint64


def micros(value: float) -> int:
    """A value in millionths (how a round compares values)."""
    return round(value * MICROS)


def units(millionths: int) -> float:
    return millionths / MICROS


@dataclass(frozen=True)
class Decided:
    """What a decided round chose for one job: the users chosen, and those outranked with the
    job that won each one's slot and its value (millionths); each array ascending by user."""

    chosen: np.ndarray
    outranked: np.ndarray
    by: np.ndarray
    by_value: np.ndarray

    @staticmethod
    def of(
        chosen: np.ndarray, outranked: np.ndarray, by: np.ndarray, by_value: np.ndarray
    ) -> "Decided":
        """From users in any order (each array aligned with its users)."""
        order = np.argsort(outranked, kind="stable")
        return Decided(
            chosen=np.sort(chosen.astype(_U64)),
            outranked=outranked.astype(_U64)[order],
            by=by.astype(np.int64)[order],
            by_value=by_value.astype(np.int64)[order],
        )

    @staticmethod
    def read(chosen: bytes, outranked: bytes) -> "Decided":
        n = len(outranked) // 24
        return Decided(
            chosen=np.frombuffer(chosen, dtype="<u8").astype(_U64),
            outranked=np.frombuffer(outranked, dtype="<u8", count=n).astype(_U64),
            by=np.frombuffer(outranked, dtype="<i8", count=n, offset=8 * n).astype(np.int64),
            by_value=np.frombuffer(outranked, dtype="<i8", count=n, offset=16 * n).astype(np.int64),
        )

    def packed(self) -> tuple[bytes, bytes]:
        """(chosen, outranked) as RoundEntry keeps them."""
        return self.chosen.astype("<u8").tobytes(), (
            self.outranked.astype("<u8").tobytes()
            + self.by.astype("<i8").tobytes()
            + self.by_value.astype("<i8").tobytes()
        )

    def outranked_at(self, users: np.ndarray) -> np.ndarray:
        """Per user, its place among the outranked (-1: not outranked)."""
        return _places(self.outranked, users)

    def is_chosen(self, users: np.ndarray) -> np.ndarray:
        return _places(self.chosen, users) >= 0

    def without(self, users: np.ndarray) -> "Decided":
        """The same, with `users` taken out."""
        keep = ~np.isin(self.outranked, users)
        return Decided(
            chosen=self.chosen[~np.isin(self.chosen, users)],
            outranked=self.outranked[keep],
            by=self.by[keep],
            by_value=self.by_value[keep],
        )


def _places(sorted_users: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Each of `users`' place in `sorted_users` (-1: not there)."""
    if not sorted_users.size:
        return np.full(users.size, -1, dtype=np.int64)
    at = np.searchsorted(sorted_users, users)
    at[at >= sorted_users.size] = 0
    return np.where(sorted_users[at] == users, at, -1)


# (job, its making) -> what its round chose: a round decides once.
_DECIDED: dict[tuple[int, datetime], Decided] = {}
_KEPT = 64


def round_decided(job: SendJob) -> Decided | None:
    """What its decided round chose for the job (None: no round decided it). Kept once read."""
    if job.round_id is None:
        return None
    key = (job.pk, job.created_at)
    found = _DECIDED.get(key)
    if found is not None:
        return found
    entry = RoundEntry.objects.filter(job=job).values_list("chosen", "outranked").first()
    if entry is None:
        return None
    if len(_DECIDED) >= _KEPT:
        _DECIDED.pop(next(iter(_DECIDED)))
    found = _DECIDED[key] = Decided.read(bytes(entry[0]), bytes(entry[1]))
    return found


def round_split(
    job: SendJob, recipients: Sequence[Any]
) -> tuple[list[Decision | None], np.ndarray] | None:
    """A decided round's job's recipients (typed: user_id, message_id) as its run gates them:
    per recipient, its `outranked` decision (None: it goes to the gate), and which were chosen
    (a refusal of theirs by the gate is a difference). None when no round decided the job."""
    decided = round_decided(job)
    if decided is None:
        return None
    asked = np.fromiter((r.user_id for r in recipients), dtype=_U64, count=len(recipients))
    at = decided.outranked_at(asked)
    out: list[Decision | None] = []
    for r, k in zip(recipients, at.tolist(), strict=True):
        if k < 0:
            out.append(None)
            continue
        out.append(
            Decision(
                user_id=r.user_id,
                message_id=r.message_id,
                allowed=False,
                reason=Reason.OUTRANKED,
                counts={},
                limits={},
                retry_after=None,
                outranked_by={"job": int(decided.by[k]), "value": units(int(decided.by_value[k]))},
            )
        )
    return out, decided.is_chosen(asked)


def round_differences(round_id: int, count: int) -> None:
    """Chosen sends the gate refused when their job ran: counted on the round."""
    if count:
        Round.objects.filter(pk=round_id).update(differences=F("differences") + count)
        logger.warning("Round %s: the gate refused %d chosen sends", round_id, count)


# --- a person's part (worker/personal.py) ----------------------------------------------------


def round_entries_of(user_id: int) -> list[dict[str, Any]]:
    """What decided rounds chose for a user: per job of theirs in one, chosen or outranked (and
    by which job, worth how much to them)."""
    out = []
    asked = np.array([user_id], dtype=_U64)
    rows = RoundEntry.objects.order_by("round_id", "job_id")
    for round_id, job_id, chosen, outranked in rows.values_list(
        "round_id", "job_id", "chosen", "outranked"
    ).iterator(chunk_size=20):
        entry = Decided.read(bytes(chosen), bytes(outranked))
        at = int(entry.outranked_at(asked)[0])
        if at >= 0:
            by = {"job": int(entry.by[at]), "value": units(int(entry.by_value[at]))}
            out.append({"round": round_id, "job": job_id, "chosen": False, "outranked_by": by})
        elif entry.is_chosen(asked)[0]:
            out.append({"round": round_id, "job": job_id, "chosen": True, "outranked_by": None})
    return out


def round_entries_erase(user_ids: list[int]) -> int:
    """The users taken out of every decided round's entries; returns how many places."""
    gone = np.asarray(sorted(set(user_ids)), dtype=_U64)
    removed = 0
    for pk in RoundEntry.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            row = RoundEntry.objects.select_for_update().get(pk=pk)
            entry = Decided.read(bytes(row.chosen), bytes(row.outranked))
            kept = entry.without(gone)
            taken = entry.chosen.size + entry.outranked.size
            taken -= kept.chosen.size + kept.outranked.size
            if not taken:
                continue
            row.chosen, row.outranked = kept.packed()
            row.save(update_fields=["chosen", "outranked"])
            removed += taken
    _DECIDED.clear()
    return removed
