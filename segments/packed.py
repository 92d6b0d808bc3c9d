"""A snapshot's segments as their published bytes, with a container directory for numpy lookups.

pyroaring answers one id at a time (`id in bitmap`) or a set at a time (`bitmap & query`). At
270M users the second, used for batches, spent 4.6 of its 5.7 ms per 10,000 ids in the five
intersections: a 10,000-id query touches some 3,750 of each segment's 4,120 containers, and each
of the 18,750 container pairs costs a quarter of a microsecond, mostly waiting for memory (169 MB
of containers, far beyond the CPU caches, read one pair after another). Here every segment's
portable Roaring bytes are copied, unchanged, into one numpy buffer, and a batch is answered with a
few array operations whose memory reads overlap: each id's container is found through a table of
container keys, and a bitmap container answers with one byte gathered from the buffer, for all
segments and ids at once. Array containers are searched in place through a small rank table
(`_buckets`), run containers by their runs, in lockstep for every id that falls in one. Nothing is
decoded or expanded: memory is the snapshot's size plus some dozens of bytes per container, and
`portable_bytes()` gives each segment's original bytes back.

The portable format (https://github.com/RoaringBitmap/RoaringFormatSpec), as read here:

    32-bit   cookie 12346 (u32), container count (u32)     no run containers
             or cookie 12347 | (count - 1) << 16 (u32), then a bitset saying which are runs
             per container: key (u16), cardinality - 1 (u16)
             per container: its byte offset (u32); absent when runs are present and count < 4
             the containers, one after another:
                array   cardinality <= 4096 sorted values (u16)
                bitmap  8192 bytes, bit i of byte j = value 8 j + i
                run     run count (u16), then per run its start and length - 1 (u16 each)
    64-bit   bitmap count (u64), then per bitmap: its high 32 bits (u32), a 32-bit bitmap

All integers are little-endian. Containers are read one after another, as CRoaring does (the
offsets are skipped, not trusted). The bytes have been validated by pyroaring before they get
here (`segments.index`); this reader still checks every bound, so a file it accepts cannot send a
lookup outside the buffer.
"""

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

COOKIE_NO_RUNS = 12346
COOKIE_RUNS = 12347
NO_OFFSET_THRESHOLD = 4
ARRAY_MAX = 4096
BITSET_BYTES = 8192

_BIT = np.array([1 << i for i in range(8)], dtype=np.uint8)


class PortableFormatError(ValueError):
    """Bytes that are not a portable Roaring bitmap this reader can use."""


@dataclass
class _Chunk:
    """One 32-bit portable bitmap inside a segment's bytes: the whole file for 32-bit ids,
    one per distinct high 32 bits for 64-bit ids."""

    high: int  # the high 32 bits (0 for 32-bit ids)
    start: int  # where its bytes start and end in the segment's bytes
    end: int
    keys: np.ndarray  # int64 container keys (the high 16 bits of the low 32)
    cards: np.ndarray  # int64 cardinalities
    runs: np.ndarray  # bool: run container
    run_counts: np.ndarray  # int64: the run count of each run container, 0 for the others
    payload: np.ndarray  # int64 position of each container's payload, from `start`


def _u16(view: memoryview, position: int) -> int:
    return int(struct.unpack_from("<H", view, position)[0])


