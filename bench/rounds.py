"""Rounds: how fast a round's jobs are decided by value per user (worker/rounds.py), and what
rounds cost the gate while none is deciding.

make bench BENCH_ARGS="rounds" [-- --jobs 5 --recipients 2000000 --users 10000000]

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database. Each
job's audience is a random sample of the users (so they overlap), each recipient with a value of
its own drawn from a skewed (log-normal) distribution, stored in the chunk's JSON as a campaign
file's `value` column stores it; every user already has a send in their log from the day before,
under bench/plan.py's rules (2 a day per segment in its own zone, the classic caps, 1 promo a
day). Printed: the decision (round_decide, as beat runs it: recipients and values read, logs
read, each job alone, the sets tried, first come first served beside, the entries written) and
its steps; the value won against first come, first served; the gate's decisions/s with rounds
open and waiting against none (alternated, so that the machine's drift falls on both), and
while a round decides (printed, no target).
"""

import argparse
import itertools
import random
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import redis
from django.db import connection

from bench.gate import USERS, alternated, beside_gate, gate_rate_beside, in_memory_index, rate
from bench.plan import audience_staged, logs_written, policy_made
from bench.postgres import REDIS_URL, on_bench_database
from limits.engine.limiter import Limiter
from segments.index import get_holder
from worker.models import Round, RoundEntry, SendJob
from worker.rounds import round_decide


def round_made(args: argparse.Namespace, users: np.ndarray, send_at: datetime) -> Round:
    rng = np.random.default_rng(11)
    SendJob.objects.all().delete()
    Round.objects.all().delete()
    round_ = Round.objects.create(
        name="bench", channel="all", closes_at=send_at - timedelta(hours=1), send_at=send_at
    )
    for n in range(args.jobs):
        job = SendJob.objects.create(
            channel=["email", "push"][n % 2], campaign=f"job-{n}", template="welcome",
            tags=["promo"] if n % 3 == 0 else [], priority=int(rng.integers(3, 8)),
            status=SendJob.Status.SCHEDULED, start_at=send_at, total=args.recipients,
            round=round_, value=1.0,
        )  # fmt: skip
        audience = np.sort(rng.choice(users, args.recipients, replace=False))
        values = np.round(rng.lognormal(0.0, 1.0, audience.size) * (n + 1), 2)
        audience_staged(job, n, audience, values)
    return round_


def main(argv: list[str]) -> None:
    if on_bench_database("rounds", argv):
        return
    parser = argparse.ArgumentParser(prog="bench rounds")
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--recipients", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    limiter = Limiter(client, prefix="bench-rounds:")
    index = in_memory_index(args.users)
    holder = get_holder()  # this process's snapshot: the benchmark's, in memory
    holder.index, holder._tried, holder.follow_lazily = index, True, False
    send_at = datetime.now(UTC) + timedelta(days=1)
    users = np.arange(1, args.users)
    began = time.perf_counter()
    logs_written(client, limiter, args.users, int((send_at - timedelta(days=1)).timestamp() * 1000))
    policy_made()
    round_ = round_made(args, users, send_at)
    print(
        f"made: {args.users:,} users' logs, a round of {args.jobs} jobs x {args.recipients:,} "
        f"recipients in {time.perf_counter() - began:.0f} s"
    )
    gate_rates(round_, args)
    began = time.perf_counter()
    assert round_decide(round_.pk, now=round_.closes_at, limiter=limiter, index=index)
    seconds = time.perf_counter() - began
    round_.refresh_from_db()
    report = round_.report or {}
    total = args.jobs * args.recipients
    print(
        f"round decided: {args.jobs} jobs x {args.recipients:,} recipients ({total:,}) over "
        f"{args.users:,} users in {seconds:.1f} s ({seconds / total * 1e6:.2f} us a candidate); "
        f"{report['users']:,} users with a send that fits alone, {report['contested']:,} with "
        "two or more; steps: "
        + ", ".join(f"{name} {s:.1f} s" for name, s in report["steps"])
        + "; target: 5 jobs x 2M over 10M users under 120 s"
    )
    won, first = report["value_won"], report["first_come_value"]
    print(
        f"value won: {won:,.2f} by value, {first:,.2f} first come, first served "
        f"({won / first:.3f}x; {sum(j['won'] for j in report['jobs']):,} sends against "
        f"{sum(j['first_come']['won'] for j in report['jobs']):,})"
    )
    RoundEntry.objects.filter(round=round_).delete()
    Round.objects.filter(pk=round_.pk).update(status=Round.Status.OPEN, report=None)
    gate_rate_beside(
        REDIS_URL,
        lambda: round_decide(round_.pk, now=round_.closes_at, limiter=limiter, index=index),
    )
    client.flushdb()


def gate_rates(round_: Round, args: argparse.Namespace) -> None:
    """The gate's decisions/s with the round open and its jobs waiting, against no round and no
    job at all: once the database has settled from the set-up (VACUUM ANALYZE, CHECKPOINT),
    short runs of each alternated in this process (bench.gate.alternated: 16 of 1 s each, the
    state switched between them), the median of neighbouring runs' ratios printed, so that
    whatever else the machine does slows both alike."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("CHECKPOINT")
    jobs = list(SendJob.objects.filter(round=round_).values_list("pk", flat=True))
    gate = beside_gate(REDIS_URL)
    pick, made = random.Random(11), itertools.count()

    def batch() -> int:
        n = next(made)
        requests = [(u, f"r{n}-{u}") for u in pick.sample(range(USERS), 1000)]
        return len(gate.check(channel="email", requests=requests))

    opened = [False]

    def switched() -> None:
        """No round and no job (the jobs parked as cancelled, the round cancelled), or the
        round open with its jobs waiting, in turn."""
        if opened[0]:
            SendJob.objects.filter(pk__in=jobs).update(round=None, status=SendJob.Status.CANCELLED)
            Round.objects.filter(pk=round_.pk).update(status=Round.Status.CANCELLED)
        else:
            SendJob.objects.filter(pk__in=jobs).update(
                round=round_, status=SendJob.Status.SCHEDULED
            )
            Round.objects.filter(pk=round_.pk).update(status=Round.Status.OPEN)
        opened[0] = not opened[0]

    rate(batch, 3.0)  # not counted: the first calls fill the users' logs
    opened[0] = True
    switched()  # none, for the first run
    without, with_round, ratio = alternated(batch, batch, 32.0, rounds=16, between=switched)
    if not opened[0]:
        switched()  # left open, as it was
    print(
        f"gate with a round open ({args.jobs} jobs waiting) against none: {with_round:,.0f} "
        f"against {without:,.0f} decisions/s (median of 16 neighbouring runs' ratios: "
        f"{ratio:.3f}x); target: at least 0.98x"
    )
