"""Deliverability: email paced per mailbox provider, and what the groups cost a chunk run.

make bench BENCH_ARGS="deliverability" [-- --recipients 1000000 --cost-recipients 200000]
make bench BENCH_ARGS="deliverability -- --only rates" (or `--only cost`)

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database, with
the gate real: the rules of bench/plan.py (each user sent one email, so all are admitted), an
in-memory index as the process's snapshot, the limiter, claims and ledger in Redis.

**Rates held.** One email job of `--recipients` spread over five mailbox providers by their
domains (gmail.com, hotmail.com, yahoo.com, icloud.com, example.org: `--shares` 40/20/15/10/15
percent), each group given a rate for every dispatcher (`--rates`, sends a second; by default
6,000 a second in all, each group's in proportion to its share). The job's chunks are run by
`send_chunk_run` in `--processes` worker processes at once, handed out as beat hands them out
(chunks due, follow-ups of postponed sends when their `not_before` comes), in real time, with a
dispatcher that takes batches and records each send's time. Printed per group: the most sends
in any 60-second window against 60 times its rate, and the busiest second's against its rate;
the run's time and sends a second.

**Cost per recipient.** Jobs of `--cost-recipients` in chunks of GATEKEEPER_SEND_CHUNK_SIZE,
each chunk's `send_chunk_run` timed in this process with a dispatcher that drops its batches:
with GATEKEEPER_DELIVERABILITY off (no group at all), and on with every group at 1,000,000 a
second (never waited for) and a warm-up plan for the sending domain whose volumes no job
reaches (nothing held). A fresh job (new users, new message ids) for each run, the two
alternated (`--rounds` pairs, the order swapped every other pair); the median of the pairs'
ratios printed, as bench.gate.alternated does, so that whatever else the machine does slows
both alike.
"""

import argparse
import itertools
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

import numpy as np
import redis
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from bench.gate import in_memory_index
from bench.plan import policy_made
from bench.postgres import REDIS_URL, on_bench_database
from segments.index import get_holder
from worker.chunks import chunks_runnable_at, send_chunk_run
from worker.delivery.base import DispatchError, Message, SendsInBatches
from worker.delivery.deliverability import sending_domain
from worker.delivery.mailboxes import ANY_DISPATCHER, domain_of, mailboxes_forget
from worker.delivery.warmup import VOLUME_MAX, warmup_forget
from worker.models import MailboxProvider, SendChunk, SendJob, WarmupPlan

# The groups of a real list, each by one domain: (group, domain, share of the recipients).
GROUPS = (
    ("gmail", "gmail.com"),
    ("microsoft", "hotmail.com"),
    ("yahoo", "yahoo.com"),
    ("apple", "icloud.com"),
    ("other", "example.org"),
)
SHARES = (0.40, 0.20, 0.15, 0.10, 0.15)
GROUP_OF_DOMAIN = {domain: group for group, domain in GROUPS}
TARGET_WINDOW = 1.02  # a group's sends in any 60 s window, against 60 s of its rate
TARGET_COST = 1.05  # a chunk run's cost per recipient with groups and a warm-up, against none


class RecordingDispatcher(SendsInBatches):
    """Takes a batch in one call, as an email provider's API does, and records each send's time
    and group (found by the benchmark from the address, not by the worker's grouping)."""

    provider: ClassVar[str] = "bench"
    batch_size: ClassVar[int] = 500

    def __init__(self) -> None:
        self.times: list[float] = []
        self.groups: list[int] = []
        self.codes = {domain: k for k, (_, domain) in enumerate(GROUPS)}

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        now = time.time()
        self.times.extend([now] * len(messages))
        self.groups.extend(self.codes[domain_of(m.address)] for m in messages)
        return [None] * len(messages)


class DroppingDispatcher(SendsInBatches):
    """Takes a batch in one call and drops it: the run's own cost, nothing of a provider's."""

    provider: ClassVar[str] = "bench"
    batch_size: ClassVar[int] = 500

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        return [None] * len(messages)


