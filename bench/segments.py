"""Segment build and lookup: text list -> bitmaps -> snapshot -> index.

python -m bench segments [-- --users 10000000]      (270000000 for the core seed's user count;
                                                     several sizes: --users 10000000 270000000)

Lookups are measured beside the previous index (pyroaring `FrozenBitMap`s: `in` for one id, one
intersection per segment for a batch), in alternated short runs over the same ids, since other
work on the machine slows whichever runs at the time.
"""

import argparse
import array
import json
import math
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pyroaring import BitMap, FrozenBitMap

from segments.bitmaps import add_ids, deserialize, empty_bitmap, resolve_overlaps, serialize, sha256
from segments.index import SegmentIndex, index_from_objects
from segments.parsing import iter_ids

SEGMENTS = 5
BATCH = 10_000
ROUNDS = 8


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PreviousIndex:
    """The index as it was before the packed form: `FrozenBitMap`s, `in` tested largest
    segment first for one id, and for a batch a query bitmap intersected with each segment,
    the hits placed back by binary search in the sorted batch."""

    def __init__(self, index: SegmentIndex, bitmaps: dict[str, FrozenBitMap]) -> None:
        self.ordered = sorted(bitmaps.items(), key=lambda p: -len(p[1]))
        self.position = {slug: i for i, slug in enumerate(index.segments)}
        self.labels = np.array([*index.segments, index.default_slug], dtype=object)
        self.default = index.default_slug

    def resolve(self, user_id: int) -> str:
        for slug, bitmap in self.ordered:
            if user_id in bitmap:
                return slug
        return self.default

    def resolve_many(self, values: np.ndarray) -> list[str]:
        keyed = np.sort(
            (values.astype(np.uint64) << np.uint64(32)) | np.arange(values.size, dtype=np.uint64)
        )
        ordered = (keyed >> np.uint64(32)).astype(np.uint32)
        order = (keyed & np.uint64(0xFFFFFFFF)).astype(np.intp)
        query = BitMap(array.array("I", ordered.tobytes()), optimize=False)
        found = np.full(values.size, len(self.position), dtype=np.intp)
        repeated = bool((ordered[1:] == ordered[:-1]).any())
        for slug, bitmap in self.ordered:
            hits = bitmap & query
            if not hits:
                continue
            members = np.frombuffer(hits.to_array(), dtype=np.uint32)
            start = np.searchsorted(ordered, members, side="left")
            if not repeated:
                found[start] = self.position[slug]
            else:
                counts = np.searchsorted(ordered, members, side="right") - start
                offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
                found[np.repeat(start, counts) + offsets] = self.position[slug]
        labels = np.empty_like(found)
        labels[order] = found
        return list(self.labels[labels].tolist())


def alternated(previous: Callable[[], int], packed: Callable[[], int]) -> tuple[float, float]:
    """Median rates of `ROUNDS` short runs of each, alternated."""
    rates: tuple[list[float], list[float]] = ([], [])
    for _ in range(ROUNDS):
        for found, step in zip(rates, (previous, packed), strict=True):
            started = time.perf_counter()
            done = step()
            found.append(done / (time.perf_counter() - started))
    return statistics.median(rates[0]), statistics.median(rates[1])


def singles(resolve: Callable[[int], str], ids: list[int]) -> Callable[[], int]:
    def step() -> int:
        for user in ids:
            resolve(user)
        return len(ids)

    return step


def in_batches(
    resolve_many: Callable[[Any], list[str]], batches: list[np.ndarray]
) -> Callable[[], int]:
    def step() -> int:
        done = 0
        for batch in batches:
            done += len(resolve_many(batch))
        return done

    return step


def load_previous(directory: Path, manifest: dict[str, Any]) -> dict[str, FrozenBitMap]:
    """The previous load: read, verify sha256, deserialise into `FrozenBitMap`s."""
    loaded = {}
    for entry in manifest["segments"]:
        if not entry["is_default"]:
            data = (directory / entry["key"]).read_bytes()
            assert sha256(data) == entry["sha256"]
            loaded[entry["slug"]] = deserialize(data)
    return loaded  # type: ignore[return-value]


def write_list(path: Path, ids: np.ndarray) -> None:
    with path.open("wb") as handle:
        for start in range(0, ids.size, 5_000_000):
            block = ids[start : start + 5_000_000]
            handle.write(("\n".join(map(str, block.tolist())) + "\n").encode())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench segments")
    parser.add_argument("--users", type=int, nargs="+", default=[10_000_000])
    args = parser.parse_args(argv)
    summary = []
    for n in args.users:
        summary.append(one_size(n))
        summary.append(sparse_mix(n))
    print("\nresolve_many, 10k batches (previous -> packed), and memory:")
    for line in summary:
        print("  " + line)
    parse_memory()


