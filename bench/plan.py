"""The forward plan: how fast scheduled jobs are predicted (worker/plan.py: each job's recipients
decided at once at its start by the gate's stages over arrays and the decision model, over the
logs read from Redis in bulk).

make bench BENCH_ARGS="plan" [-- --jobs 20 --recipients 50000 --users 1000000]

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database. The
jobs' audiences overlap (each a random sample of the users); every user already has a send in
their log from the day before (written straight into the logs' keys, as the limiter's function
writes them), under the classic caps of bench/gate.py's segments and a calendar day rule per
segment in the segment's zone. Printed: the first plan (each job's recipients read from the
database), the plan made again with nothing changed (the recipients kept), and its steps; the
gate's decisions/s while the plan is made, against the gate alone; the plan made again after
one job is moved and after one segment's rule is edited (for the users each edit reaches);
and one job decided by the decision model against the real gate, answer by answer.
"""

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import redis
from django.utils import timezone

from bench.gate import SEGMENTS, gate_rate_beside, in_memory_index
from bench.postgres import REDIS_URL, on_bench_database
from limits.engine import log
from limits.engine.limiter import Limiter
from limits.engine.reservations import Holds
from limits.policy.rules import RULE_FIELD_DEFAULTS, RuleFields
from limits.policy.services import RULES
from segments.index import get_holder
from segments.models import Segment
from worker.models import SendChunk, SendJob
from worker.plan import plan_compute, plan_latest, plan_refresh
from worker.planned import recipients_packed

CHUNK = 1000
KEYS_A_PIPELINE = 2000


def logs_written(client: redis.Redis, limiter: Limiter, users: int, at_ms: int) -> None:
    """One email send for every user at `at_ms`: each log's bytes as the function writes a
    user's first send (format 2, no tag slots, one section), 16 users a group key."""
    head = bytes((log.FORMAT_VERSION, 0, 1, 5)) + b"email" + b"\0\0"
    tail = log.short_hash("before") + (5 << log.HOLDER_BITS).to_bytes(4, "big")
    time6 = at_ms.to_bytes(6, "big")
    pipe = client.pipeline(transaction=False)
    queued = 0
    for first in range(0, users, 16):
        fields: dict[Any, Any] = {}
        for user in range(first, min(first + 16, users)):
            fields[log.bucket_field(user)] = (
                head + time6 + log.stored_message_hash(f"before:{user}") + tail
            )
        pipe.hset(log.group_key(limiter.prefix, first), mapping=fields)
        queued += 1
        if queued == KEYS_A_PIPELINE:
            pipe.execute()
            queued = 0
    pipe.execute()


ZONES = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]


def rule_fields(name: str, **fields: Any) -> RuleFields:
    """A rule's fields: those given, the others as a record that lacks them reads them."""
    return RuleFields(**{**RULE_FIELD_DEFAULTS, "name": name, **fields})


def policy_made() -> None:
    """The segments, each in a zone of its own, and rules: the classic caps of every one (as
    bench/gate.py's), 2 a day on every channel in each segment's own calendar day, 1 promo a day."""
    RULES.model.objects.all().delete()
    for k, slug in enumerate(SEGMENTS):
        Segment.objects.update_or_create(
            slug=slug, defaults={"name": slug, "priority": k + 1, "time_zone": ZONES[k]}
        )
    rules = [
        rule_fields(f"{slug}: 2 a day", segment=slug, channel="all", window_kind="calendar",
                    window_unit="day", limit=2)
        for slug in SEGMENTS
    ]  # fmt: skip
    rules += [
        rule_fields(f"{channel} {limit} in {seconds} s", channel=channel, window_seconds=seconds,
                    limit=limit)
        for channel, seconds, limit in (("email", 86_400, 3), ("email", 604_800, 10),
                                        ("all", 86_400, 5), ("all", 604_800, 20))
    ]  # fmt: skip
    rules.append(
        rule_fields("1 promo a day", channel="all", match="tag", tag="promo",
                    window_seconds=86_400, limit=1)
    )  # fmt: skip
    for fields in rules:
        RULES.create(fields=fields, via="command")


