"""The send log's bytes, from Python: where a user's log lives, the hashes it stores, the rule
records a call passes, and reading a log back (limits/engine/lua/limiter.lua holds the format).

Each user's log is one field of its group's hash (`group_key`), which the 16 users whose ids
differ only in the low 4 bits share: key `<prefix>{b:<id >> 8>}` and one hex digit, field the
low byte as one raw byte. Or, as the releases before groups wrote it, of its bucket's hash
(`bucket_key`: the 256 users whose ids differ only in the low byte), until `manage.py
group_logs` moves it (docs/limiter.md, "Buckets and groups"). The hash tag keeps a bucket and
its groups in one cluster slot, so a user's whole log (every channel) is decided in one function
call, and consecutive ids (a campaign over a segment) share reads and writes.

Hashes (blake2b, so they are the same in every process and version):
- message id: 64 bits passed, the first 56 kept in an entry. Two different message ids of one
  user on one channel collide with probability about n / 2^56 for a user holding n entries: at
  270M users receiving 30 sends a week, about once in 5,000 years. A collision would make the
  second send a `duplicate`: admitted without being counted (and, for a send job's run, not
  sent when the first was another job's).
- campaign and tag: 32 bits, never 0 (0 marks "none"). A collision makes a per-campaign or tag
  rule count another campaign's or tag's sends too: it refuses early, it never admits more.
"""

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b

BUCKET_BITS = 8
FORMAT_VERSION = 2
ENTRY_BASE = 21  # time 6, message 7, campaign 4, held 4 (priority, holder)
FORMAT_1_BASE = 19  # format 1: time 6, message 8, campaign 4, priority 1
STORED_MESSAGE = 7  # the bytes of a message hash an entry keeps
HOLDER_BITS = 28
NO_HASH = b"\0\0\0\0"
RULE_RECORD = struct.Struct(">BBBI6s6s6s4s")
# What gk_acquire answers per request (limits/engine/lua/limiter.lua).
REPLY = struct.Struct(">BBI6sII")
REPLY_BYTES = REPLY.size
EXPIRY_FIELD = b"expiry"
# The limiter's Redis server's hash-max-listpack-value (its default is 64): a group stays a
# listpack while each of its logs fits, and a 30-send log is about 650 bytes (docs/deploy.md).
GROUP_LISTPACK_VALUE = 4096

KIND_CODES = {"any": 1, "tag": 2, "campaign": 3}


def bucket_key(prefix: str, user_id: int) -> str:
    # The {b:<bucket>} hash tag keeps a bucket (and so each of its users' logs) in one slot.
    return f"{prefix}{{b:{user_id >> BUCKET_BITS}}}"


def group_key(prefix: str, user_id: int) -> str:
    """The key of the user's group of 16, in its bucket's cluster slot."""
    return f"{bucket_key(prefix, user_id)}{(user_id >> 4) & 0xF:x}"


def grouped_key(prefix: str) -> str:
    """The key that says every user's logs are in its group: buckets are read no more."""
    return f"{prefix}logs:grouped"


def user_keys(prefix: str, user_id: int) -> tuple[str, str]:
    """Both keys the user's logs may be in: its bucket's and its group's."""
    return bucket_key(prefix, user_id), group_key(prefix, user_id)


def bucket_of(key: str | bytes) -> int:
    """The bucket number in a bucket's key."""
    text = key.decode() if isinstance(key, bytes) else key
    return int(text[text.rindex("{b:") + 3 : text.rindex("}")])


def bucket_field(user_id: int) -> bytes:
    return bytes((user_id & 0xFF,))


def uncounted_field(user_id: int) -> bytes:
    """The field of the user's uncounted log: a send job's transactional sends, recorded so
    that their message ids are claimed, never counted by a rule."""
    return b"~" + bucket_field(user_id)


def message_hash(message_id: str) -> bytes:
    return blake2b(message_id.encode(), digest_size=8).digest()


def stored_message_hash(message_id: str) -> bytes:
    """What an entry keeps of a message id's hash."""
    return message_hash(message_id)[:STORED_MESSAGE]


def holder_of(job_id: int) -> int:
    """A send job as the holder of its entries: 28 bits, never 0 (none). Jobs 2^28 - 1 apart
    share one: taken for one only if both sent one message id to one user within the log's
    retention."""
    return (job_id - 1) % ((1 << HOLDER_BITS) - 1) + 1 if job_id > 0 else 0