def one_size(n: int) -> str:
    rng = np.random.default_rng(11)
    print(
        f"{n:,} users (ids 0 to {n - 1:,}, as a user table hands them out) in {SEGMENTS} random segments"
    )

    with tempfile.TemporaryDirectory() as tmp:
        ids = rng.permutation(n).astype(np.uint32)
        assignment = rng.integers(0, SEGMENTS, n)
        files = []
        for s in range(SEGMENTS):
            path = Path(tmp) / f"segment{s}.txt"
            write_list(path, ids[assignment == s])
            files.append(path)
        del ids, assignment
        text_bytes = sum(p.stat().st_size for p in files)

        started = time.perf_counter()
        listed = []
        for s, path in enumerate(files):
            bitmap = empty_bitmap(32)
            with path.open("rb") as handle:
                for chunk in iter_ids(handle):
                    add_ids(bitmap, chunk)
            listed.append((f"s{s}", bitmap))
        parsed = time.perf_counter() - started
        resolved = resolve_overlaps(listed)
        blobs = {r.slug: serialize(r.bitmap) for r in resolved}
        built = time.perf_counter() - started
        snapshot = sum(len(b) for b in blobs.values())
        peak = rss_mb()

        manifest = {
            "version": "bench",
            "id_width": 32,
            "segments": [
                {
                    "slug": slug,
                    "is_default": False,
                    "cardinality": len(r.bitmap),
                    "bytes": len(blobs[slug]),
                    "sha256": sha256(blobs[slug]),
                    "key": f"{slug}.roaring",
                }
                for slug, r in ((r.slug, r) for r in resolved)
            ]
            + [{"slug": "default", "is_default": True}],
        }
        directory = Path(tmp) / "snapshot"
        directory.mkdir()
        for slug, blob in blobs.items():
            (directory / f"{slug}.roaring").write_bytes(blob)
        (directory / "manifest.json").write_text(json.dumps(manifest))
        del listed, resolved, blobs

        loaded = json.loads((directory / "manifest.json").read_text())
        load_times: tuple[list[float], list[float]] = ([], [])
        old_bitmaps: dict[str, FrozenBitMap] | None = None
        index: SegmentIndex | None = None
        for _ in range(3):  # alternated, each from nothing; medians
            old_bitmaps = index = None
            started = time.perf_counter()
            old_bitmaps = load_previous(directory, loaded)
            load_times[0].append(time.perf_counter() - started)
            started = time.perf_counter()
            index = index_from_objects(loaded, lambda key: (directory / key).read_bytes())
            load_times[1].append(time.perf_counter() - started)
        load_old, load_new = statistics.median(load_times[0]), statistics.median(load_times[1])
    assert index is not None and index.packed is not None and old_bitmaps is not None
    previous = PreviousIndex(index, old_bitmaps)
    old_bytes = 0
    for frozen in old_bitmaps.values():
        stats = frozen.get_statistics()
        old_bytes += (
            stats["n_bytes_array_containers"]
            + stats["n_bytes_run_containers"]
            + stats["n_bytes_bitset_containers"]
        )
    new_bytes = index.packed.nbytes

    probes = rng.integers(0, n, 25_000).tolist()
    one_old, one_new = alternated(singles(previous.resolve, probes), singles(index.resolve, probes))
    batches = [rng.integers(0, n, BATCH).astype(np.uint32) for _ in range(100)]
    assert index.resolve_many(batches[0]) == previous.resolve_many(batches[0])
    assert [index.resolve(int(u)) for u in batches[0][:1000]] == [
        previous.resolve(int(u)) for u in batches[0][:1000]
    ]
    span = 100 if n <= 50_000_000 else 40  # batches per run: about a second of the previous
    many_old, many_new = alternated(
        in_batches(previous.resolve_many, batches[:span]),
        in_batches(index.resolve_many, batches[:span]),
    )

    bloom_bits = -n * math.log(1e-7) / math.log(2) ** 2
    bloom_bytes = bloom_bits / 8
    print(f"text lists: {text_bytes / 1e6:,.0f} MB")
    print(
        f"parse + build + resolve + serialise: {built:.1f} s ({n / built / 1e6:.1f}M ids/s; parse and fill alone {parsed:.1f} s)"
    )
    print(f"peak memory (RSS): {peak:,.0f} MB")
    print(f"snapshot: {snapshot / 1e6:,.1f} MB, {snapshot / n:.2f} bytes per user")
    print(
        f"index in memory: {new_bytes / 1e6:,.1f} MB, {new_bytes / n:.3f} bytes per user "
        f"(previous: {old_bytes / 1e6:,.1f} MB of containers, {old_bytes / n:.3f})"
    )
    print(
        f"index load from local disk (verify sha256, validate with pyroaring, pack): "
        f"{load_new * 1e3:.0f} ms (previous, verify sha256 + deserialise: {load_old * 1e3:.0f} ms)"
    )
    print(f"resolve: {1e9 / one_new:,.0f} ns per call (previous {1e9 / one_old:,.0f} ns)")
    print(
        f"resolve_many, 10k batches: {many_new / 1e6:.1f}M ids/s "
        f"(previous {many_old / 1e6:.1f}M ids/s, x{many_new / many_old:.1f}; medians of "
        f"{ROUNDS} alternated runs)"
    )
    print(
        f"Bloom filters at 1e-7 false positives for the same users: {bloom_bytes / 1e6:,.0f} MB "
        f"({bloom_bytes / snapshot:.0f}x the snapshot)"
    )
    return (
        f"{n / 1e6:,.0f}M users: {many_old / 1e6:.1f}M -> {many_new / 1e6:.1f}M ids/s; "
        f"snapshot {snapshot / n:.2f} B/user, index in memory {new_bytes / n:.3f} B/user; "
        f"load {load_old * 1e3:.0f} -> {load_new * 1e3:.0f} ms"
    )