def _parse_chunk(view: memoryview, start: int, limit: int, high: int) -> _Chunk:
    """The container directory of the 32-bit portable bitmap at `view[start:]`, which must end
    by `limit`."""
    if start + 4 > limit:
        raise PortableFormatError("truncated header")
    (cookie,) = struct.unpack_from("<I", view, start)
    position = start + 4
    if cookie & 0xFFFF == COOKIE_RUNS:
        count = (cookie >> 16) + 1
        flag_bytes = (count + 7) // 8
        if position + flag_bytes > limit:
            raise PortableFormatError("truncated run flags")
        flags = np.frombuffer(view, dtype=np.uint8, count=flag_bytes, offset=position)
        runs = np.unpackbits(flags, bitorder="little")[:count].astype(bool)
        position += flag_bytes
        has_offsets = count >= NO_OFFSET_THRESHOLD
    elif cookie == COOKIE_NO_RUNS:
        if position + 4 > limit:
            raise PortableFormatError("truncated header")
        (count,) = struct.unpack_from("<I", view, position)
        position += 4
        runs = np.zeros(count, dtype=bool)
        has_offsets = True
    else:
        raise PortableFormatError(f"unknown cookie {cookie:#x}")
    if count > 1 << 16:
        raise PortableFormatError(f"{count} containers (at most 65536)")
    if position + 4 * count > limit:
        raise PortableFormatError("truncated container headers")
    pairs = np.frombuffer(view, dtype="<u2", count=2 * count, offset=position).astype(np.int64)
    keys, cards = pairs[0::2].copy(), pairs[1::2] + 1
    position += 4 * count
    if has_offsets:
        position += 4 * count  # offsets: skipped; the containers follow one another
    if count and (np.diff(keys) <= 0).any():
        raise PortableFormatError("container keys not strictly increasing")
    sizes = np.where(cards <= ARRAY_MAX, 2 * cards, BITSET_BYTES)
    run_counts = np.zeros(count, dtype=np.int64)
    payload = np.empty(count, dtype=np.int64)
    # A run container's size is in its first two bytes, so positions are found in order; without
    # runs they are a cumulative sum.
    if not runs.any():
        if count:
            payload[0] = position
            np.cumsum(sizes[:-1], out=payload[1:])
            payload[1:] += position
            position += int(sizes.sum())
    else:
        for i in range(count):
            payload[i] = position
            if runs[i]:
                if position + 2 > limit:
                    raise PortableFormatError("truncated run container")
                run_counts[i] = _u16(view, position)
                if run_counts[i] == 0:  # as pyroaring: a run container holds at least one run
                    raise PortableFormatError("run container with zero runs")
                sizes[i] = 2 + 4 * run_counts[i]
            position += int(sizes[i])
    if position > limit:
        raise PortableFormatError(f"containers end at byte {position}, past {limit}")
    return _Chunk(
        high=high,
        start=start,
        end=position,
        keys=keys,
        cards=cards,
        runs=runs,
        run_counts=run_counts,
        payload=payload - start,
    )


def parse_portable(data: bytes | memoryview, *, width: int) -> list[_Chunk]:
    """The chunks of one segment's bytes; the bytes must be exactly one bitmap."""
    view = memoryview(data).cast("B")
    if width == 32:
        chunks = [_parse_chunk(view, 0, len(view), 0)]
    else:
        if len(view) < 8:
            raise PortableFormatError("truncated 64-bit header")
        (count,) = struct.unpack_from("<Q", view, 0)
        position, chunks, previous = 8, [], -1
        for _ in range(count):
            if position + 4 > len(view):
                raise PortableFormatError("truncated 64-bit header")
            (high,) = struct.unpack_from("<I", view, position)
            if high <= previous:
                raise PortableFormatError("high keys not strictly increasing")
            chunk = _parse_chunk(view, position + 4, len(view), high)
            chunks.append(chunk)
            position, previous = chunk.end, high
    end = chunks[-1].end if chunks else 8
    if end != len(view):
        raise PortableFormatError(f"{len(view) - end} bytes after the bitmap")
    return chunks


@dataclass
class _Layout:
    """Where every container of every segment sits in the shared buffer."""

    buffer: np.ndarray  # uint8: the segments' bytes, then the zero block
    zero: int  # where the zero block starts
    spans: list[list[tuple[int, int, int]]]  # per segment, per chunk: (high, start, end)
    segment: np.ndarray  # per container: its segment
    key: np.ndarray  # per container: high 32 bits << 16 | its 16-bit key
    kind: np.ndarray  # per container: ARRAY, BITMAP or RUN
    place: np.ndarray  # per container: its payload's byte position in the buffer
    size: np.ndarray  # per container: its cardinality (array) or run count (run)


ARRAY, BITMAP, RUN = 0, 1, 2


