"""Send claims: what keeps "delivered at least once" (Celery) from becoming "sent twice".

A send is claimed where it is charged. The gate's call records each admitted send of a job's run
in its user's log with the job as the entry's holder (a transactional send in the user's
uncounted log: claimed, never counted), in the same Redis function call that decides it
(limits/engine/lua/limiter.lua, gk_decide). How far each send of a chunk got is kept in the chunk's
record, `<prefix>run:{<chunk id>}:<made, ms>` (gk_run): the run that holds the chunk, then one
byte per recipient, by position: 0 not handed to the provider, 1 sending, 2 sent. A dispatcher
batch's positions become 1 right before it goes out and 2 (went out) or 0 (did not; its quota is
given back) right after the provider answers, in the same call that marks the next batch: one call
per batch, however many recipients and nodes, where a claim per message cost two commands.

A run that finds a send already in a log (the gate answers `duplicate` and names the holder)
knows, without asking anyone:

- another job holds it: another job sent (or is sending) this message id to this user: a
  duplicate, not sent, and nothing to warn about;
- this job holds it: an earlier run of this chunk charged it, and the record says how far it
  got: sent (count it as sent, do not send again), sending (the run died, or lost its lease,
  during this very send, which may or may not have reached the provider: ambiguous, unless the
  provider deduplicates by the message id, in which case it is taken over and sent again with
  the same key), or not handed over (send it now);
- nobody (holder 0): the REST gate recorded it, or the previous version did (a log entry of
  format 1, or a run of that version): the per-message claim that version kept,
  `<prefix>sent:{<channel>:<message id>}`, decides as it did (`sending:<job>:<run>`,
  `sent:<job>`, and the older `sending` / `sent` as a dead run's and this job's), read until
  those claims expire (8 days); with no claim, it is sent, uncharged (as that version did).

A message id names one send to one user per channel, as in the limiter. A run takes its chunk's
record over when it starts; a run whose record another run took over (it stalled past its
lease) finds out at its next batch and stops before sending it. A record lives RECORD_TTL, as
long as the logs keep a message id at least, about one byte per recipient.
"""

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any

from django.conf import settings

from gatekeeper.lib.redis_client import get_redis, pipelined
from limits.engine.log import holder_of
from limits.engine.transport import Call, FunctionTransport

RECORD_TTL_MS = 8 * 86_400_000
SENDING, SENT = "sending", "sent"
# A chunk record's states, one byte per recipient.
NOT_SENT, SENDING_STATE, SENT_STATE = 0, 1, 2
_MARK = struct.Struct(">IHB")
_RUN_BYTES = 16


@dataclass(frozen=True, slots=True)
class Claim:
    """A send's claim as a run reads it."""

    state: str  # SENDING or SENT
    job: int | None  # None: not known (the previous version's oldest claims)
    run: str | None  # the run that is sending; None for SENT and for old claims


# --- the previous version's per-message claims: read only ---------------------------------


def claim_key(channel: str, message_id: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}sent:{{{channel}:{message_id}}}"


def _parse(reply: Any) -> Claim | None:
    if reply is None:
        return None
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    state, _, rest = text.partition(":")
    job_text, _, run = rest.partition(":")
    job = int(job_text) if job_text.isascii() and job_text.isdigit() else None
    return Claim(state=state, job=job, run=run or None)


def old_claims_read(channel: str, message_ids: Sequence[str]) -> list[Claim | None]:
    """The previous version's claims of `message_ids`, in one round trip (raises redis
    errors)."""
    if not message_ids:
        return []
    commands = [("GET", claim_key(channel, m)) for m in message_ids]
    return [_parse(reply) for reply in pipelined(get_redis(), commands)]


# --- a chunk's record ----------------------------------------------------------------------


def record_key(chunk_id: int, made_ms: int) -> str:
    """A chunk's record, named by the chunk's id and when it was made: a database made afresh
    (its ids counted again) never meets an older database's records."""
    return f"{settings.GATEKEEPER_KEY_PREFIX}run:{{{chunk_id}}}:{made_ms}"


def made_ms(chunk: Any) -> int:
    """When a chunk was made, as its record's name has it."""
    return int(chunk.created_at.timestamp() * 1000)


@cache
def _transport(client: Any) -> FunctionTransport:
    # One key per call, routed by its hash tag; the library loaded where it is missing.
    return FunctionTransport(client, slot_key=lambda chunk_id: record_key(chunk_id, 0))


