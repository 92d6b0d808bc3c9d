"""The index's lookups over the packed snapshot bytes give exactly the plain bitmap answer: the
highest-priority segment whose bitmap holds the id (`id in FrozenBitMap`), else the default."""

import array
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64, FrozenBitMap

from segments.bitmaps import AnyFrozen, deserialize, serialize, sha256
from segments.index import SegmentIndex, SnapshotError, index_from_objects
from segments.packed import PackedSegments, PortableFormatError, parse_portable
from tests.conftest import examples

DATA = Path(__file__).parent / "data" / "roaring"
MAX_32 = 2**32 - 1
EDGES_32 = [0, 1, 65534, 65535, 65536, 65537, 131071, 131072, MAX_32 - 1, MAX_32]


def snapshot(
    segments: list[tuple[str, bytes]], *, width: int = 32
) -> tuple[SegmentIndex, list[tuple[str, AnyFrozen]]]:
    """An index loaded the way a process loads one (manifest, sha256, sizes), and the plain
    bitmaps in priority order to check it against."""
    objects = {f"{slug}.roaring": data for slug, data in segments}
    plain = [(slug, deserialize(data, width=width)) for slug, data in segments]
    manifest = {
        "version": "v1",
        "id_width": width,
        "segments": [
            {
                "slug": slug,
                "is_default": False,
                "cardinality": len(bitmap),
                "bytes": len(objects[f"{slug}.roaring"]),
                "sha256": sha256(objects[f"{slug}.roaring"]),
                "key": f"{slug}.roaring",
            }
            for slug, bitmap in plain
        ]
        + [{"slug": "default", "is_default": True}],
    }
    return index_from_objects(json.loads(json.dumps(manifest)), objects.__getitem__), plain


def plain_lookup(plain: list[tuple[str, AnyFrozen]], user_id: int, width: int = 32) -> str:
    if not 0 <= user_id < 2**width:
        return "default"
    return next((slug for slug, bitmap in plain if user_id in bitmap), "default")


def assert_same_answers(index: SegmentIndex, plain: list, ids: list[int], width: int = 32) -> None:
    expected = [plain_lookup(plain, i, width) for i in ids]
    assert index.resolve_many(ids) == expected
    assert [index.resolve(i) for i in ids] == expected
    inside = [i for i in ids if 0 <= i < 2**width]
    dtype = np.uint32 if width == 32 else np.uint64
    assert index.resolve_many(np.array(inside, dtype=dtype)) == [
        plain_lookup(plain, i, width) for i in inside
    ]


def every_container_kind() -> list[tuple[str, bytes]]:
    """Overlapping segments (the index must still answer by priority) holding bitmap, array
    and run containers, the edge ids, and containers that only some segments have."""
    rng = np.random.default_rng(7)
    dense = BitMap(array.array("I", rng.choice(1 << 18, 100_000, replace=False).astype("I")))
    sparse = BitMap(array.array("I", rng.choice(1 << 22, 3_000, replace=False).astype("I")))
    sparse.update([0, 65535, 65536, MAX_32])
    runs = BitMap()
    runs.add_range(65530, 65540)  # a run across a container boundary
    runs.add_range(200_000, 260_000)
    runs.add_range(1 << 20, (1 << 20) + 65536)  # one full container
    runs.update(range(300_000, 306_000, 2))  # an array that run_optimize keeps as an array
    runs.add(MAX_32 - 1)
    for start in range(0, 60_000, 600):  # a container of 100 runs
        runs.add_range((7 << 16) + start, (7 << 16) + start + 1 + start % 7)
    full_array = BitMap(range(5 << 16, (5 << 16) + 8192, 2))  # 4096 values: still an array
    just_bitmap = BitMap(range(6 << 16, (6 << 16) + 8194, 2))  # 4097: a bitmap container
    overlapping = BitMap(array.array("I", rng.choice(1 << 21, 50_000, replace=False).astype("I")))
    overlapping.update(EDGES_32)
    # without run containers: the other cookie, and container offsets
    plain_runs = BitMap(array.array("I", runs.to_array()), optimize=False)
    return [
        ("vip", serialize(sparse)),
        ("runs", serialize(runs)),
        ("dense", serialize(dense)),
        ("arrays", serialize(full_array | just_bitmap)),
        ("unoptimised", bytes(plain_runs.serialize())),
        ("everyone_else", serialize(overlapping)),
        ("empty", serialize(BitMap())),
        ("one_run", serialize(BitMap(range(70_000, 70_100)))),  # < 4 containers: no offsets
    ]


