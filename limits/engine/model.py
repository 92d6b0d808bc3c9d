"""The decision model: what the limiter's function (limits/engine/lua/limiter.lua, gk_decide)
answers, computed for many users and sends at once over numpy arrays, from logs read from Redis
in bulk (or made from the ledger) and never written back.

`ModelLogs` holds many users' logs as columns, one row per entry (`Entries`), in sorted runs: a
call reads its users' entries with binary searches, and what it records is a new run, merged into
the others now and then. `decide` answers one call as gk_decide does: the same rule records
(limits.engine.table.RuleSet.records: the caller has resolved each window in the user's zone and
applied reserves and holds), the same counting (an entry counts when it is newer than the
window's start, later ones too), the same choice of the deciding rule (the first whose limit is
0, else the one whose room comes last, the first of equals; a rule whose period ended before now
decides nothing), the same duplicates (the message on the channel, in the user's log and then in
the other log), the same writes (a recorded send drops the log's entries that left the
retention). A user asked twice in one call is decided in turns, as the function reads the log it
wrote.

`ModelLimiter` is a Limiter for the gate (`acquire`, the same arguments and Decisions), so that
every stage before the rules (quiet hours, suppression, preferences, the control group, arms,
reservations) is the gate's own code: the tests compare the two on random rules, logs, clocks
and batches, and allow no difference (tests/limits/test_decision_model.py).
"""

import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from gatekeeper.lib.instants import ms_checked
from limits.engine import log
from limits.engine.limiter import ALLOWED, DUPLICATE, Decision, Limiter, per_request
from limits.engine.table import DEFAULT_PRIORITY, RuleSet

REFUSED = 3
NO_LIMIT = 2**62  # room under no rule
DAY_MS, WEEK_MS = 86_400_000, 604_800_000
RUNS_MERGED = 24  # runs beyond the first that are merged into one (a plan adds one a job)
KIND_TAG, KIND_CAMPAIGN = 2, 3  # a rule record's kinds (1: every send)
_U64 = np.uint64
READ_BATCH = 256  # buckets read per pipeline
# A bucket's keys read in one call (they share its cluster slot): per key that holds any field,
# its position in KEYS, its fields' count, then its fields and values.
_READ_SCRIPT = """#!lua flags=no-writes
local out = {}
for k = 1, #KEYS do
  local fields = redis.call('HGETALL', KEYS[k])
  if #fields > 0 then
    out[#out + 1] = k
    out[#out + 1] = #fields / 2
    for j = 1, #fields do out[#out + 1] = fields[j] end
  end
end
return out
"""


def message_int(message_hash: bytes) -> int:
    """What an entry keeps of a message's 8-byte hash (its first 7 bytes), as an integer."""
    return int.from_bytes(message_hash[: log.STORED_MESSAGE], "big")


def hash_int(short: bytes) -> int:
    """A campaign's or a tag's 4-byte hash as an integer (0: none)."""
    return int.from_bytes(short, "big")


@dataclass(slots=True)
class Entries:
    """Entries of logs, one row each: whose (`user`), on which channel (a code, `ModelLogs`
    names it), when (ms), the message (7 bytes), the campaign (4), `held` (priority in the high
    4 bits, the holder below), in the uncounted log or not, and the tags (one column per tag
    slot, 0 for none)."""

    user: np.ndarray  # uint64
    channel: np.ndarray  # int32
    at: np.ndarray  # int64
    message: np.ndarray  # uint64
    campaign: np.ndarray  # uint32
    held: np.ndarray  # uint32
    uncounted: np.ndarray  # bool
    tags: np.ndarray  # uint32, (rows, slots)

    @staticmethod
    def empty(slots: int = 0) -> "Entries":
        return Entries(
            user=np.empty(0, dtype=_U64),
            channel=np.empty(0, dtype=np.int32),
            at=np.empty(0, dtype=np.int64),
            message=np.empty(0, dtype=_U64),
            campaign=np.empty(0, dtype=np.uint32),
            held=np.empty(0, dtype=np.uint32),
            uncounted=np.empty(0, dtype=bool),
            tags=np.zeros((0, slots), dtype=np.uint32),
        )

    def __len__(self) -> int:
        return int(self.user.size)

    def take(self, rows: np.ndarray) -> "Entries":
        return Entries(
            user=self.user[rows],
            channel=self.channel[rows],
            at=self.at[rows],
            message=self.message[rows],
            campaign=self.campaign[rows],
            held=self.held[rows],
            uncounted=self.uncounted[rows],
            tags=self.tags[rows],
        )

    def sorted(self) -> "Entries":
        """By user (stable: a user's entries keep their order; nothing reads them by time
        order but after sorting them so)."""
        if self.user.size < 2 or bool((self.user[1:] >= self.user[:-1]).all()):
            return self
        return self.take(np.argsort(self.user, kind="stable"))


def _widened(tags: np.ndarray, slots: int) -> np.ndarray:
    if tags.shape[1] >= slots:
        return tags
    out = np.zeros((tags.shape[0], slots), dtype=np.uint32)
    out[:, : tags.shape[1]] = tags
    return out


