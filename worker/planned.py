"""A staged chunk's recipients as the forward plan reads them (worker/plan.py), packed when the
chunk is staged and stored beside its JSON (SendChunk.plan): the plan of a job first seen reads
these arrays instead of decoding every recipient and hashing its message id.

The layout, version 1 (every number little-endian; `n` recipients, in the chunk's order):

    offset        bytes  what
    0             1      the version, 1
    1             1      0
    2             2      `k`: the distinct time zones its recipients name (0: none names one)
    4             4      `n`
    8             8n     each recipient's user id (uint64)
    8 + 8n        8n     each one's message, limits.engine.model.message_int of the
                         limits.engine.log.message_hash of its message id (uint64)
    8 + 16n       2n     only when k > 0: each one's zone, 0 for none, i for the i-th name
    8 + 18n       rest   only when k > 0: the k names, a JSON array of strings

Version 2, for a chunk some of whose recipients carry their own `value` (a round's, worker/
rounds.py): the same, with 2 as the version and each recipient's value (float64, NaN for a row
without one) between the messages and the zones (8n bytes at 8 + 16n, the zones 8n later). A
chunk without values is written as version 1, so what an older release reads is unchanged;
an older release finds version 2 unreadable and decodes the JSON.

recipients_packed makes it, packed_read reads it (chunks_packed, every chunk of a query);
nothing else knows it. What cannot be read
(another version, a length that does not add up, a count that is not the chunk's size) is None:
its reader decodes the chunk's JSON instead, so a chunk is never planned from arrays that are not
its recipients'. A chunk an older release staged has none (NULL), and so does one whose
recipients an older release changed without making it again, by the size it left: read from its
JSON too.
"""

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

import msgspec
import numpy as np
import psycopg
from django.db import connections, transaction
from django.db.models import QuerySet

from limits.engine.log import STORED_MESSAGE, message_hash
from worker.models import SendChunk

VERSION = 1
VALUED = 2  # the version of a chunk whose recipients carry values
_HEADER = struct.Struct("<BxHI")  # version, 0, zone names, recipients
_ZONES_MAX = 0xFFFF
# A message's 8-byte hash read as a big-endian integer, shifted right by this, is its first
# STORED_MESSAGE bytes as one: message_int.
_SHIFT = np.uint64(8 * (8 - STORED_MESSAGE))
_IDS = itemgetter("message_id")
_USERS = itemgetter("user_id")


@dataclass(frozen=True)
class Packed:
    """A chunk's recipients as packed: users and messages (uint64), and the zone each names as
    a code into `names` (0: none, i: names[i - 1]), `codes` None when none names one."""

    users: np.ndarray
    messages: np.ndarray
    codes: np.ndarray | None
    names: list[str]
    # Each recipient's own value (float64, NaN: none), None when none carries one.
    values: np.ndarray | None = None

    def zones(self) -> list[str | None]:
        """Each recipient's zone (None: it names none)."""
        if self.codes is None:
            return [None] * int(self.users.size)
        table = np.array([None, *self.names], dtype=object)
        zones: list[str | None] = table[self.codes].tolist()
        return zones


def packed_of(
    users: Sequence[int],
    message_ids: Sequence[str],
    named: Sequence[str | None],
    values: Sequence[float | None] | None = None,
) -> Packed:
    """Recipients (each one's user, message id, the zone it names or None, and its own value
    or None) as the plan reads them: each message id hashed as the logs keep it, the zones
    coded."""
    n = len(users)
    hashes = np.frombuffer(b"".join(map(message_hash, message_ids)), dtype=">u8")
    names = [zone for zone in dict.fromkeys(named) if zone is not None]
    codes = None
    if names:
        code = {None: 0} | {zone: i for i, zone in enumerate(names, 1)}
        codes = np.fromiter(map(code.__getitem__, named), dtype="<u2", count=n)
    valued = None
    if values is not None and any(v is not None for v in values):
        valued = np.array([np.nan if v is None else v for v in values], dtype="<f8")
    return Packed(
        users=np.fromiter(users, dtype="<u8", count=n),
        messages=(hashes >> _SHIFT).astype("<u8"),
        codes=codes,
        names=names,
        values=valued,
    )


