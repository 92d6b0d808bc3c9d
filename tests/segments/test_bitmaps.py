"""The pure build steps, and interoperability with the Java and C Roaring implementations."""

import array
from pathlib import Path

import numpy as np
from pyroaring import BitMap, BitMap64

from segments.bitmaps import bitmap_from_chunks, deserialize, resolve_overlaps, serialize

DATA = Path(__file__).parent / "data" / "roaring"


def java_set() -> list[int]:
    return [*range(0, 100_000, 1000), *range(300_000, 600_000, 3), *range(700_000, 800_000)]


def test_we_read_what_java_wrote_with_and_without_runs():
    expected = BitMap(java_set())
    for name in ("bitmapwithruns.bin", "bitmapwithoutruns.bin"):
        bitmap = deserialize((DATA / name).read_bytes())
        assert len(bitmap) == 200_100
        assert bitmap == expected


def test_what_we_publish_is_byte_identical_to_java_after_run_optimisation():
    built = bitmap_from_chunks([np.array(java_set()[::-1], dtype=np.uint32)])
    assert serialize(built) == (DATA / "bitmapwithruns.bin").read_bytes()


def test_without_run_optimisation_we_write_javas_other_file_too():
    plain = BitMap(array.array("I", java_set()), optimize=False)
    assert bytes(plain.serialize()) == (DATA / "bitmapwithoutruns.bin").read_bytes()


def test_we_read_the_portable_64_bit_format_written_by_c():
    bitmap = deserialize((DATA / "portable_bitmap64.bin").read_bytes(), width=64)
    expected = BitMap64()
    for base in (0, 1 << 32):
        expected.update(range(base | 0x00000, (base | 0x09000) + 1))
        expected.update(range(base | 0x0A000, (base | 0x10000) + 1))
        expected.update([base | 0x20000, base | 0x20005])
        expected.update(range(base | 0x80000, base | 0x90000, 2))
    assert len(bitmap) == len(expected) == 188_424
    assert bitmap == expected


def test_a_user_in_several_lists_belongs_to_the_highest_priority_one():
    resolved = resolve_overlaps(
        [("vip", BitMap([1, 2, 3])), ("active", BitMap([2, 3, 4, 5])), ("new", BitMap([5, 6]))]
    )
    assert [(r.slug, list(r.bitmap), r.listed, r.lost_to_higher_priority) for r in resolved] == [
        ("vip", [1, 2, 3], 3, 0),
        ("active", [4, 5], 4, 2),
        ("new", [6], 2, 1),
    ]