def joined(parts: Sequence[Entries]) -> Entries:
    if not parts:
        return Entries.empty()
    if len(parts) == 1:
        return parts[0]
    slots = max(p.tags.shape[1] for p in parts)
    return Entries(
        user=np.concatenate([p.user for p in parts]),
        channel=np.concatenate([p.channel for p in parts]),
        at=np.concatenate([p.at for p in parts]),
        message=np.concatenate([p.message for p in parts]),
        campaign=np.concatenate([p.campaign for p in parts]),
        held=np.concatenate([p.held for p in parts]),
        uncounted=np.concatenate([p.uncounted for p in parts]),
        tags=np.concatenate([_widened(p.tags, slots) for p in parts]),
    )


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every index of the ranges [starts[k], starts[k] + counts[k]), and k for each."""
    total = int(counts.sum())
    owner = np.repeat(np.arange(counts.size), counts)
    if total == 0:
        return np.empty(0, dtype=np.int64), owner
    first = np.cumsum(counts) - counts
    return starts[owner] + (np.arange(total) - first[owner]), owner


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values): sorted, then each value once. Not np.unique itself: numpy 2's hashes
    a large array of integers (2.4 s for 2.7M uint64 on this machine, against 0.05 s sorted)."""
    return distinct(np.sort(values))


