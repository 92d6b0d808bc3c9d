"""The pure part of a build: ids -> bitmaps -> overlap resolution -> portable bytes.

Nothing here touches storage or the database, so it is tested and benchmarked on its own.
"""

import array
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap, BitMap64, FrozenBitMap, FrozenBitMap64

AnyBitMap = BitMap | BitMap64
AnyFrozen = FrozenBitMap | FrozenBitMap64


def empty_bitmap(width: int) -> AnyBitMap:
    return BitMap() if width == 32 else BitMap64()


def add_ids(bitmap: AnyBitMap, ids: np.ndarray) -> None:
    """Add a chunk of ids. Sorting first lets pyroaring fill containers sequentially, which is
    about ten times faster than adding ids in random order."""
    ordered = np.sort(ids, kind="stable")  # a radix sort for integer arrays
    if isinstance(bitmap, BitMap):
        bitmap.update(array.array("I", ordered.astype(np.uint32, copy=False).tobytes()))
    else:
        bitmap.update(array.array("Q", ordered.astype(np.uint64, copy=False).tobytes()))


def bitmap_from_chunks(chunks: Iterable[np.ndarray], *, width: int = 32) -> AnyBitMap:
    bitmap = empty_bitmap(width)
    for ids in chunks:
        add_ids(bitmap, ids)
    return bitmap


@dataclass
class Resolved:
    slug: str
    bitmap: AnyBitMap
    listed: int
    lost_to_higher_priority: int


def resolve_overlaps(listed: Sequence[tuple[str, AnyBitMap]], *, width: int = 32) -> list[Resolved]:
    """Make segments exclusive: `listed` comes in priority order (winner first), and a user in
    several lists stays only in the first segment that lists them."""
    claimed = empty_bitmap(width)
    resolved = []
    for slug, bitmap in listed:
        own = bitmap - claimed  # type: ignore[operator]
        claimed |= own  # type: ignore[operator]
        resolved.append(
            Resolved(
                slug=slug,
                bitmap=own,
                listed=len(bitmap),
                lost_to_higher_priority=len(bitmap) - len(own),
            )
        )
    return resolved


def serialize(bitmap: AnyBitMap) -> bytes:
    """The portable Roaring format (readable by Java, Go, C, Rust), run containers where they
    are smaller; byte-identical to what the Java implementation writes for the same set."""
    bitmap.run_optimize()
    bitmap.shrink_to_fit()
    return bytes(bitmap.serialize())


def deserialize(data: bytes, *, width: int = 32) -> AnyFrozen:
    if width == 32:
        return FrozenBitMap.deserialize(data)
    return FrozenBitMap64.deserialize(data)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