def recipients_packed(recipients: Sequence[Mapping[str, object]]) -> bytes:
    """A staged chunk's recipients (each with its user_id and message_id, and time_zone when it
    names one), packed in the layout above."""
    packed = packed_of(
        list(map(_USERS, recipients)),
        list(map(_IDS, recipients)),
        [r.get("time_zone") for r in recipients],  # type: ignore[misc]
        [r.get("value") for r in recipients],  # type: ignore[misc]
    )
    if len(packed.names) > _ZONES_MAX:
        raise ValueError(f"{len(packed.names)} time zones in one chunk: at most {_ZONES_MAX}")
    n = int(packed.users.size)
    version = VERSION if packed.values is None else VALUED
    parts = [_HEADER.pack(version, len(packed.names), n), packed.users.tobytes()]
    parts.append(packed.messages.tobytes())
    if packed.values is not None:
        parts.append(packed.values.tobytes())
    if packed.codes is not None:
        parts += [packed.codes.tobytes(), msgspec.json.encode(packed.names)]
    return b"".join(parts)


def repacked(chunk: SendChunk) -> bytes | None:
    """A chunk's arrays once its recipients changed (a repeat or an erasure taken out): made
    again while it is staged and had them, else none."""
    if chunk.plan is None or chunk.status != SendChunk.Status.STAGED:
        return None
    return recipients_packed(chunk.recipients)


# A staged chunk handed out (queued, now or on its job's resume): what the plan read of it goes,
# since only a staged chunk is planned. The fields every hand-out sets (`**UNSTAGED`).
UNSTAGED: dict[str, object] = {"status": SendChunk.Status.QUEUED, "plan": None}


_NAMES = msgspec.json.Decoder(list[str])


def packed_read(blob: bytes | memoryview, size: int) -> Packed | None:
    """A chunk's packed recipients (`size`: how many the chunk holds), or None when `blob` is not
    in a layout this release reads or does not hold `size` recipients."""
    view = memoryview(blob)
    if len(view) < _HEADER.size:
        return None
    version, k, n = _HEADER.unpack_from(view)
    if version not in (VERSION, VALUED) or n != size:
        return None
    zones_at = _HEADER.size + (16 if version == VERSION else 24) * n
    if (len(view) != zones_at) if k == 0 else (len(view) < zones_at + 2 * n + 2):
        return None
    users = np.frombuffer(view, dtype="<u8", count=n, offset=_HEADER.size)
    messages = np.frombuffer(view, dtype="<u8", count=n, offset=_HEADER.size + 8 * n)
    values = None
    if version == VALUED:
        values = np.frombuffer(view, dtype="<f8", count=n, offset=_HEADER.size + 16 * n)
    if k == 0:
        return Packed(users, messages, None, [], values)
    try:
        names = _NAMES.decode(view[zones_at + 2 * n :])
    except msgspec.DecodeError:
        return None
    codes = np.frombuffer(view, dtype="<u2", count=n, offset=zones_at)
    if len(names) != k or (n and int(codes.max()) > k):
        return None
    return Packed(users, messages, codes, names, values)


FETCH_ROWS = 100  # chunks fetched at a time (of 1,000 recipients: 1.6 MB)


def chunks_packed(chunks: "QuerySet[SendChunk]") -> list[tuple[int, Packed | None]]:
    """Each chunk of `chunks` (in its order): its id and its packed recipients (None: it has
    none this release reads). On PostgreSQL the arrays come in binary: bytea's text form is hex,
    twice the bytes for the server to write and the client to decode (2.5x the time)."""
    rows = chunks.values_list("pk", "size", "plan")
    db = connections[rows.db]
    if db.vendor != "postgresql":
        return [
            (pk, None if blob is None else packed_read(blob, size))
            for pk, size, blob in rows.iterator(chunk_size=FETCH_ROWS)
        ]
    sql, params = rows.query.sql_with_params()
    out: list[tuple[int, Packed | None]] = []
    # A server-side cursor lives in a transaction.
    with (
        transaction.atomic(using=rows.db),
        psycopg.ServerCursor(db.connection, "chunks_packed") as cursor,
    ):
        cursor.execute(sql, params, binary=True)
        while fetched := cursor.fetchmany(FETCH_ROWS):
            out.extend(
                (pk, None if blob is None else packed_read(blob, size))
                for pk, size, blob in fetched
            )
    return out
