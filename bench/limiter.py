"""Limiter throughput: batched `acquire` against the redis-benchmark ceiling, and latency.

python -m bench limiter [-- --redis-url redis://127.0.0.1:6379/14 --seconds 5]
"""

import argparse
import random
import re
import shutil
import subprocess
import time
from urllib.parse import urlparse

import redis

from limits.limiter import Limiter, Limits, Policy
from limits.transport import LIBRARY

USERS = 1_000_000
BATCH = 1_000
POLICY = Policy(channel=Limits(daily=3, weekly=10), all=Limits(daily=5, weekly=20))


def ceiling(url: str, requests: int) -> float:
    """redis-benchmark running the same function for one user per call, pipelined 50 deep."""
    parsed = urlparse(url)
    db = (parsed.path or "/0").lstrip("/") or "0"
    command = [
        shutil.which("redis-benchmark") or "redis-benchmark",
        "-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 6379), "--dbnum", db,
        "-n", str(requests), "-P", "50", "-r", str(USERS), "-q", "--csv",
        "FCALL", "gk_acquire", "2", "bench:{u:__rand_int__}:email", "bench:{u:__rand_int__}:all",
        "", "0", "email", "m:__rand_int__", "3", "10", "5", "20",
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    rates = re.findall(r'"([0-9.]+)"', out.splitlines()[-1])
    return float(rates[0])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench limiter")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    client.function_load(LIBRARY, replace=True)
    limiter = Limiter(client, prefix="bench:")
    rng = random.Random(7)

    decided, started, batch_no = 0, time.perf_counter(), 0
    while time.perf_counter() - started < args.seconds:
        users = rng.sample(range(USERS), BATCH)
        batch_no += 1
        decisions = limiter.acquire("email", [(u, f"b{batch_no}-{u}") for u in users], POLICY)
        decided += len(decisions)
    batched = decided / (time.perf_counter() - started)
    assert all(d.reason != "unavailable" for d in decisions), "Redis did not answer"

    client.flushdb()
    top = ceiling(args.redis_url, requests=max(int(batched * 3), 100_000))

    latencies = []
    for i in range(3000):
        t0 = time.perf_counter()
        limiter.acquire("email", [(rng.randrange(USERS), f"one-{i}")], POLICY)
        latencies.append(time.perf_counter() - t0)
    latencies.sort()
    client.flushdb()

    print(
        f"acquire, batches of {BATCH} from {USERS:,} users, one process: {batched:,.0f} decisions/s"
    )
    print(
        f"redis-benchmark ceiling (same function, one user per call, -P 50): {top:,.0f} decisions/s"
    )
    print(f"ratio batched / ceiling: {batched / top:.2f}x   (target >= 1.0x)")
    print(
        f"one-user acquire latency: p50 {latencies[1500] * 1e3:.3f} ms, "
        f"p99 {latencies[2969] * 1e3:.3f} ms   (target p99 < 1 ms)"
    )
