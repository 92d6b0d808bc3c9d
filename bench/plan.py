"""The forward plan: how fast scheduled jobs are predicted, per recipient, by the replay
(worker/plan.py: each job put through the gate at its start on a scratch copy of the logs).

make bench BENCH_ARGS="plan" [-- --jobs 20 --recipients 50000 --users 1000000]

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database. The
jobs' audiences overlap (each a random sample of the users); every user already has a send in
their log from the day before, under the classic caps of bench/gate.py's segments.
"""

import argparse
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import redis

from bench.gate import in_memory_index
from bench.postgres import REDIS_URL, on_bench_database
from limits.engine.limiter import Limiter
from worker.gate import Gate
from worker.models import SendChunk, SendJob
from worker.plan import plan_compute

CHUNK = 1000


def main(argv: list[str]) -> None:
    if on_bench_database("plan", argv):
        return
    parser = argparse.ArgumentParser(prog="bench plan")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--recipients", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    limiter = Limiter(client, prefix="bench-plan:")
    index = in_memory_index()
    start = datetime.now(UTC) + timedelta(days=1)
    rng = np.random.default_rng(7)
    users = np.arange(1, min(args.users, 1_000_000) + 1)
    earlier = Gate(limiter=limiter, index=index, record_stats=False, record_ledger=False)
    for first in range(0, users.size, 10_000):
        part = users[first : first + 10_000]
        earlier.check(
            channel="email",
            requests=[(int(u), f"before:{u}") for u in part],
            campaign="before",
            now=start - timedelta(days=1),
        )
    SendJob.objects.all().delete()
    jobs = []
    for n in range(args.jobs):
        job = SendJob.objects.create(
            channel=rng.choice(["email", "push"]), campaign=f"job-{n}", template="welcome",
            status=SendJob.Status.SCHEDULED, start_at=start + timedelta(hours=n),
            total=args.recipients,
        )  # fmt: skip
        audience = np.sort(rng.choice(users, args.recipients, replace=False))
        SendChunk.objects.bulk_create(
            SendChunk(
                job=job,
                status=SendChunk.Status.STAGED,
                size=len(audience[i : i + CHUNK]),
                recipients=[
                    {
                        "user_id": int(u),
                        "address": f"u{u}@example.com",
                        "message_id": f"job-{n}:{u}",
                    }
                    for u in audience[i : i + CHUNK]
                ],
            )
            for i in range(0, audience.size, CHUNK)
        )
        jobs.append(job)
    began = time.perf_counter()
    plans = plan_compute(jobs, limiter=limiter, index=index)
    seconds = time.perf_counter() - began
    total = sum(p.recipients for p in plans)
    refused = sum(p.recipients - p.sent for p in plans)
    print(
        f"plan: {args.jobs} jobs x {args.recipients:,} recipients ({total:,}) over "
        f"{users.size:,} users in {seconds:.1f} s: {seconds / total * 1e6:.1f} us a recipient, "
        f"{refused:,} predicted refused; 20 jobs x 1M at this rate: "
        f"{seconds / total * 20_000_000:.0f} s (target 30 s)"
    )
    client.flushdb()