def groups_set(rates: Sequence[float] | None) -> None:
    """Each group's domain, and its rate for every dispatcher (sends a second; None: no
    rate)."""
    for k, (group, domain) in enumerate(GROUPS):
        entry = {"dispatcher": ANY_DISPATCHER, "per_second": rates[k] if rates else None}
        MailboxProvider.objects.update_or_create(
            slug=group,
            defaults={
                "name": group,
                "domains": [] if group == "other" else [domain],
                "mx_hosts": [],
                "rates": [] if rates is None else [entry | {"per_minute": None, "per_hour": None}],
                "paused_at": None,
                "paused_why": None,
            },
        )
    MailboxProvider.objects.exclude(slug__in=[g for g, _ in GROUPS]).delete()
    mailboxes_forget()


def job_made(name: str, first_user: int, recipients: int, chunk: int, seed: int) -> SendJob:
    """An email job of users first_user.. first_user + recipients - 1, each at one of the
    groups' domains (by SHARES, in a random order), queued in chunks of `chunk`."""
    rng = np.random.default_rng(seed)
    domains = rng.choice(len(GROUPS), recipients, p=SHARES)
    job = SendJob.objects.create(
        channel="email", campaign=name, template="welcome", total=recipients,
        status=SendJob.Status.QUEUED,
    )  # fmt: skip
    names = [domain for _, domain in GROUPS]
    for first in range(0, recipients, 100 * chunk):
        SendChunk.objects.bulk_create(
            SendChunk(
                job=job,
                size=min(chunk, recipients - i),
                recipients=[
                    {
                        "user_id": first_user + n,
                        "address": f"u{first_user + n}@{names[d]}",
                        "message_id": f"{name}:{first_user + n}",
                    }
                    for n, d in zip(
                        range(i, min(i + chunk, recipients)),
                        domains[i : i + chunk].tolist(),
                        strict=True,
                    )
                ],
            )
            for i in range(first, min(first + 100 * chunk, recipients), chunk)
        )
    return job


def gate_ready(users: int) -> None:
    """The gate's snapshot in this process (and the processes it forks): `users` users in
    memory, as bench/rounds.py sets it."""
    holder = get_holder()
    holder.index, holder._tried, holder.follow_lazily = in_memory_index(users), True, False