def _call(chunk_id: int, made: int, args: list[Any]) -> Any:
    """One gk_run call on the record's node; raises redis errors."""
    replies: list[Any] = []
    key = record_key(chunk_id, made)

    def build(batches: list[list[int]]) -> list[Call]:
        return [Call("gk_run", [1, key, *args], batch) for batch in batches]

    def collect(call: Call, reply: Any) -> None:
        if isinstance(reply, Exception):
            raise reply
        replies.append(reply)

    def fail(_indexes: list[int]) -> None:
        raise ConnectionError(f"the Redis node of chunk {chunk_id}'s record is unavailable")

    _transport(get_redis()).run([chunk_id], build, collect, fail)
    return replies[0]


class RunLost(Exception):
    """Another run took the chunk's record over: this one must not send."""


class ChunkRecord:
    """One run's hold on its chunk's record; each method is one call. `chunk`: a SendChunk
    (its id and made_ms name the record)."""

    def __init__(self, chunk: Any, run: str) -> None:
        if len(run.encode()) != _RUN_BYTES:
            raise ValueError(f"a run is named by {_RUN_BYTES} bytes, not {run!r}")
        self.chunk_id, self.made, self.run = chunk.pk, made_ms(chunk), run.encode()

    def take(self) -> bytes:
        """Hold the record from now on; how far each send got before (b"": nothing known)."""
        reply = _call(self.chunk_id, self.made, [self.run, RECORD_TTL_MS, "take"])
        return bytes(reply[1])

    def mark(self, states: Sequence[tuple[int, int]]) -> None:
        """Write (position, state)s; raises RunLost (nothing written) when another run took the
        record over."""
        if not states:
            return
        ops, first, last, state = [], -1, -1, -1
        for position, value in sorted(states):
            if value == state and position == last + 1 and last - first < 0xFFFE:
                last = position
                continue
            if first >= 0:
                ops.append(_MARK.pack(first, last - first + 1, state))
            first = last = position
            state = value
        ops.append(_MARK.pack(first, last - first + 1, state))
        marks = [self.run, RECORD_TTL_MS, "mark", b"".join(ops)]
        if not _call(self.chunk_id, self.made, marks):
            raise RunLost(f"chunk {self.chunk_id}: another run took its record over")


def record_read(chunk: Any) -> bytes:
    """How far each send of a chunk got (b"": no run left a record); raises redis errors."""
    raw: Any = get_redis().get(record_key(chunk.pk, made_ms(chunk)))
    return bytes(raw[_RUN_BYTES:]) if raw else b""


def state_at(states: bytes, position: int) -> int:
    return states[position] if position < len(states) else NOT_SENT


# --- what an earlier run left ----------------------------------------------------------------


class Left(StrEnum):
    """What an earlier run left of one send (docs/worker.md, "At least once must not mean
    twice")."""

    NOTHING = "nothing"  # not handed to the provider: it may go now
    SENT = "sent"  # it went out
    CUT_OFF = "cut off"  # a run died (or lost its lease) while handing it over
    OTHER_JOB = "other job"  # another job's send of this message id to this user


def left_behind(
    channel: str, job_id: int, sends: Sequence[tuple[str, int, int | None]]
) -> list[Left]:
    """For each (message id, its state in the chunk's record, the holder of its entry in the
    user's logs or None), what an earlier run left of it. Entries naming no holder are judged by
    the previous version's claims, read in one round trip (raises redis errors)."""
    unnamed = [m for m, state, holder in sends if holder == 0 and state == NOT_SENT]
    old = dict(zip(unnamed, old_claims_read(channel, unnamed), strict=True))
    mine = holder_of(job_id)
    found = []
    for message_id, state, holder in sends:
        claim = old.get(message_id) if holder == 0 else None
        if state == SENT_STATE:
            found.append(Left.SENT)
        elif state == SENDING_STATE:
            found.append(Left.CUT_OFF)
        elif holder not in (None, 0, mine):
            found.append(Left.OTHER_JOB)
        elif claim is None:
            found.append(Left.NOTHING)
        elif claim.job not in (None, job_id):
            found.append(Left.OTHER_JOB)
        else:
            found.append(Left.SENT if claim.state == SENT else Left.CUT_OFF)
    return found
