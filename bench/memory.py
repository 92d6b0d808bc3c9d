"""Memory of Celery prefork workers holding a 10M-user snapshot: loaded in the parent before
fork (what the worker does) against loaded in each child after fork.

python -m bench memory [-- --users 10000000 --children 2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from segments.bitmaps import add_ids, empty_bitmap, serialize, sha256
from segments.store import CURRENT, LocalStore, snapshot_key

ROOT = Path(__file__).resolve().parent.parent


def publish(directory: Path, users: int) -> None:
    store = LocalStore(directory)
    rng = np.random.default_rng(9)
    assignment = rng.integers(0, 5, users)
    entries = []
    for i in range(5):
        bitmap = empty_bitmap(32)
        add_ids(bitmap, np.flatnonzero(assignment == i).astype(np.uint32))
        data = serialize(bitmap)
        key = snapshot_key("mem", f"s{i}.roaring")
        store.put(key, data)
        entries.append(
            {
                "slug": f"s{i}",
                "priority": i,
                "is_default": False,
                "cardinality": len(bitmap),
                "bytes": len(data),
                "sha256": sha256(data),
                "key": key,
            }
        )
    entries.append(
        {
            "slug": "default",
            "priority": 99,
            "is_default": True,
            "cardinality": None,
            "bytes": 0,
            "sha256": None,
            "key": None,
        }
    )
    store.put(
        snapshot_key("mem", "manifest.json"),
        json.dumps({"version": "mem", "id_width": 32, "segments": entries}).encode(),
    )
    store.put(CURRENT, b"mem")


def pss_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB: PSS splits shared pages among the processes sharing them."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        values[name] = int(value.split()[0])
    return values["Rss"], values["Pss"]


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def measure(env: dict[str, str], concurrency: int, label: str) -> None:
    worker = subprocess.Popen(
        [str(Path(sys.executable).parent / "celery"), "-A", "gatekeeper", "worker", "-Q", "sends",
         "-c", str(concurrency), "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
        cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(8)  # start-up: import, load, fork; nothing here waits on a time window
        pids = [worker.pid, *children(worker.pid)]
        figures = [pss_kb(p) for p in pids]
        rss = sum(r for r, _ in figures) / 1024
        pss = sum(p for _, p in figures) / 1024
        print(
            f"{label}: {len(pids)} processes, RSS {rss:,.0f} MB summed, PSS {pss:,.0f} MB (real footprint)"
        )
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench memory")
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--children", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        publish(Path(tmp) / "store", args.users)
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp}/db.sqlite3",
            "GATEKEEPER_STORE_URL": f"{tmp}/store",
            "GATEKEEPER_SNAPSHOT_CACHE_DIR": f"{tmp}/cache",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
            "LOG_LEVEL": "WARNING",
        }
        measure(
            env,
            args.children,
            f"{args.users:,} users loaded in the parent before fork (as shipped)",
        )
        measure(
            {**env, "GATEKEEPER_LOAD_SNAPSHOT_IN_PARENT": "0"},
            args.children,
            f"{args.users:,} users loaded in each child",
        )