def main(argv: list[str]) -> None:
    if on_bench_database("deliverability", argv):
        return
    parser = argparse.ArgumentParser(prog="bench deliverability")
    parser.add_argument("--only", choices=["rates", "cost"])
    parser.add_argument("--recipients", type=int, default=1_000_000)
    parser.add_argument(
        "--rates", default="2400,1200,900,600,900", help="sends a second of each group, in order"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=500, help="the dispatcher's batch size")
    parser.add_argument("--cost-recipients", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    RecordingDispatcher.batch_size = DroppingDispatcher.batch_size = args.batch
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    SendJob.objects.all().delete()
    WarmupPlan.objects.all().delete()
    warmup_forget()
    policy_made()
    if args.only in (None, "rates"):
        rates_held(args, client)
    if args.only in (None, "cost"):
        cost_per_recipient(args, client)
    groups_set(None)
    client.flushdb()


# --- rates held ---------------------------------------------------------------------------


def _worker(work: Any, out: Any) -> None:
    """A worker process: runs the chunks handed to it until told to stop, then hands back its
    sends' times and groups."""
    connections.close_all()  # its own connection, not the parent's
    dispatcher = RecordingDispatcher()
    runs = 0
    while (chunk_id := work.get()) is not None:
        send_chunk_run(chunk_id=chunk_id, dispatcher=dispatcher)
        runs += 1
    out.put(
        (
            np.asarray(dispatcher.times, dtype=np.float64).tobytes(),
            np.asarray(dispatcher.groups, dtype=np.int8).tobytes(),
            runs,
        )
    )


def most_in_window(times: np.ndarray, seconds: float) -> int:
    """The most of `times` (sorted) in any window of `seconds` (half-open)."""
    if not times.size:
        return 0
    ends = np.searchsorted(times, times + seconds, side="left")
    return int((ends - np.arange(times.size)).max())


def rates_held(args: argparse.Namespace, client: redis.Redis) -> None:
    rates = [float(r) for r in args.rates.split(",")]
    if len(rates) != len(GROUPS):
        raise SystemExit(f"--rates: one for each of {', '.join(g for g, _ in GROUPS)}")
    groups_set(rates)
    gate_ready(args.recipients + 1)
    chunk_size = int(settings.GATEKEEPER_SEND_CHUNK_SIZE)
    began = time.perf_counter()
    job = job_made("rates", 1, args.recipients, chunk_size, seed=3)
    print(
        f"made: an email job of {args.recipients:,} recipients in chunks of {chunk_size:,} "
        f"in {time.perf_counter() - began:.0f} s; groups: "
        + ", ".join(
            f"{g} ({d}) {s:.0%} at {r:,.0f}/s"
            for (g, d), s, r in zip(GROUPS, SHARES, rates, strict=True)
        )
        + f" ({sum(rates):,.0f}/s in all); {args.processes} worker processes, batches of "
        f"{args.batch}",
        flush=True,
    )
    connections.close_all()  # the workers are forked: each opens its own
    context = multiprocessing.get_context("fork")
    work, out = context.Queue(), context.Queue()
    workers = [context.Process(target=_worker, args=(work, out)) for _ in range(args.processes)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    handed: set[int] = set()
    # As beat's send_chunks_due: every chunk of the job that is due (a postponed send's
    # follow-up once its `not_before` comes), handed out once.
    while True:
        due = SendChunk.objects.filter(chunks_runnable_at(timezone.now()), job=job)
        for chunk_id in due.order_by("pk").values_list("pk", flat=True):
            if chunk_id not in handed:
                handed.add(chunk_id)
                work.put(chunk_id)
        job.refresh_from_db()
        if job.processed >= job.total:
            break
        time.sleep(0.2)
    seconds = time.perf_counter() - began
    for _ in workers:
        work.put(None)
    gathered = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    times = np.concatenate([np.frombuffer(t, dtype=np.float64) for t, _, _ in gathered])
    codes = np.concatenate([np.frombuffer(g, dtype=np.int8) for _, g, _ in gathered])
    order = np.argsort(times, kind="stable")
    times, codes = times[order], codes[order]
    sent = times.size
    follow_ups = len(handed) - SendChunk.objects.filter(job=job, kind=SendChunk.Kind.SEND).count()
    print(
        f"the job done in {seconds:.1f} s: {job.sent:,} sent ({sent:,} handed to the "
        f"dispatcher), {len(handed):,} chunk runs ({follow_ups:,} of postponed sends: "
        f"{', '.join(f'{r:,}' for _, _, r in gathered)} by process); "
        f"{sent / (times[-1] - times[0]):,.0f} sends/s from the first send to the last, "
        f"against {sum(rates):,.0f}/s the groups' rates summed"
    )
    worst = 0.0
    for k, ((group, _), rate) in enumerate(zip(GROUPS, rates, strict=True)):
        own = times[codes == k]
        minute, second = most_in_window(own, 60.0), most_in_window(own, 1.0)
        ratio = minute / (60 * rate)
        worst = max(worst, ratio)
        spread = own[-1] - own[0] if own.size > 1 else 0.0
        print(
            f"  {group:<9} {own.size:>9,} sends over {spread:6.1f} s: busiest 60 s "
            f"{minute:>8,} against {60 * rate:>9,.0f} ({ratio:.3f}x); busiest second "
            f"{second:>6,} against {rate:>6,.0f} ({second / rate:.3f}x)"
        )
    print(
        f"each group's busiest 60 s against its rate, the worst: {worst:.3f}x   (target: at "
        f"most {TARGET_WINDOW}x: {'met' if worst <= TARGET_WINDOW else 'MISSED'})"
    )
    client.flushdb()


# --- cost per recipient -------------------------------------------------------------------


def cost_per_recipient(args: argparse.Namespace, client: redis.Redis) -> None:
    n = args.cost_recipients
    chunk_size = int(settings.GATEKEEPER_SEND_CHUNK_SIZE)
    groups_set([1_000_000.0] * len(GROUPS))
    domain = sending_domain()
    WarmupPlan.objects.update_or_create(
        domain=domain,
        defaults={
            "time_zone": "UTC",
            "starts_on": timezone.now().date() - timedelta(days=1),
            # No day reaches it: nothing is held, and no group's ramp ends.
            "volumes": {group: [VOLUME_MAX] * 30 for group, _ in GROUPS},
            "ended": {},
        },
    )
    warmup_forget()
    gate_ready((2 * args.rounds + 2) * n + 1)  # a fresh range of users a job
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("CHECKPOINT")
    dispatcher = DroppingDispatcher()
    jobs = itertools.count()

    def run(deliverability: bool) -> float:
        """Seconds a recipient of a fresh job, every chunk run in turn."""
        k = next(jobs)
        job = job_made(f"cost-{k}", 1 + k * n, n, chunk_size, seed=k)
        ids = list(job.chunks.order_by("pk").values_list("pk", flat=True))
        was, settings.GATEKEEPER_DELIVERABILITY = settings.GATEKEEPER_DELIVERABILITY, deliverability
        try:
            began = time.perf_counter()
            for chunk_id in ids:
                send_chunk_run(chunk_id=chunk_id, dispatcher=dispatcher)
            seconds = time.perf_counter() - began
        finally:
            settings.GATEKEEPER_DELIVERABILITY = was
        job.refresh_from_db()
        assert job.sent == n, f"job {job.pk}: {job.sent:,} of {n:,} sent ({job.reasons})"
        return seconds / n

    run(False)  # not counted: the first runs warm the caches, the templates, the connections
    run(True)
    off: list[float] = []
    on: list[float] = []
    for r in range(args.rounds):
        if r % 2:
            on.append(run(True))
            off.append(run(False))
        else:
            off.append(run(False))
            on.append(run(True))
        print(
            f"  pair {r + 1}: {off[-1] * 1e6:.1f} us off, {on[-1] * 1e6:.1f} us on "
            f"({on[-1] / off[-1]:.3f}x)",
            flush=True,
        )
    ratio = statistics.median(b / a for a, b in zip(off, on, strict=True))
    print(
        f"a chunk run's cost per recipient ({n:,}-recipient email jobs in chunks of "
        f"{chunk_size:,}, 5 groups, batches of {args.batch}, one process; medians of "
        f"{args.rounds} alternated runs each): {statistics.median(off) * 1e6:.1f} us with "
        f"GATEKEEPER_DELIVERABILITY off, {statistics.median(on) * 1e6:.1f} us on with a warm-up "
        f"plan for {domain}"
    )
    print(
        "  each: send_chunk_run from the lease to the settled chunk (recipients decoded, the "
        "gate, claims, rendering, the dispatcher's batches, ledger, the job's counts); on adds "
        "each recipient's group, batches of one group each, a token bucket per group and batch, "
        "the warm-up volume taken per chunk and the sent counted per group for the brakes; the "
        "jobs' making not included"
    )
    print(
        f"  on against off, the median of the {args.rounds} pairs' ratios: {ratio:.3f}x   "
        f"(target: at most {TARGET_COST}x: {'met' if ratio <= TARGET_COST else 'MISSED'})"
    )
    WarmupPlan.objects.filter(domain=domain).delete()
    warmup_forget()