def _lay_out(blobs: Sequence[bytes | memoryview], parsed: list[list[_Chunk]]) -> _Layout:
    """Copy every segment into one buffer, each chunk placed so that its containers start on
    an even byte (u16 reads need that), then 8 KiB of zeros that every absent container points
    at: "no container" answers like an empty bitmap container, with no test for it."""
    room = sum(len(memoryview(b).cast("B")) + len(p) for b, p in zip(blobs, parsed, strict=True))
    buffer = np.zeros(room + BITSET_BYTES + 4, dtype=np.uint8)
    position = 0
    spans: list[list[tuple[int, int, int]]] = []
    columns: list[tuple[np.ndarray, ...]] = []
    for segment, (blob, chunks) in enumerate(zip(blobs, parsed, strict=True)):
        source = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
        spans.append([])
        for chunk in chunks:
            if chunk.payload.size and position % 2 != int(chunk.payload[0]) % 2:
                position += 1
            length = chunk.end - chunk.start
            buffer[position : position + length] = source[chunk.start : chunk.end]
            spans[-1].append((chunk.high, position, position + length))
            kind = np.where(chunk.runs, RUN, np.where(chunk.cards <= ARRAY_MAX, ARRAY, BITMAP))
            columns.append(
                (
                    np.full(chunk.keys.size, segment, dtype=np.int64),
                    (np.int64(chunk.high) << 16) | chunk.keys,
                    kind.astype(np.int8),
                    chunk.payload + position,
                    np.where(chunk.runs, chunk.run_counts, chunk.cards),
                )
            )
            position += length
    position += position % 2
    if columns:
        segment_of, key, kind, place, size = (np.concatenate(c) for c in zip(*columns, strict=True))
    else:
        segment_of = key = kind = place = size = np.zeros(0, dtype=np.int64)
    return _Layout(
        buffer=buffer[: position + BITSET_BYTES],
        zero=position,
        spans=spans,
        segment=segment_of,
        key=key,
        kind=kind,
        place=place,
        size=size,
    )