def distinct(values: np.ndarray) -> np.ndarray:
    """The values of a sorted array, once each."""
    if values.size < 2:
        return values
    keep = np.empty(values.size, dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


SMALL = 1 << 24  # small enough that a count per possible value beats sorting
# A run's ids looked up by index (4 bytes an id of its range) when its range holds at most this
# many ids an entry: the index then costs at most 64 bytes an entry, about what the entry does.
DENSE_IDS = 16


def present(values: np.ndarray) -> np.ndarray:
    """The distinct values of non-negative integers, sorted (counted when they are small)."""
    if values.size and int(values.max()) < SMALL:
        return np.flatnonzero(np.bincount(values))
    return sorted_distinct(values)


def grouped(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For non-negative integers: each one's group (its rank among the distinct values) and
    where each group first occurs, as np.unique's return_inverse and return_index."""
    if not values.size or int(values.max()) >= SMALL:
        _, first, group = np.unique(values, return_index=True, return_inverse=True)
        return group.ravel(), first
    seen = np.bincount(values) > 0
    rank = np.cumsum(seen) - 1
    group = rank[values]
    first = np.full(int(seen.sum()), values.size, dtype=np.int64)
    np.minimum.at(first, group, np.arange(values.size))
    return group, first


def ascending_distinct(values: np.ndarray) -> np.ndarray:
    """np.unique, without a sort when the values already ascend."""
    if values.size < 2 or bool((values[1:] > values[:-1]).all()):
        return values
    return sorted_distinct(values)


def users_buckets(users: np.ndarray, *, ordered: bool = False) -> np.ndarray:
    """The log buckets of `users` (sorted already: `ordered`), sorted, once each."""
    shifted = np.asarray(users, dtype=_U64) >> _U64(log.BUCKET_BITS)
    return distinct(shifted if ordered else np.sort(shifted))


PLACES_IDS = 1 << 25  # users below this: their places found in a table (4 bytes an id)


@dataclass(slots=True)
class _Places:
    """Each of some users' place among them (sorted, distinct): by a table of one place an id
    when the ids are small, else by a binary search."""

    users: np.ndarray
    table: np.ndarray | None = None

    @staticmethod
    def of(users: np.ndarray) -> "_Places":
        users = np.asarray(users, dtype=_U64)
        top = int(users[-1]) if users.size else 0
        if not users.size or top >= PLACES_IDS:
            return _Places(users)
        table = np.full(top + 1, -1, dtype=np.int32)
        table[users] = np.arange(users.size, dtype=np.int32)
        return _Places(users, table)

    def find(self, values: np.ndarray) -> np.ndarray:
        """Each value's place (-1: not among the users)."""
        if self.table is not None:
            inside = values < _U64(self.table.size)
            return np.where(inside, self.table[np.where(inside, values, 0)], -1)
        if not self.users.size:
            return np.full(values.size, -1, dtype=np.int64)
        place = np.minimum(np.searchsorted(self.users, values), self.users.size - 1)
        return np.where(self.users[place] == values, place, -1)


@dataclass(slots=True)
class _Run:
    entries: Entries  # sorted by user
    gone: np.ndarray  # bool: dropped since (left the retention when its log was written)
    # Where each user's entries start, by user id from `low` (the last: the end), when the ids
    # are dense enough for an array of them to cost no more than the entries: a look-up then
    # costs an index, not a binary search. Or, with `places`, by each user's place among the
    # users its logs were forked for (every entry's user among them).
    low: int = 0
    starts: np.ndarray | None = None
    places: _Places | None = None

    @staticmethod
    def of(entries: Entries, places: _Places | None = None) -> "_Run":
        run = _Run(entries, np.zeros(len(entries), dtype=bool))
        users = entries.user
        if places is not None and users.size:
            at = places.find(users)
            if bool((at >= 0).all()):
                counts = np.bincount(at, minlength=places.users.size)
                run.places = places
                run.starts = np.zeros(places.users.size + 1, dtype=np.int64)
                np.cumsum(counts, out=run.starts[1:])
                return run
        if users.size > SMALL // 64:
            low, high = int(users[0]), int(users[-1])
            if high - low < DENSE_IDS * users.size:
                counts = np.bincount((users - _U64(low)).astype(np.int64), minlength=high - low + 1)
                kind = np.int32 if users.size < 2**31 else np.int64
                run.low = low
                run.starts = np.zeros(high - low + 2, dtype=kind)
                np.cumsum(counts, out=run.starts[1:])
        return run

    def rows_of(
        self, users: np.ndarray, places: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where the entries of `users` start and end in this run (`places`: the users' places
        among this run's `places`, found once for every run that shares them)."""
        if self.starts is None:
            column = self.entries.user
            return (
                np.searchsorted(column, users, side="left"),
                np.searchsorted(column, users, side="right"),
            )
        span = self.starts.size - 1
        if self.places is not None:
            if places is None:
                places = self.places.find(np.asarray(users, dtype=_U64))
            at = places.astype(np.int64, copy=False)
        else:
            at = users.astype(np.int64) - self.low
        inside = (at >= 0) & (at < span)
        at = np.where(inside, at, 0)
        lo = np.where(inside, self.starts[at], 0)
        hi = np.where(inside, self.starts[at + 1], 0)
        return lo, hi


class ModelLogs:
    """Many users' logs (counted and uncounted), as `Entries` in sorted runs."""

    def __init__(self, entries: Entries | None = None, channels: Sequence[str] = ()) -> None:
        self.channels: list[str] = list(channels)
        self._codes = {name: k for k, name in enumerate(self.channels)}
        self._runs: list[_Run] = []
        self._places: _Places | None = None  # the users a fork was made for (fork's `within`)
        if entries is not None and len(entries):
            self._add(entries.sorted())

    def code(self, channel: str) -> int:
        found = self._codes.get(channel)
        if found is None:
            found = self._codes[channel] = len(self.channels)
            self.channels.append(channel)
        return found

    def _add(self, entries: Entries) -> None:
        self._runs.append(_Run.of(entries, self._places))
        if len(self._runs) > RUNS_MERGED + 1:
            rest = self._merged(self._runs[1:])
            first = self._runs[0]
            if len(rest.entries) * 2 > len(first.entries):
                self._runs = [self._merged([first, rest])]
            else:
                self._runs = [first, rest]

    def _merged(self, runs: Sequence[_Run]) -> _Run:
        kept = joined([r.entries.take(~r.gone) for r in runs]).sorted()
        return _Run.of(kept, self._places)

    def __len__(self) -> int:
        return sum(int((~r.gone).sum()) for r in self._runs)

    def fork(self, *, within: np.ndarray | None = None) -> "ModelLogs":
        """Logs that start as these and change on their own (the entries, never changed once
        in a run, are shared; what each drops is its own). `within`: the users (sorted, once
        each) whose entries are the only ones the fork will be asked for and given: the runs
        it adds find a user's entries by the user's place among them, not by a binary search."""
        out = ModelLogs(channels=self.channels)
        out._runs = [
            _Run(r.entries, r.gone.copy(), low=r.low, starts=r.starts, places=r.places)
            for r in self._runs
        ]
        out._places = _Places.of(within) if within is not None else self._places
        return out

    def entries(self) -> Entries:
        """Every entry held, by user and time."""
        return self._merged(self._runs).entries

    def gathered(
        self, users: np.ndarray
    ) -> tuple[Entries, np.ndarray, list[tuple[int, np.ndarray]]]:
        """The entries of `users` (distinct), each with its user's position in `users`, and
        where each is held (per run: its rows), so that they can be dropped."""
        picks: list[tuple[int, np.ndarray, np.ndarray]] = []
        found: dict[int, np.ndarray] = {}  # the users' places, by the runs' `places` they are in
        for k, run in enumerate(self._runs):
            place = None
            if run.places is not None:
                place = found.get(id(run.places))
                if place is None:
                    place = found[id(run.places)] = run.places.find(np.asarray(users, dtype=_U64))
            lo, hi = run.rows_of(users, place)
            rows, owner = _ranges(lo, hi - lo)
            if rows.size:
                live = ~run.gone[rows]
                if not live.all():
                    rows, owner = rows[live], owner[live]
            if rows.size:
                picks.append((k, rows, owner))
        if not picks:
            return Entries.empty(), np.empty(0, dtype=np.int64), []
        # Each column taken once, straight into its place.
        total = sum(rows.size for _, rows, _ in picks)
        slots = max(self._runs[k].entries.tags.shape[1] for k, _, _ in picks)
        out = Entries(
            user=np.empty(total, dtype=_U64),
            channel=np.empty(total, dtype=np.int32),
            at=np.empty(total, dtype=np.int64),
            message=np.empty(total, dtype=_U64),
            campaign=np.empty(total, dtype=np.uint32),
            held=np.empty(total, dtype=np.uint32),
            uncounted=np.empty(total, dtype=bool),
            tags=np.zeros((total, slots), dtype=np.uint32),
        )
        at = 0
        for k, rows, _ in picks:
            source, end = self._runs[k].entries, at + rows.size
            for name in ("user", "channel", "at", "message", "campaign", "held", "uncounted"):
                np.take(getattr(source, name), rows, out=getattr(out, name)[at:end])
            if source.tags.shape[1]:
                out.tags[at:end, : source.tags.shape[1]] = source.tags[rows]
            at = end
        owner = np.concatenate([owner for _, _, owner in picks]) if len(picks) > 1 else picks[0][2]
        return out, owner, [(k, rows) for k, rows, _ in picks]

    def drop(self, where: list[tuple[int, np.ndarray]], mask: np.ndarray) -> None:
        """Drop the gathered entries where `mask` (gathered()'s order) is true."""
        at = 0
        for k, rows in where:
            part = mask[at : at + rows.size]
            self._runs[k].gone[rows[part]] = True
            at += rows.size

    def record(self, entries: Entries) -> None:
        if len(entries):
            self._add(entries.sorted())

    # --- reading logs ------------------------------------------------------------------------

    def _decode(self, users: np.ndarray, uncounted: np.ndarray, raws: list[bytes]) -> Entries:
        """Every entry of the stored logs (format 2 over arrays; format 1, rare, one by one)."""
        if not raws:
            return Entries.empty()
        lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
        end = np.cumsum(lengths)
        begin = end - lengths
        buf = np.frombuffer(b"".join(raws), dtype=np.uint8)
        current = buf[begin] == log.FORMAT_VERSION
        if current.all():
            return self._decode_current(users, uncounted, buf, begin, end)
        at = np.flatnonzero(current)
        parts = [self._decode_current(users[at], uncounted[at], buf, begin[at], end[at])]
        older = np.flatnonzero(~current).tolist()
        parts.append(
            self._decode_older([(int(users[i]), bool(uncounted[i]), raws[i]) for i in older])
        )
        return joined(parts).sorted()

    def _decode_older(self, logs: list[tuple[int, bool, bytes]]) -> Entries:
        rows: list[tuple[Any, ...]] = []
        for user, uncounted, raw in logs:
            for e in log.decode(raw):
                rows.append((user, uncounted, e))
        slots = max((len(e.tags) for _, _, e in rows), default=0)
        tags = np.zeros((len(rows), slots), dtype=np.uint32)
        for k, (_, _, e) in enumerate(rows):
            for j, tag in enumerate(e.tags):
                tags[k, j] = hash_int(tag)
        return Entries(
            user=np.asarray([r[0] for r in rows], dtype=_U64),
            channel=np.asarray([self.code(e.channel) for _, _, e in rows], dtype=np.int32),
            at=np.asarray([e.at_ms for _, _, e in rows], dtype=np.int64),
            message=np.asarray([int.from_bytes(e.message, "big") for _, _, e in rows], dtype=_U64),
            campaign=np.asarray([hash_int(e.campaign) for _, _, e in rows], dtype=np.uint32),
            held=np.asarray(
                [(e.priority << log.HOLDER_BITS) | e.holder for _, _, e in rows], dtype=np.uint32
            ),
            uncounted=np.asarray([r[1] for r in rows], dtype=bool),
            tags=tags,
        )

    def _decode_current(
        self,
        users: np.ndarray,
        uncounted: np.ndarray,
        buf: np.ndarray,
        begin: np.ndarray,
        end: np.ndarray,
    ) -> Entries:
        """The entries of the logs of format 2 at [begin, end) of `buf`."""
        if not begin.size:
            return Entries.empty()
        slots = buf[begin + 1].astype(np.int64)
        sections = buf[begin + 2].astype(np.int64)
        width = log.ENTRY_BASE + 4 * slots
        pos = begin + 3
        names: list[np.ndarray] = []  # per section index: the channel code of each log having it
        counts: list[np.ndarray] = []
        for s in range(int(sections.max(initial=0))):
            having = np.nonzero(sections > s)[0]
            at = pos[having]
            size = buf[at].astype(np.int64)
            longest = int(size.max(initial=0))
            if longest <= 8:  # names of up to 8 bytes: one number each
                # (8 bytes from each name on: a name is followed by at least its count's 2
                # and an entry's 21)
                grid = np.lib.stride_tricks.sliding_window_view(buf, 8)[at + 1]
                grid = np.where(np.arange(8) < size[:, None], grid, 0).astype(np.uint8)
                numbers = np.ascontiguousarray(grid).view(np.uint64).ravel()
                if bool((numbers == numbers[0]).all()):  # most: every log's first is one name
                    unique, inverse = numbers[:1], np.zeros(numbers.size, dtype=np.int64)
                else:
                    unique, inverse = np.unique(numbers, return_inverse=True)
                texts = [int(u).to_bytes(8, "little").rstrip(b"\0") for u in unique.tolist()]
            else:
                grid = np.zeros((having.size, -(-longest // 8) * 8), dtype=np.uint8)
                for j in range(longest):
                    inside = size > j
                    grid[inside, j] = buf[at[inside] + 1 + j]
                labels = grid.view(f"S{grid.shape[1]}").ravel()
                unique, inverse = np.unique(labels, return_inverse=True)
                texts = list(unique.tolist())
            codes = np.asarray([self.code(t.decode()) for t in texts], dtype=np.int32)
            name = np.full(begin.size, -1, dtype=np.int32)
            name[having] = codes[inverse.ravel()]
            count = np.zeros(begin.size, dtype=np.int64)
            count[having] = buf[at + 1 + size].astype(np.int64) * 256 + buf[at + 2 + size]
            names.append(name)
            counts.append(count)
            pos[having] = at + 3 + size
        # The entries: every section's, one after the other from the end of the headers to the
        # end of the log (the last section's count is what remains), all of one width.
        body = pos
        total = (end - body) // width
        listed = np.stack(counts, axis=1) if counts else np.zeros((begin.size, 0), np.int64)
        if listed.shape[1]:
            rows = np.arange(begin.size)
            last_at = np.maximum(sections - 1, 0)
            listed[rows, last_at] = 0
            listed[rows, last_at] = np.where(sections > 0, total - listed.sum(axis=1), 0)
        channel = np.repeat(
            np.stack(names, axis=1).ravel() if names else np.empty(0, np.int32), listed.ravel()
        )
        owner = np.repeat(np.arange(begin.size), total)
        first = np.cumsum(total) - total
        starts = body[owner] + (np.arange(owner.size) - first[owner]) * width[owner]
        parts = []
        for w in present(width[total > 0]).tolist():
            mine = np.flatnonzero(width[owner] == w)
            grid = np.lib.stride_tricks.sliding_window_view(buf, w)[starts[mine]]
            parts.append((mine, grid))
        if not parts:  # logs of no entry (the function never leaves one)
            return Entries.empty()
        if len(parts) == 1:
            grid = parts[0][1]
            return self._columns(grid, users[owner], uncounted[owner], channel)
        # Several widths (tag slots): each width's entries, then back in the logs' order.
        pieces = [
            self._columns(grid, users[owner[mine]], uncounted[owner[mine]], channel[mine])
            for mine, grid in parts
        ]
        order = np.argsort(np.concatenate([mine for mine, _ in parts]), kind="stable")
        return joined(pieces).take(order)

    @staticmethod
    def _columns(
        grid: np.ndarray, users: np.ndarray, uncounted: np.ndarray, channel: np.ndarray
    ) -> Entries:
        """Entries from their bytes, one row each (limits/engine/lua/limiter.lua's layout)."""

        def number(first: int, size: int) -> np.ndarray:
            wide = np.zeros((grid.shape[0], 8), dtype=np.uint8)
            wide[:, 8 - size :] = grid[:, first : first + size]
            return wide.view(">u8").ravel().astype(np.uint64)

        slots = (grid.shape[1] - log.ENTRY_BASE) // 4
        tags = (
            np.ascontiguousarray(grid[:, log.ENTRY_BASE :]).view(">u4").astype(np.uint32)
            if slots
            else np.zeros((grid.shape[0], 0), dtype=np.uint32)
        )
        return Entries(
            user=users,
            channel=channel.astype(np.int32),
            at=number(0, 6).astype(np.int64),
            message=number(6, 7),
            campaign=np.ascontiguousarray(grid[:, 13:17]).view(">u4").ravel().astype(np.uint32),
            held=np.ascontiguousarray(grid[:, 17:21]).view(">u4").ravel().astype(np.uint32),
            uncounted=uncounted,
            tags=tags.reshape(grid.shape[0], slots),
        )

    @classmethod
    def read(
        cls,
        limiter: Limiter,
        users: np.ndarray | None = None,
        channels: Sequence[str] = (),
        *,
        buckets: np.ndarray | None = None,
    ) -> "ModelLogs":
        """The logs of `users` (and of the others who share their keys) as the limiter's Redis
        holds them now: every group key of their buckets (and the bucket's own, until every
        log is in its group), read in pipelines. A user's logs are in one of the two, the
        group's when both say so (it is their home). `buckets`: theirs (users_buckets), given
        instead of `users`."""
        if buckets is None:
            buckets = users_buckets(np.asarray(users, dtype=_U64))
        client, prefix = limiter.client, limiter.prefix
        with_bucket = not limiter.grouped()  # until every log is in its group: the bucket too

        def fetched(first: int) -> tuple[list[int], list[Any]]:
            pipe = client.pipeline(transaction=False)
            asked = [int(b) << log.BUCKET_BITS for b in buckets[first : first + READ_BATCH]]
            for base in asked:
                keys = [log.group_key(prefix, base + (g << 4)) for g in range(16)]
                if with_bucket:
                    keys.append(log.bucket_key(prefix, base))
                pipe.execute_command("EVAL", _READ_SCRIPT, len(keys), *keys)
            return asked, pipe.execute()

        out = cls(channels=channels)
        parts: list[Entries] = []
        # Redis answers the next batch while this thread decodes the last one (the reading
        # thread waits on its socket, which holds no lock).
        starts = list(range(0, buckets.size, READ_BATCH))
        with ThreadPoolExecutor(max_workers=1) as reader:
            coming = reader.submit(fetched, starts[0]) if starts else None
            for k in range(len(starts)):
                assert coming is not None
                asked, replies = coming.result()
                coming = reader.submit(fetched, starts[k + 1]) if k + 1 < len(starts) else None
                parts.append(out._fields_decoded(asked, replies))
        # Buckets in order, each one's users in order: the whole is sorted by user.
        out._add(joined(parts).sorted())
        return out

    def _fields_decoded(self, asked: list[int], replies: list[Any]) -> Entries:
        """The entries of one batch's replies (its buckets' first users, in order)."""
        names: list[bytes] = []
        values: list[bytes] = []
        bases: list[int] = []
        in_bucket: list[bool] = []
        counts: list[int] = []
        for base, reply in zip(asked, replies, strict=True):
            at = 0
            while at < len(reply):
                key, pairs = reply[at], reply[at + 1]
                names.extend(reply[at + 2 : at + 2 + 2 * pairs : 2])
                values.extend(reply[at + 3 : at + 2 + 2 * pairs : 2])
                bases.append(base)
                in_bucket.append(key == 17)
                counts.append(pairs)
                at += 2 + 2 * pairs
        return self._from_fields(names, values, bases, in_bucket, counts)

    def _from_fields(
        self,
        names: list[bytes],
        values: list[bytes],
        bases: list[int],
        in_bucket: list[bool],
        counts: list[int],
    ) -> Entries:
        """The logs in the fields read (each key's: its bucket's first user, whether it is the
        bucket's own key, how many fields), as entries sorted by user."""
        if not names:
            return Entries.empty()
        per_key = np.asarray(counts, dtype=np.int64)
        base = np.repeat(np.asarray(bases, dtype=_U64), per_key)
        bucket_key = np.repeat(np.asarray(in_bucket, dtype=bool), per_key)
        length = np.fromiter(map(len, names), np.int64, len(names))
        last = np.frombuffer(b"".join(names), dtype=np.uint8)[np.cumsum(length) - 1]
        size = np.fromiter(map(len, values), np.int64, len(values))
        # A counted log's field is its user's low byte; an uncounted one's, '~' and that byte.
        keep = ((length == 1) | (length == 2)) & (size > 0)
        user = base + last.astype(_U64)
        uncounted = length == 2
        rows = np.flatnonzero(keep)
        # Each user's log once: the one in a group where both keys hold one.
        rows = rows[np.lexsort((bucket_key[rows], uncounted[rows], user[rows]))]
        first = np.ones(rows.size, dtype=bool)
        same = (user[rows][1:] == user[rows][:-1]) & (uncounted[rows][1:] == uncounted[rows][:-1])
        first[1:] = ~same
        rows = rows[first]
        taken = [values[i] for i in rows.tolist()]
        return self._decode(user[rows], uncounted[rows], taken).sorted()


# --- deciding -----------------------------------------------------------------------------------

_RULE = struct.Struct(">BBBI6s6s6s4s")


@dataclass(frozen=True, slots=True)
class Rules:
    """Rule sets as columns, (sets, most rules): kind (0 where a set has fewer rules), every
    channel, calendar, limit, a, b, c, tag."""

    kind: np.ndarray
    every: np.ndarray
    calendar: np.ndarray
    limit: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    tag: np.ndarray

    @staticmethod
    def of(records: Sequence[bytes]) -> "Rules":
        widest = max((len(r) // _RULE.size for r in records), default=0)
        shape = (len(records), widest)
        cols = [np.zeros(shape, dtype=np.int64) for _ in range(8)]
        for s, blob in enumerate(records):
            for p, fields in enumerate(_RULE.iter_unpack(blob)):
                kind, every, calendar, limit, a, b, c, tag = fields
                for col, value in zip(
                    cols,
                    (kind, every, calendar, limit, int.from_bytes(a, "big"),
                     int.from_bytes(b, "big"), int.from_bytes(c, "big"), hash_int(tag)),
                    strict=True,
                ):  # fmt: skip
                    col[s, p] = value
        return Rules(*cols)


@dataclass(slots=True)
class Answers:
    """gk_decide's reply per request, as columns: outcome (1 allowed, 2 duplicate, 3 refused),
    the deciding rule's position (1-based; 0 none), used (a duplicate's: its holder), retry (1 +
    ms; 0 none), and the channel's sends in the last 24 h and 7 days after the decision. And
    what the function does not answer: `room`, the fewest sends any of the request's rules had
    room for before it (NO_LIMIT when it had no rule; an admitted send with 1 would have been
    refused had one more send counted by that rule come first)."""

    outcome: np.ndarray
    rule: np.ndarray
    used: np.ndarray
    retry: np.ndarray
    day: np.ndarray
    week: np.ndarray
    room: np.ndarray


def decide(
    logs: ModelLogs,
    *,
    channel: str,
    users: np.ndarray,
    messages: np.ndarray,
    sets: np.ndarray,
    records: Sequence[bytes],
    now_ms: int,
    campaign: bytes = log.NO_HASH,
    tags: bytes = b"",
    priority: int = DEFAULT_PRIORITY,
    retention_ms: int = 8 * DAY_MS,
    dry: np.ndarray | None = None,
    holder: int = 0,
    uncounted: bool = False,
) -> Answers:
    """One gk_decide call over the model's logs: request k is user `users[k]` sending the
    message `messages[k]` (message_int), fitting the rule set `records[sets[k]]`; `dry[k]`:
    decided, recorded nothing. `campaign` and `tags` as the call's payload has them (4-byte
    hashes). Records the admitted sends that are not dry runs in `logs`."""
    users = np.asarray(users, dtype=_U64)
    n = users.size
    out = Answers(*(np.zeros(n, dtype=np.int64) for _ in range(7)))
    if n == 0:
        return out
    dry = np.zeros(n, dtype=bool) if dry is None else np.asarray(dry, dtype=bool)
    rules = Rules.of(records)
    order = np.argsort(users, kind="stable")
    # A user's k-th request of the call is decided in turn k, after their earlier ones.
    sorted_users = users[order]
    new_user = np.ones(n, dtype=bool)
    new_user[1:] = sorted_users[1:] != sorted_users[:-1]
    group_start = np.maximum.accumulate(np.where(new_user, np.arange(n), 0))
    turn = np.empty(n, dtype=np.int64)
    turn[order] = np.arange(n) - group_start
    context = _Call(
        logs=logs,
        channel=logs.code(channel),
        campaign=hash_int(campaign),
        tags=np.frombuffer(tags, dtype=">u4").astype(np.uint32),
        held=((priority & 0xF) << log.HOLDER_BITS) | (holder % (1 << log.HOLDER_BITS)),
        now=now_ms,
        cutoff=now_ms - retention_ms,
        uncounted=uncounted,
        rules=rules,
    )
    for k in range(int(turn.max()) + 1):
        at = np.nonzero(turn == k)[0]
        context.decide(at, users[at], np.asarray(messages, dtype=_U64)[at], sets[at], dry[at], out)
    return out


@dataclass(slots=True)
class _Call:
    logs: ModelLogs
    channel: int
    campaign: int
    tags: np.ndarray
    held: int
    now: int
    cutoff: int
    uncounted: bool
    rules: Rules

    def decide(
        self,
        at: np.ndarray,
        users: np.ndarray,
        messages: np.ndarray,
        sets: np.ndarray,
        dry: np.ndarray,
        out: Answers,
    ) -> None:
        """Requests `at` of the call, each of a different user."""
        n = users.size
        found, owner, where = self.logs.gathered(users)
        own = found.uncounted == self.uncounted
        on_channel = found.channel == self.channel
        mine = own & on_channel
        now = self.now
        day = np.bincount(owner[mine & (found.at > now - DAY_MS)], minlength=n)
        week = np.bincount(owner[mine & (found.at > now - WEEK_MS)], minlength=n)
        # Duplicates: the message on the channel in the user's log, else in the other one.
        same = on_channel & (found.message == messages[owner])
        outcome = np.ones(n, dtype=np.int64)
        decider = np.zeros(n, dtype=np.int64)
        used = np.zeros(n, dtype=np.int64)
        retry = np.zeros(n, dtype=np.int64)
        room = np.full(n, NO_LIMIT, dtype=np.int64)
        if same.any():
            hits = np.nonzero(same)[0]
            # The user's own log first, then the earliest there.
            first = hits[np.lexsort((found.at[hits], ~own[hits], owner[hits]))]
            keep = np.ones(first.size, dtype=bool)
            keep[1:] = owner[first][1:] != owner[first][:-1]
            first = first[keep]
            outcome[owner[first]] = DUPLICATE
            used[owner[first]] = found.held[first] & ((1 << log.HOLDER_BITS) - 1)
        rules = self.rules
        widest = rules.kind.shape[1]
        if widest:
            self._ruled(found, owner, own, on_channel, sets, outcome, decider, used, retry, room)
        admitted = outcome == ALLOWED
        day = day + admitted
        week = week + admitted
        writes = admitted & ~dry
        if writes.any():
            wrote = writes[owner] & own & (found.at <= self.cutoff)
            if wrote.any():
                self.logs.drop(where, wrote)
            self.logs.record(self._entries(users[writes], messages[writes]))
        out.outcome[at] = outcome
        out.rule[at] = decider
        out.used[at] = used
        out.retry[at] = retry
        out.day[at] = day
        out.week[at] = week
        out.room[at] = room

    def _ruled(
        self,
        found: Entries,
        owner: np.ndarray,
        own: np.ndarray,
        on_channel: np.ndarray,
        sets: np.ndarray,
        outcome: np.ndarray,
        decider: np.ndarray,
        used: np.ndarray,
        retry: np.ndarray,
        room: np.ndarray,
    ) -> None:
        """The rules of each request not a duplicate: the deciding one, when some has no room;
        `room`: the fewest sends any of them had room for."""
        rules, now, n = self.rules, self.now, sets.size
        widest = rules.kind.shape[1]
        asked = outcome == ALLOWED
        never_at = np.full(n, widest, dtype=np.int64)  # the first rule of limit 0
        best_wait = np.full(n, -1, dtype=np.int64)
        best_at = np.zeros(n, dtype=np.int64)
        best_used = np.zeros(n, dtype=np.int64)
        never_used = np.zeros(n, dtype=np.int64)
        campaign_match = found.campaign == self.campaign
        counted = own & asked[owner]
        for p in range(widest):
            kind = rules.kind[sets, p]
            live = asked & (kind > 0)
            if not live.any():
                continue
            every = rules.every[sets, p] == 1
            calendar = rules.calendar[sets, p] == 1
            limit = rules.limit[sets, p]
            a, b, c = rules.a[sets, p], rules.b[sets, p], rules.c[sets, p]
            later = now >= b
            start = np.where(calendar, np.where(later, b - 1, a - 1), now - a)
            period_end = np.where(later, c, b)
            k_e = kind[owner]
            matched = counted & live[owner] & (every[owner] | on_channel)
            matched &= found.at > start[owner]
            if (k_e == KIND_TAG).any():
                tag = rules.tag[sets, p].astype(np.uint32)[owner]
                holds_tag = (
                    (found.tags == tag[:, None]).any(axis=1)
                    if found.tags.shape[1]
                    else (np.zeros(owner.size, dtype=bool))
                )
                matched &= (k_e != KIND_TAG) | holds_tag
            matched &= (k_e != KIND_CAMPAIGN) | campaign_match
            count = np.bincount(owner[matched], minlength=n)
            np.minimum(room, np.where(live, limit - count, NO_LIMIT), out=room)
            full = live & (count >= limit)
            if not full.any():
                continue
            never = full & (limit == 0)
            first_never = never & (never_at == widest)
            never_at[first_never] = p
            never_used[first_never] = count[first_never]
            waiting = full & (limit > 0)
            wait = np.full(n, -1, dtype=np.int64)
            wait[waiting & calendar] = (period_end - now)[waiting & calendar]
            rolling = waiting & ~calendar
            if rolling.any():
                # The entry that must leave for one more to fit: the (count - limit)-th oldest.
                rows = np.nonzero(matched & rolling[owner])[0]
                rows = rows[np.lexsort((found.at[rows], owner[rows]))]
                whose = owner[rows]
                first_row = np.searchsorted(whose, np.nonzero(rolling)[0], side="left")
                leaving = found.at[rows[first_row + (count - limit)[rolling]]]
                wait[rolling] = leaving + a[rolling] - now
            better = waiting & (wait >= 0) & (wait > best_wait)
            best_wait[better] = wait[better]
            best_at[better] = p
            best_used[better] = count[better]
        by_never = never_at < widest
        by_wait = ~by_never & (best_wait >= 0)
        outcome[by_never | by_wait] = REFUSED
        decider[by_never] = never_at[by_never] + 1
        used[by_never] = never_used[by_never]
        decider[by_wait] = best_at[by_wait] + 1
        used[by_wait] = best_used[by_wait]
        retry[by_wait] = best_wait[by_wait] + 1

    def _entries(self, users: np.ndarray, messages: np.ndarray) -> Entries:
        n = users.size
        return Entries(
            user=users,
            channel=np.full(n, self.channel, dtype=np.int32),
            at=np.full(n, self.now, dtype=np.int64),
            message=messages,
            campaign=np.full(n, self.campaign, dtype=np.uint32),
            held=np.full(n, self.held, dtype=np.uint32),
            uncounted=np.full(n, self.uncounted, dtype=bool),
            tags=np.tile(self.tags, (n, 1)) if self.tags.size else np.zeros((n, 0), np.uint32),
        )


class ModelLimiter:
    """The limiter as the gate calls it (`acquire`), answered by the model over `logs`: nothing
    is read from Redis or written there."""

    def __init__(self, logs: ModelLogs) -> None:
        self.logs = logs

    def acquire(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        rule_sets: RuleSet | Sequence[RuleSet],
        *,
        campaign: str = "",
        tags: tuple[str, ...] = (),
        priority: int = DEFAULT_PRIORITY,
        retention_ms: int = 8 * DAY_MS,
        now_ms: int | None = None,
        dry_run: bool | Sequence[bool] = False,
        holder: int = 0,
        uncounted: bool = False,
    ) -> list[Decision]:
        """Limiter.acquire's decisions (its arguments), from the model."""
        now_ms = ms_checked(now_ms)
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        sets_given, dry = per_request(requests, rule_sets, dry_run)
        if not requests:
            return []
        index: dict[bytes, int] = {}
        set_of = np.fromiter(
            (index.setdefault(s.records, len(index)) for s in sets_given),
            dtype=np.int64,
            count=len(requests),
        )
        answers = decide(
            self.logs,
            channel=channel,
            users=np.fromiter((u for u, _ in requests), dtype=_U64, count=len(requests)),
            messages=np.fromiter(
                (message_int(log.message_hash(m)) for _, m in requests),
                dtype=_U64,
                count=len(requests),
            ),
            sets=set_of,
            records=list(index),
            now_ms=now_ms,
            campaign=log.short_hash(campaign),
            tags=log.tags_bytes(tags),
            priority=priority,
            retention_ms=retention_ms,
            dry=np.asarray(dry, dtype=bool),
            holder=holder,
            uncounted=uncounted,
        )
        return [
            Limiter._decision(
                requests[k],
                sets_given[k],
                int(answers.outcome[k]),
                int(answers.rule[k]),
                int(answers.used[k]),
                int(answers.retry[k]),
                int(answers.day[k]),
                int(answers.week[k]),
                now_ms=now_ms,
                priority=priority,
            )
            for k in range(len(requests))
        ]