def staged_chunk(
    job: SendJob, n: int, users: list[int], values: list[float] | None = None
) -> SendChunk:
    """A chunk of job `n` as staging stores it: its recipients' JSON (with `values`: each one's
    own, as a campaign file's `value` column gives it), and their arrays for the plan
    (worker/planned.py)."""
    worth = [f',"value":{v}' for v in values] if values is not None else [""] * len(users)
    recipients = json.loads(
        "["
        + ",".join(
            f'{{"user_id":{u},"address":"u{u}@example.com","message_id":"job-{n}:{u}"{w}}}'
            for u, w in zip(users, worth, strict=True)
        )
        + "]"
    )
    return SendChunk(
        job=job,
        status=SendChunk.Status.STAGED,
        size=len(recipients),
        recipients=recipients,
        plan=recipients_packed(recipients),
    )


def audience_staged(
    job: SendJob, n: int, audience: np.ndarray, values: np.ndarray | None = None
) -> None:
    """Job `n`'s recipients (`audience`, with `values`: each one's own) staged in chunks of
    CHUNK, written 100 chunks at a time."""
    for first in range(0, audience.size, 100 * CHUNK):
        SendChunk.objects.bulk_create(
            staged_chunk(
                job,
                n,
                audience[i : i + CHUNK].tolist(),
                None if values is None else values[i : i + CHUNK].tolist(),
            )
            for i in range(first, min(first + 100 * CHUNK, audience.size), CHUNK)
        )


def jobs_made(args: argparse.Namespace, users: np.ndarray, start: datetime) -> list[SendJob]:
    rng = np.random.default_rng(7)
    SendJob.objects.all().delete()
    jobs = []
    for n in range(args.jobs):
        job = SendJob.objects.create(
            channel=rng.choice(["email", "push"]), campaign=f"job-{n}", template="welcome",
            tags=["promo"] if n % 3 == 0 else [], priority=int(rng.integers(0, 10)),
            status=SendJob.Status.SCHEDULED, start_at=start + timedelta(hours=n),
            total=args.recipients,
        )  # fmt: skip
        audience_staged(job, n, np.sort(rng.choice(users, args.recipients, replace=False)))
        jobs.append(job)
    return jobs


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
    index = in_memory_index(args.users)
    start = datetime.now(UTC) + timedelta(days=1)
    users = np.arange(1, args.users)
    began = time.perf_counter()
    logs_written(client, limiter, args.users, int((start - timedelta(days=1)).timestamp() * 1000))
    policy_made()
    jobs = jobs_made(args, users, start)
    print(
        f"made: {args.users:,} users' logs, {args.jobs} jobs in {time.perf_counter() - began:.0f} s"
    )
    total = args.jobs * args.recipients
    for run in ("first, recipients read", "again, recipients kept"):
        began = time.perf_counter()
        steps: dict[str, float] = {}
        plans = plan_compute(jobs, limiter=limiter, index=index, holds=Holds(), steps=steps)
        seconds = time.perf_counter() - began
        refused = sum(p.recipients - p.sent for p in plans)
        print(
            f"plan ({run}): {args.jobs} jobs x {args.recipients:,} recipients ({total:,}) over "
            f"{args.users:,} users in {seconds:.1f} s: {seconds / total * 1e6:.2f} us a "
            f"recipient, {refused:,} predicted refused; steps: "
            + ", ".join(f"{name} {s:.1f} s" for name, s in steps.items())
        )
    print("target: 20 jobs x 1M over 10M users under 30 s")
    gate_rate_beside(
        REDIS_URL, lambda: plan_compute(jobs, limiter=limiter, index=index, holds=Holds())
    )
    remade(jobs, limiter, index)
    model_beside_gate(jobs[0], limiter, index)
    client.flushdb()