def probe_ids(index_bitmaps: list[tuple[str, AnyFrozen]], *, count: int = 20_000) -> list[int]:
    """Random ids, every edge, the ids on both sides of every stored value's container and
    run ends, ids past every bitmap, negative and too-wide ids."""
    rng = np.random.default_rng(11)
    ids = set(EDGES_32) | {-1, -(2**40), 2**32, 2**40 + 4, 2**64 + 1}
    ids.update(rng.integers(0, 1 << 23, count).tolist())
    ids.update(rng.integers(0, MAX_32, count // 4, dtype=np.int64).tolist())
    for _, bitmap in index_bitmaps:
        values = np.asarray(bitmap.to_array(), dtype=np.int64)
        if values.size:
            sample = rng.choice(values, min(values.size, 2_000), replace=False)
            ids.update((sample - 1).tolist() + sample.tolist() + (sample + 1).tolist())
            ids.update([int(values[-1]) + 1, int(values[-1]) + 65536])
    ids.update([65529, 65530, 65539, 65540, 199_999, 259_999, 260_000, (1 << 20) + 65535])
    for key in (0, 1, 5, 6, 7, 63):  # both sides of every 32-value step: array bucket edges
        edges = (key << 16) + np.arange(0, 65536, 32)
        ids.update(np.concatenate([edges - 1, edges, edges + 1]).tolist())
    return sorted(ids)


def test_lookups_match_the_plain_bitmaps_on_every_container_kind_and_edge_id():
    index, plain = snapshot(every_container_kind())
    kinds = {c["run"] > 0 for c in index.packed.container_counts}
    assert kinds == {True, False}
    counts = index.packed.container_counts
    assert sum(c["array"] for c in counts) and sum(c["bitmap"] for c in counts)
    assert not index.packed.dense_keys  # ids up to 2**32 - 1, few containers: keys searched
    assert_same_answers(index, plain, probe_ids(plain))


def test_the_lookup_is_by_priority_when_lists_overlap():
    low, high = BitMap([5, 70_000, 9]), BitMap([5, 70_000])
    index, _ = snapshot([("first", serialize(high)), ("second", serialize(low))])
    assert index.resolve_many([5, 9, 70_000, 6]) == ["first", "second", "first", "default"]
    assert [index.resolve(i) for i in (5, 9, 70_000, 6)] == ["first", "second", "first", "default"]


def test_java_written_files_are_read_in_place():
    segments = [
        ("with_runs", (DATA / "bitmapwithruns.bin").read_bytes()),
        ("without_runs", (DATA / "bitmapwithoutruns.bin").read_bytes()),
    ]
    index, plain = snapshot(segments)
    ids = [*range(-2, 810_000, 7), 99_999, 100_000, 299_999, 300_000, 799_999, 800_000]
    ids += [851_967, 851_968, 2**20, 2**31, MAX_32]  # past the last container
    assert index.packed.dense_keys  # ids from 0 up: keys found through a table
    assert_same_answers(index, plain, ids)
    # both files hold the same set, so the first one answers for all of it
    assert set(index.resolve_many(ids)) == {"with_runs", "default"}


def test_a_64_bit_snapshot_answers_like_its_bitmaps_across_high_keys():
    c_written = (DATA / "portable_bitmap64.bin").read_bytes()
    other = BitMap64()
    other.update([0, 2**32 - 1, 2**32, 2**40 + 4, 2**63, 2**64 - 1, (1 << 32) | 0x20001])
    other.update(range((3 << 32) + 65530, (3 << 32) + 65600))
    index, plain = snapshot(
        [("c", c_written), ("mine", serialize(other)), ("none", serialize(BitMap64()))], width=64
    )
    rng = np.random.default_rng(3)
    ids = {0, 1, 2**32, 2**32 - 1, 2**64 - 1, 2**64, -1, 2**63, (3 << 32) + 65535}
    for base in (0, 1 << 32, 3 << 32):
        ids.update((base + rng.integers(0, 1 << 20, 3_000)).tolist())
        ids.update(range(base | 0x08FFE, base | 0x09003))
        ids.update(range(base | 0x1FFFE, base | 0x20007))
    assert_same_answers(index, plain, sorted(ids), width=64)


def test_the_index_holds_the_published_bytes_and_gives_them_back():
    segments = every_container_kind()
    index, plain = snapshot(segments)
    for i, (slug, data) in enumerate(segments):
        assert index.packed.portable_bytes(i) == data
        assert index.bitmaps[slug] == dict(plain)[slug]
    assert list(index.bitmaps) == [slug for slug, _ in segments]
    assert index.packed.cardinalities == [len(b) for _, b in plain]
    # memory: the bytes, a byte of alignment each, the 8 KiB zero block and a directory of
    # some dozens of bytes per container (ids up to 2**32 - 1 here: no dense table of 65,536
    # keys); at 270M users that is 0.002 bytes per user (bench/segments.py)
    containers = sum(c["array"] + c["bitmap"] + c["run"] for c in index.packed.container_counts)
    extra = index.packed.nbytes - sum(len(d) for _, d in segments)
    assert extra < 8192 + 128 * containers


def test_batches_with_repeats_wide_ids_and_other_integer_types():
    index, _ = snapshot(
        [("vip", serialize(BitMap([1, 2, 2**32 - 1]))), ("new", serialize(BitMap([3])))]
    )
    assert index.resolve_many([]) == []
    assert index.resolve_many(np.array([], dtype=np.uint32)) == []
    assert index.resolve_many([3, 1, 3, 1, 9]) == ["new", "vip", "new", "vip", "default"]
    # numpy would wrap these into real ids if cast blindly: 2**32 + 1 -> 1, -1 -> 2**32 - 1
    assert index.resolve_many(np.array([2**32 + 1, 3], dtype=np.uint64)) == ["default", "new"]
    assert index.resolve_many(np.array([-1, 1], dtype=np.int64)) == ["default", "vip"]
    assert index.resolve_many(np.array([2**32 - 1, 2], dtype=np.int64)) == ["vip", "vip"]
    assert index.resolve_many([-1, 2**32 + 1, 2**32 - 1]) == ["default", "default", "vip"]


def test_a_snapshot_with_only_the_default_segment():
    index, _ = snapshot([])
    assert index.resolve_many([0, 5, 2**32 - 1]) == ["default"] * 3
    assert index.resolve(7) == "default"


def test_an_index_built_from_bitmaps_answers_the_same():
    segments = every_container_kind()
    loaded, plain = snapshot(segments)
    built = SegmentIndex(
        version="v1",
        id_width=32,
        segments=[slug for slug, _ in segments],
        default_slug="default",
        bitmaps={slug: FrozenBitMap(bitmap) for slug, bitmap in plain},
        cardinalities={slug: len(bitmap) for slug, bitmap in plain},
    )
    ids = probe_ids(plain, count=2_000)
    assert built.resolve_many(ids) == loaded.resolve_many(ids)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["sparse", "dense", "runs"]),
            st.integers(0, 4),  # which containers
            st.integers(0, 2**31),
        ),
        max_size=4,
    ),
    st.lists(st.integers(0, 6 << 16), max_size=300),
)
def test_random_snapshots_answer_like_their_bitmaps(shapes, extra_ids):
    segments = []
    for i, (shape, spread, seed) in enumerate(shapes):
        rng = np.random.default_rng(seed)
        bitmap = BitMap()
        for key in range(spread + 1):
            base = key << 16
            if shape == "sparse":
                bitmap.update((base + rng.choice(65536, 50, replace=False)).tolist())
            elif shape == "dense":
                bitmap.update((base + rng.choice(65536, 9000, replace=False)).tolist())
            else:
                start = int(rng.integers(0, 60_000))
                bitmap.add_range(base + start, base + start + int(rng.integers(1, 5_000)))
        segments.append((f"s{i}", serialize(bitmap) if seed % 2 else bytes(bitmap.serialize())))
    index, plain = snapshot(segments)
    ids = sorted(set(extra_ids) | {0, 65535, 65536, 5 << 16, MAX_32})
    for _, held in plain:
        ids += held.to_array()[:: max(1, len(held) // 50)].tolist()
    assert_same_answers(index, plain, ids)


def test_bytes_that_are_not_one_bitmap_are_refused():
    good = serialize(BitMap([1, 2, 70_000]))
    for bad in (good[:-1], good + b"\0\0", b"\x00" * 8, good[:6]):
        with pytest.raises(PortableFormatError):
            parse_portable(bad, width=32)
    with pytest.raises(PortableFormatError):
        PackedSegments([good[:-2]], width=32)
    wide = serialize(BitMap64([1, 2**40]))
    with pytest.raises(PortableFormatError):
        parse_portable(wide[:-1], width=64)
    manifest = {
        "version": "v1",
        "segments": [
            {"slug": "vip", "cardinality": 3, "bytes": 6, "sha256": sha256(good[:6]), "key": "k"},
            {"slug": "default", "is_default": True},
        ],
    }
    with pytest.raises(SnapshotError, match="not a Roaring bitmap"):
        index_from_objects(manifest, lambda key: good[:6])


def test_a_run_container_without_runs_is_refused():
    import struct

    # One container (cookie 12347, run flag set), key 0, cardinality 1, then zero runs.
    empty_runs = struct.pack("<IBHHH", 12347, 1, 0, 0, 0)
    with pytest.raises(PortableFormatError, match="zero runs"):
        parse_portable(empty_runs, width=32)
    one_run = struct.pack("<IBHHHHH", 12347, 1, 0, 0, 1, 5, 0)  # [5, 5]
    assert parse_portable(one_run, width=32) is not None