class PackedSegments:
    """The segments of one snapshot in priority order (disjoint or not), answering which is the
    first (highest-priority) segment that holds each id."""

    def __init__(self, blobs: Sequence[bytes | memoryview], *, width: int) -> None:
        if width not in (32, 64):
            raise ValueError(f"id width {width}: 32 or 64")
        self.width = width
        self.count = len(blobs)
        parsed = [parse_portable(blob, width=width) for blob in blobs]
        self.cardinalities = [sum(int(c.cards.sum()) for c in chunks) for chunks in parsed]
        layout = _lay_out(blobs, parsed)
        self.container_counts = [
            {
                name: int(((layout.segment == s) & (layout.kind == kind)).sum())
                for name, kind in (("array", ARRAY), ("bitmap", BITMAP), ("run", RUN))
            }
            for s in range(self.count)
        ]
        self._buffer, self._zero, self._spans = layout.buffer, layout.zero, layout.spans
        self._words = self._buffer.view("<u2")  # every chunk's containers start on an even byte

        # Rows: every container key present in some segment, and one last row for the rest.
        self._keys = np.unique(layout.key)
        absent = self._keys.size
        row = np.searchsorted(self._keys, layout.key)
        # base[segment, row]: where that segment's container for that key is. A bitmap
        # container: its payload's byte position (>= 0); none: the zero block; an array or run
        # container: -1 - its index in the `_other_*` arrays.
        self._base = np.full((max(self.count, 1), absent + 1), self._zero, dtype=np.int64)
        bitmap = layout.kind == BITMAP
        self._base[layout.segment[bitmap], row[bitmap]] = layout.place[bitmap]
        other = ~bitmap
        self._other_run = layout.kind[other] == RUN
        # in u16 units: the first value of an array, the first run start (after the run count)
        self._other_first = (layout.place[other] + np.where(self._other_run, 2, 0)) // 2
        self._other_size = layout.size[other]
        self._base[layout.segment[other], row[other]] = -1 - np.arange(int(other.sum()))
        self._has_other = bool(other.any())
        self._weights = np.arange(
            self.count, 0, -1, dtype=np.uint8 if self.count < 256 else np.intp
        )[:, None]
        self._bucket_shift, self._bucket_at, self._ranks = _buckets(
            self._words, self._other_first, self._other_size, self._other_run
        )
        # Key to row: a dense table (one gather per id) when the keys are dense enough that it
        # costs no more than a few bytes per container, as user ids handed out in order are;
        # otherwise a binary search in the keys (64-bit ids, or a few ids spread over 2^32).
        self._row_of_key: np.ndarray | None = None
        if width == 32 and (int(self._keys[-1]) if absent else 0) < 4 * absent + 1024:
            self._row_of_key = np.full(
                int(self._keys[-1]) + 2 if absent else 1, absent, dtype=np.intp
            )
            self._row_of_key[self._keys] = np.arange(absent)

        # Plain-Python views for `first_containing_one`, which a numpy call per id would slow.
        self._rows, self._absent = absent + 1, absent
        self._dense_size = self._row_of_key.size if self._row_of_key is not None else 0
        self._bytes = self._buffer.data
        self._u16 = self._words.astype("=u2", copy=False).data  # a view when little-endian
        self._key_list = self._keys.data
        self._row_list = self._row_of_key.data if self._row_of_key is not None else None
        flat = self._base.reshape(-1).data
        self._by_segment = tuple(
            (s, flat[s * self._rows : (s + 1) * self._rows]) for s in range(self.count)
        )

    @property
    def dense_keys(self) -> bool:
        """Whether a key finds its row by a table (dense keys) or by a binary search."""
        return self._row_of_key is not None

    @property
    def nbytes(self) -> int:
        """What the index holds in memory: the buffer and the directory."""
        return int(
            self._buffer.nbytes
            + self._base.nbytes
            + self._keys.nbytes
            + self._other_first.nbytes
            + self._other_size.nbytes
            + self._other_run.nbytes
            + self._bucket_shift.nbytes
            + self._bucket_at.nbytes
            + self._ranks.nbytes
            + (self._row_of_key.nbytes if self._row_of_key is not None else 0)
        )

    def portable_bytes(self, segment: int) -> bytes:
        """The segment's bytes exactly as they were given (and as they are published)."""
        spans = self._spans[segment]
        if self.width == 32:
            _, start, end = spans[0]
            return self._buffer[start:end].tobytes()
        parts = [struct.pack("<Q", len(spans))]
        for high, start, end in spans:
            parts += [struct.pack("<I", high), self._buffer[start:end].tobytes()]
        return b"".join(parts)

    # --- lookups ---------------------------------------------------------------------------

    def first_containing(self, values: np.ndarray) -> np.ndarray:
        """For each id (uint32 for width 32, uint64 for 64), the position of the first segment
        holding it, or `count` when none does."""
        if not self.count:
            return np.zeros(values.size, dtype=np.intp)
        high = (values >> values.dtype.type(16)).astype(np.intp)
        if self._row_of_key is not None:
            rows = self._row_of_key[np.minimum(high, self._row_of_key.size - 1)]
        else:
            rows = np.searchsorted(self._keys, high)
            missing = rows >= self._keys.size
            missing[~missing] = self._keys[rows[~missing]] != high[~missing]
            rows[missing] = self._keys.size
        low = (values & 0xFFFF).astype(np.intp)
        base = np.take(self._base, rows, axis=1)  # (segments, ids); take beats [:, rows]
        in_other: tuple[np.ndarray, np.ndarray] | None = None
        if self._has_other:
            segment, column = np.nonzero(base < 0)
            if segment.size:
                found = self._search(-1 - base[segment, column], low[column])
                base[segment, column] = self._zero
                in_other = (segment[found], column[found])
        base += low >> 3
        held = (np.take(self._buffer, base) & _BIT[low & 7]) != 0
        if in_other is not None:
            held[in_other] = True
        # The highest-priority segment holding each id: weights fall with priority, so the
        # largest weight held names it (a branch-free reduction, ten times faster than argmax
        # or a mask per segment on unpredictable bits); none held leaves 0: `count`.
        weight = (held.view(np.uint8) * self._weights).max(axis=0)
        return self.count - weight.astype(np.intp)

    def _search(self, other: np.ndarray, low: np.ndarray) -> np.ndarray:
        """Is `low` in each array or run container? Searched in lockstep for all of them."""
        run = self._other_run[other]
        if not run.any():
            return self._in_arrays(other, low)
        found = np.empty(other.size, dtype=bool)
        found[~run] = self._in_arrays(other[~run], low[~run])
        found[run] = self._in_runs(other[run], low[run])
        return found

    def _in_arrays(self, other: np.ndarray, low: np.ndarray) -> np.ndarray:
        # The bucket of `low` holds the values from ranks[j] to ranks[j + 1] of the container.
        first = self._other_first[other]
        j = self._bucket_at[other] + (low >> self._bucket_shift[other])
        start, end = first + self._ranks[j], first + self._ranks[j + 1]
        at = _last_at_most(self._words, start, np.maximum(end - 1, start), low)
        return (start < end) & (self._words.take(at) == low)

    def _in_runs(self, other: np.ndarray, low: np.ndarray) -> np.ndarray:
        # Runs are (start, length - 1) pairs: find the last run starting at or before `low`.
        first, size = self._other_first[other], self._other_size[other]
        at = np.zeros(other.size, dtype=np.intp)
        step = _first_step(int((size - 1).max()))
        while step:
            probe = np.minimum(at + step, size - 1)
            at = np.where(self._words[first + 2 * probe] <= low, probe, at)
            step >>= 1
        begins = self._words[first + 2 * at].astype(np.intp)
        return (begins <= low) & (low <= begins + self._words[first + 2 * at + 1])

    def first_containing_one(self, value: int) -> int:
        """`first_containing` for one id, in plain Python (a numpy call costs more than this)."""
        key = value >> 16
        if self._row_list is not None:
            row = self._row_list[key] if key < self._dense_size else self._absent
        else:
            row = bisect.bisect_left(self._key_list, key)
            if row == self._absent or self._key_list[row] != key:
                row = self._absent
        data, byte, bit = self._bytes, (value & 0xFFFF) >> 3, 1 << (value & 7)
        for segment, bases in self._by_segment:
            base = bases[row]
            if base >= 0:
                if data[base + byte] & bit:
                    return segment
            elif self._search_one(-1 - base, value & 0xFFFF):
                return segment
        return self.count

    def _search_one(self, other: int, low: int) -> bool:
        first, size, words = int(self._other_first[other]), int(self._other_size[other]), self._u16
        if not self._other_run[other]:
            j = int(self._bucket_at[other]) + (low >> int(self._bucket_shift[other]))
            start, end = first + int(self._ranks[j]), first + int(self._ranks[j + 1])
            at = bisect.bisect_left(words, low, start, end)
            return at < end and words[at] == low
        begins = words[first : first + 2 * size : 2]
        at = bisect.bisect_right(begins, low) - 1
        return at >= 0 and low <= begins[at] + words[first + 2 * at + 1]