def sparse_mix(n: int) -> str:
    """Segments of 1%, 3% and 5% of the users (array containers: searched, not tested by one
    bit), 20% and 30% (bitmap containers), the rest in the default one; lookups only."""
    shares = [0.01, 0.03, 0.05, 0.20, 0.30]
    rng = np.random.default_rng(5)
    assignment = rng.choice(len(shares) + 1, n, p=[*shares, 1 - sum(shares)]).astype(np.uint8)
    bitmaps = {}
    for s in range(len(shares)):
        bitmap = BitMap(array.array("I", np.flatnonzero(assignment == s).astype("I").tobytes()))
        bitmaps[f"s{s}"] = FrozenBitMap(bitmap)
        del bitmap
    del assignment
    blobs = {slug: serialize(BitMap(b)) for slug, b in bitmaps.items()}
    manifest = {
        "version": "mix",
        "id_width": 32,
        "segments": [
            {
                "slug": slug,
                "is_default": False,
                "cardinality": len(bitmaps[slug]),
                "bytes": len(blob),
                "sha256": sha256(blob),
                "key": slug,
            }
            for slug, blob in blobs.items()
        ]
        + [{"slug": "default", "is_default": True}],
    }
    index = index_from_objects(manifest, blobs.__getitem__)
    assert index.packed is not None
    snapshot = sum(len(b) for b in blobs.values())
    del blobs
    previous = PreviousIndex(index, bitmaps)
    batches = [rng.integers(0, n, BATCH).astype(np.uint32) for _ in range(40)]
    assert index.resolve_many(batches[0]) == previous.resolve_many(batches[0])
    many_old, many_new = alternated(
        in_batches(previous.resolve_many, batches), in_batches(index.resolve_many, batches)
    )
    print(
        f"sparse mix at {n:,} users (segments of 1, 3 and 5% in array containers, 20 and 30% "
        f"in bitmap containers): resolve_many {many_new / 1e6:.1f}M ids/s (previous "
        f"{many_old / 1e6:.1f}M); snapshot {snapshot / n:.3f} bytes per user, index in memory "
        f"{index.packed.nbytes / n:.3f}"
    )
    return (
        f"{n / 1e6:,.0f}M users, sparse mix: {many_old / 1e6:.1f}M -> {many_new / 1e6:.1f}M "
        f"ids/s; snapshot {snapshot / n:.3f} B/user, index in memory "
        f"{index.packed.nbytes / n:.3f} B/user"
    )


def parse_memory() -> None:
    """The parser's peak memory on a gzip that inflates to 256 MiB of two-byte lines (the worst
    case per byte) and on 6.5M real ids: bounded by the chunk, not by the file."""
    import gzip
    import io
    import tracemalloc
    import zlib

    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(
        [*(compressor.compress(b"1\n" * 2**19) for _ in range(256)), compressor.flush()]
    )
    real = gzip.compress(b"".join(b"%d\n" % i for i in range(6_500_000)), 1)
    for name, data in (
        ("a gzip inflating to 256 MiB of '1' lines", bomb),
        ("6.5M ids", real),
    ):
        tracemalloc.start()
        started = time.perf_counter()
        lines = sum(int(chunk.size) for chunk in iter_ids(io.BytesIO(data)))
        took = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"parse {name} ({len(data) / 1e6:.1f} MB sent): {lines:,} ids in {took:.1f} s, "
            f"peak {peak / 2**20:.0f} MiB   (bound: ~26 MiB, docs/segments.md)"
        )