def short_hash(text: str) -> bytes:
    """A campaign's or a tag's 4-byte hash; "" is none (zero bytes)."""
    if not text:
        return NO_HASH
    digest = blake2b(text.encode(), digest_size=4).digest()
    return digest if digest != NO_HASH else b"\0\0\0\1"


def tags_bytes(tags: tuple[str, ...]) -> bytes:
    """The tags' hashes, each once (the log's entries hold a tag at most once)."""
    seen: dict[bytes, None] = {}
    for tag in tags:
        seen[short_hash(tag)] = None
    return b"".join(seen)


def _ms6(value: int) -> bytes:
    return value.to_bytes(6, "big")


def rolling_record(*, kind: str, every_channel: bool, limit: int, seconds: int, tag: str) -> bytes:
    return RULE_RECORD.pack(
        KIND_CODES[kind],
        1 if every_channel else 0,
        0,
        limit,
        _ms6(seconds * 1000),
        _ms6(0),
        _ms6(0),
        short_hash(tag) if kind == "tag" else NO_HASH,
    )


def calendar_record(
    *, kind: str, every_channel: bool, limit: int, starts: tuple[int, int, int], tag: str
) -> bytes:
    """`starts`: three consecutive period starts in ms, the caller's now in the first period."""
    a, b, c = starts
    return RULE_RECORD.pack(
        KIND_CODES[kind],
        1 if every_channel else 0,
        1,
        limit,
        _ms6(a),
        _ms6(b),
        _ms6(c),
        short_hash(tag) if kind == "tag" else NO_HASH,
    )


@dataclass(frozen=True, slots=True)
class Entry:
    """One recorded send, as the log keeps it."""

    channel: str
    at_ms: int
    message: bytes
    campaign: bytes
    priority: int
    tags: tuple[bytes, ...]
    holder: int = 0  # the send job whose run recorded it, as holder_of numbers it (0: none)

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.at_ms / 1000, tz=UTC)


class LogFormatError(ValueError):
    """A stored log this version cannot read."""


def decode(raw: bytes | None) -> list[Entry]:
    """Every entry of a stored log, per channel in the stored order, oldest first."""
    if not raw:
        return []
    version, slots, count = raw[0], raw[1], raw[2]
    if version not in (1, FORMAT_VERSION):
        raise LogFormatError(f"log format {version} is not known to this version")
    base = ENTRY_BASE if version == FORMAT_VERSION else FORMAT_1_BASE
    width = base + 4 * slots
    pos, sections = 3, []
    for _ in range(count):
        length = raw[pos]
        name = raw[pos + 1 : pos + 1 + length].decode()
        entries = int.from_bytes(raw[pos + 1 + length : pos + 3 + length], "big")
        sections.append((name, entries))
        pos += 3 + length
    out: list[Entry] = []
    for index, (name, entries) in enumerate(sections):
        if index == count - 1:
            entries = (len(raw) - pos) // width  # the last section runs to the end
        for _ in range(entries):
            entry = raw[pos : pos + width]
            tags = tuple(
                entry[base + 4 * k : base + 4 * k + 4]
                for k in range(slots)
                if entry[base + 4 * k : base + 4 * k + 4] != NO_HASH
            )
            if base == ENTRY_BASE:
                held = int.from_bytes(entry[17:21], "big")
                campaign, priority, holder = entry[13:17], held >> HOLDER_BITS, held
                holder &= (1 << HOLDER_BITS) - 1
            else:
                campaign, priority, holder = entry[14:18], entry[18], 0
            out.append(
                Entry(
                    channel=name,
                    at_ms=int.from_bytes(entry[0:6], "big"),
                    message=entry[6 : 6 + STORED_MESSAGE],
                    campaign=campaign,
                    priority=priority,
                    tags=tags,
                    holder=holder,
                )
            )
            pos += width
    return out


def iter_replies(blob: bytes) -> Iterator[tuple[int, int, int, int, int, int]]:
    """gk_acquire's answers: outcome, rule, used, retry (1 + ms, 0: none), day, week."""
    for outcome, rule, used, retry, day, week in REPLY.iter_unpack(blob):
        yield outcome, rule, used, int.from_bytes(retry, "big"), day, week
