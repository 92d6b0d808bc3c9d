"""Segment build and lookup: text list -> bitmaps -> snapshot -> index.

python -m bench segments [-- --users 10000000]      (270000000 for the core seed's user count)
"""

import argparse
import json
import math
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from segments.bitmaps import add_ids, empty_bitmap, resolve_overlaps, serialize, sha256
from segments.index import index_from_objects
from segments.parsing import iter_ids

SEGMENTS = 5


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_list(path: Path, ids: np.ndarray) -> None:
    with path.open("wb") as handle:
        for start in range(0, ids.size, 5_000_000):
            block = ids[start : start + 5_000_000]
            handle.write(("\n".join(map(str, block.tolist())) + "\n").encode())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench segments")
    parser.add_argument("--users", type=int, default=10_000_000)
    args = parser.parse_args(argv)
    n = args.users
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

        started = time.perf_counter()
        loaded = json.loads((directory / "manifest.json").read_text())
        index = index_from_objects(loaded, lambda key: (directory / key).read_bytes())
        load = time.perf_counter() - started

    probes = rng.integers(0, n, 200_000).tolist()
    started = time.perf_counter()
    for user in probes:
        index.resolve(user)
    resolve_ns = (time.perf_counter() - started) / len(probes) * 1e9

    batches = [rng.integers(0, n, 10_000).astype(np.uint32) for _ in range(100)]
    started = time.perf_counter()
    for batch in batches:
        index.resolve_many(batch)
    many_rate = 100 * 10_000 / (time.perf_counter() - started)

    bloom_bits = -n * math.log(1e-7) / math.log(2) ** 2
    bloom_bytes = bloom_bits / 8
    print(f"text lists: {text_bytes / 1e6:,.0f} MB")
    print(
        f"parse + build + resolve + serialise: {built:.1f} s ({n / built / 1e6:.1f}M ids/s; parse and fill alone {parsed:.1f} s)"
    )
    print(f"peak memory (RSS): {peak:,.0f} MB")
    print(f"snapshot: {snapshot / 1e6:,.1f} MB, {snapshot / n:.2f} bytes per user")
    print(f"index load from local disk (verify sha256 + deserialise): {load * 1e3:.0f} ms")
    print(f"resolve: {resolve_ns:,.0f} ns per call")
    print(f"resolve_many, 10k batches: {many_rate / 1e6:.1f}M ids/s")
    print(
        f"Bloom filters at 1e-7 false positives for the same users: {bloom_bytes / 1e6:,.0f} MB "
        f"({bloom_bytes / snapshot:.0f}x the snapshot)"
    )
    parse_memory()


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