def remade(jobs: list[SendJob], limiter: Limiter, index: Any) -> None:
    """After the plan made whole, one job moved an hour later, then one segment's rule edited:
    each time the plan made again (plan_refresh, as beat makes it) for the users the edit
    reaches alone."""
    holder = get_holder()  # this process's snapshot: the benchmark's, in memory
    holder.index, holder._tried, holder.follow_lazily = index, True, False
    plan_refresh(force=True, limiter=limiter)
    moved = jobs[len(jobs) // 2]
    assert moved.start_at is not None
    SendJob.objects.filter(pk=moved.pk).update(
        start_at=moved.start_at + timedelta(hours=1), updated_at=timezone.now()
    )
    _remade_timed("one job moved", limiter)
    rule = RULES.model.objects.get(name=f"{SEGMENTS[2]}: 2 a day")
    RULES.update(row=rule, changes={"limit": 1}, via="command")
    _remade_timed("one segment's rule edited", limiter)


def _remade_timed(edit: str, limiter: Limiter) -> None:
    began = time.perf_counter()
    plan_refresh(limiter=limiter)
    seconds = time.perf_counter() - began
    latest = plan_latest(limiter=limiter) or {}
    print(
        f"plan ({edit}, made again for the users it reaches): "
        f"{latest.get('remade_users') or 0:,} users in {seconds:.1f} s (made whole: "
        f"{latest.get('remade_users') is None}); target: under 5 s"
    )


def model_beside_gate(job: SendJob, limiter: Limiter, index: Any) -> None:
    """One job's recipients decided at its start by the decision model (the plan of that job
    alone: its users' logs read in bulk, then every recipient at once) and then by the real gate
    (the send worker's call, job_gate_check, in chunks of CHUNK over the limiter's function in
    Redis, recording the sends as a run does): the answers compared recipient by recipient, the
    time per decision of each printed."""
    from limits.policy.selectors import PolicyCache, policy_read
    from limits.reasons import Reason
    from worker.delivery.base import recipients_typed
    from worker.gate import Gate, job_gate_check
    from worker.modelled import CODES, JobDecisions

    assert job.start_at is not None
    table = policy_read()
    decided: dict[int, JobDecisions | None] = {}
    steps: dict[str, float] = {}
    plan_compute([job], limiter=limiter, index=index, holds=Holds(), table=table, steps=steps,
                 decided=decided)  # fmt: skip
    model = decided[job.pk]
    assert model is not None
    gate = Gate(limiter=limiter, index=index, policy=PolicyCache.holding(table),
                record_stats=False, record_ledger=False)  # fmt: skip
    chunks = SendChunk.objects.filter(job=job, status=SendChunk.Status.STAGED).order_by("pk")
    typed = [recipients_typed(c) for c in chunks.values_list("recipients", flat=True)]
    began = time.perf_counter()
    reasons = [d.reason for part in typed for d in job_gate_check(job, part, now=job.start_at, gate=gate)]  # fmt: skip
    gate_seconds = time.perf_counter() - began
    gate_codes = np.asarray([CODES[Reason(r)] for r in reasons], dtype=model.reason.dtype)
    differ = int((gate_codes != model.reason).sum())
    n = len(reasons)
    alone, logs = steps["decisions"], steps["logs"]
    print(
        f"model against the real gate, one job of {n:,} recipients at its start: {differ:,} "
        f"answers differ (target 0); the gate {gate_seconds:.1f} s ({gate_seconds / n * 1e6:.2f} "
        f"us a decision); the model {alone:.2f} s ({alone / n * 1e6:.2f} us a decision: "
        f"{gate_seconds / alone:.1f}x faster), with its users' logs read {alone + logs:.2f} s "
        f"({gate_seconds / (alone + logs):.1f}x); target: at least 20x"
    )