def _last_at_most(
    words: np.ndarray, start: np.ndarray, last: np.ndarray, value: np.ndarray
) -> np.ndarray:
    """For each range of sorted u16 words [start, last], the last position whose word is at
    most `value` (`start` when none is). A branchless binary search, in lockstep for all
    ranges: each step tries to move every position forward by the same power of two, probing
    no further than `last`, so a range shorter than the step simply probes its end."""
    at = start.copy()
    step = _first_step(int((last - start).max(initial=0)))
    while step:
        probe = np.minimum(at + step, last)
        at = np.where(words.take(probe) <= value, probe, at)
        step >>= 1
    return at


def _first_step(span: int) -> int:
    """The largest power of two not above `span`: the steps from it down to 1 add up to at
    least `span`, so they reach every position of a range `span` long."""
    return 1 << (span.bit_length() - 1) if span > 0 else 0


BUCKET_TARGET = 16  # values per bucket of an array container, on average


def _buckets(
    words: np.ndarray, first: np.ndarray, size: np.ndarray, run: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank buckets for the array containers, so that a lookup searches ~16 values, not up to
    4096: a container of n values gets 2^b buckets (b = log2(n / 16), 1 bucket below 32
    values), each covering 2^(16 - b) consecutive low values, and ranks[j] counts the values
    below bucket j's first. The ranks take 1/16 of a u16 per value: 3% over the containers.
    Run containers get one bucket (they are searched by run, not by value)."""
    b = np.where(run, 0, np.floor(np.log2(np.maximum(size, 1) / BUCKET_TARGET)).clip(0))
    b = b.astype(np.int64)
    buckets = 1 << b
    at = np.zeros(size.size, dtype=np.int64)
    np.cumsum(buckets[:-1] + 1, out=at[1:])
    ranks = np.zeros(int((buckets + 1).sum()), dtype=np.uint16)
    ranks[at + buckets] = size  # past the last bucket: all of them
    # Inner boundaries (bucket 1 .. 2^b - 1 of each container), found by the same lockstep
    # search in chunks, so that a snapshot of many small arrays never needs a large temporary.
    inner = np.flatnonzero(buckets > 1)
    for chunk in np.array_split(inner, max(1, int((buckets[inner] - 1).sum()) // 1_000_000 + 1)):
        count = buckets[chunk] - 1
        owner = np.repeat(chunk, count)
        j = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + 1
        below = (j << (16 - b[owner])) - 1  # the largest low value before bucket j
        start = first[owner]
        last = _last_at_most(words, start, start + size[owner] - 1, below)
        ranks[at[owner] + j] = np.where(words[last] <= below, last - start + 1, 0)
    return (16 - b).astype(np.int8), at, ranks
