"""Backtests (worker/backtest.py): the ledger's days replayed under the policy in force and a
draft by the decision model.

make bench BENCH_ARGS="backtest" [-- --sample 1000000 --days 30 --per-day 1000000]

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database, under
bench/plan.py's policy (segments in five zones, a calendar day per segment, rolling caps and a
tag rule).

- Exact: `--sample` decisions made by the real gate (the limiter's function in Redis) over
  days, with quiet hours, repeated users and message ids and sends given back, drained into
  the ledger; then replayed under the policy in force: the decisions that differ from the
  ledger's are printed (0 expected).
- Fast: `--days` x `--per-day` decisions written straight into the ledger (a blast a day to
  `--per-day` users in calls of 1,000); replayed under the policy in force and under a draft,
  in `--parts` processes (as that many Celery workers would), and timed, with what 300M rows
  would take at that rate; then in one process (the ratio printed); then the gate's
  decisions/s beside a replay of the first days, against the gate alone.
"""

import argparse
import io
import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import redis

from bench.gate import SEGMENTS, in_memory_index
from bench.plan import policy_made
from bench.postgres import REDIS_URL, ROOT, on_bench_database

CALL = 1000
DAY = 86_400


def _reset() -> None:
    from django.db import connection

    from limits.ledger.drain import partition_name, partitions_list
    from limits.ledger.table import kinds_forget

    with connection.cursor() as cursor:
        for day in partitions_list():
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
        cursor.execute("TRUNCATE limits_ledgercount, limits_ledgerbatch, limits_ledgerkind")
    kinds_forget()


def _draft() -> Any:
    """A draft: every segment's calendar day rule from 2 to 1, the tag rule deleted."""
    import msgspec

    from limits.models.policy import Rule
    from limits.policy.bodies import DraftBody
    from limits.policy.drafts import draft_applied

    rules = [
        {"op": "change", "id": rule.pk, "limit": 1}
        for rule in Rule.objects.filter(window_kind="calendar")
    ]
    rules += [{"op": "delete", "id": rule.pk} for rule in Rule.objects.filter(match="tag")]
    return draft_applied(msgspec.convert({"rules": rules}, DraftBody))


def exact(sample: int, users: int) -> None:
    """`sample` decisions by the real gate, drained into the ledger, replayed: 0 differences."""
    from limits.engine.limiter import Limiter
    from limits.engine.quiet import QuietFields
    from limits.ledger.drain import ledger_drain_all
    from limits.policy.selectors import policy_read
    from limits.policy.services import QUIET_HOURS
    from limits.reasons import Reason
    from worker.backtest import backtest_part
    from worker.gate import Gate

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    _reset()
    QUIET_HOURS.model.objects.all().delete()
    QUIET_HOURS.create(
        fields=QuietFields(
            segment=SEGMENTS[0], channel="sms", start="22:00", end="07:00", spread_minutes=30
        ),
        via="command",
    )
    gate = Gate(limiter=Limiter(client, prefix="bench-bt:"), index=in_memory_index(users))
    rng = np.random.default_rng(11)
    days = 10
    today = datetime.now(UTC).date()
    first = today - timedelta(days=days + 1)
    zones = ["America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu", None]
    made = 0
    began = time.perf_counter()
    per_day = -(-sample // (days - 2))
    for d in range(days):
        start = datetime(first.year, first.month, first.day, tzinfo=UTC) + timedelta(days=d)
        for c in range(per_day // CALL):
            at = start + timedelta(seconds=int(c * DAY / (per_day // CALL)))
            picked = rng.integers(1, users, CALL)
            campaign = f"c{rng.integers(0, 6)}"
            custom = rng.random() < 0.2
            requests = [
                (int(u), f"m{rng.integers(0, 4)}" if custom else f"{campaign}:{u}") for u in picked
            ]
            channel = str(rng.choice(["email", "push", "sms"]))
            decisions = gate.check(
                channel=channel,
                requests=requests,
                campaign=campaign,
                tags=("promo",) if rng.random() < 0.4 else (),
                priority=int(rng.choice([3, 5, 8])),
                time_zones=[zones[int(u) % len(zones)] for u in picked],
                now=at,
            )
            made += len(decisions)
            # A few admitted sends fail for good: given back, and so recorded.
            back = [(d.user_id, d.message_id) for d in decisions if d.reason == Reason.ALLOWED][:3]
            if back:
                gate.release(channel=channel, requests=back)
                gate.outcomes(
                    channel=channel, since=at, outcomes=[(u, m, "released") for u, m in back]
                )
            if c % 50 == 0:
                ledger_drain_all()
    ledger_drain_all()
    print(f"exact: {made:,} decisions by the gate in {time.perf_counter() - began:.0f} s")
    began = time.perf_counter()
    table = policy_read()
    result = backtest_part(
        start=first + timedelta(days=2), end=first + timedelta(days=days - 1), in_force=table,
        draft=_draft().table,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    print(
        f"exact: {result.decisions:,} decisions replayed under the policy in force and a draft "
        f"in {seconds:.1f} s; {result.differences:,} differ from the ledger's"
        + (f" (first: {result.examples[:3]})" if result.differences else "")
    )
    client.flushdb()


def rows_written(days: int, per_day: int) -> date:
    """`days` x `per_day` decisions (a blast a day over users 1 to per_day, calls of 1,000,
    every one admitted) written straight into the ledger's partitions; the first day."""
    from django.db import connection, transaction

    from limits.ledger.drain import TABLE, partitions_ensure
    from limits.ledger.table import KindFields, kinds_find

    index = in_memory_index(per_day + 1)
    users = np.arange(1, per_day + 1, dtype=np.int64)
    segment_of = np.asarray(index.resolve_many(users.tolist()), dtype=object)
    names = sorted({s or "" for s in segment_of})
    codes = np.asarray([names.index(s or "") for s in segment_of])
    today = datetime.now(UTC).date()
    first = today - timedelta(days=days)
    partitions_ensure({first + timedelta(days=d) for d in range(days)})
    for d in range(days):
        day = first + timedelta(days=d)
        campaign = f"day-{d}"
        tags = ("promo",) if d % 2 else ()
        with transaction.atomic():
            kinds = kinds_find(
                day,
                [
                    KindFields("email", campaign, tags, 5, "marketing", "bench", s, "allowed", None)
                    for s in names
                ],
            )
        kind_ids = np.asarray(
            [
                kinds[
                    KindFields("email", campaign, tags, 5, "marketing", "bench", s, "allowed", None)
                ]
                for s in names
            ]
        )[codes]
        start = datetime(day.year, day.month, day.day, 10, tzinfo=UTC)
        at = [
            (start + timedelta(milliseconds=50 * (k // CALL))).isoformat() for k in range(per_day)
        ]
        text = io.StringIO()
        for k in range(per_day):
            text.write(f"{at[k]}\t{users[k]}\t{kind_ids[k]}\t0\t\\N\n")
        text.seek(0)
        with (
            connection.cursor() as cursor,
            cursor.copy(
                f"COPY {TABLE} (at, user_id, kind_id, outcome, message_id) FROM STDIN"
            ) as copy,
        ):
            copy.write(text.getvalue())
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
    return first


BESIDE_DAYS = 3  # the days replayed while the gate's decisions/s are measured beside them


def fast(days: int, per_day: int, parts: int) -> None:
    """`days` x `per_day` decisions replayed in `parts` processes at once, timed; then in one
    process, for the ratio; then the gate's decisions/s beside a replay of the first
    BESIDE_DAYS days."""
    from bench.gate import gate_rate_beside

    _reset()
    began = time.perf_counter()
    first = rows_written(days, per_day)
    print(
        f"fast: {days} days x {per_day:,} decisions written in {time.perf_counter() - began:.0f} s"
    )
    took: dict[int, float] = {}

    def replayed(processes: int) -> None:
        took[processes] = _replayed(first, days, per_day, processes)

    replayed(parts)
    print("target: 30 days x 1M decisions a day under 90 s")
    rows = days * per_day
    print(
        f"fast: 300M rows at this rate (linear: each day's rows are read and replayed alike) "
        f"would take {took[parts] * 300_000_000 / rows:.0f} s in {parts} processes"
    )
    if parts > 1:
        replayed(1)
        print(
            f"fast: 1 process against {parts}: {took[1]:.1f} s against {took[parts]:.1f} s "
            f"({took[1] / took[parts]:.2f}x)"
        )
    beside = min(days, BESIDE_DAYS)
    gate_rate_beside(REDIS_URL, lambda: _replayed(first, beside, per_day, parts))


def _replayed(first: date, days: int, per_day: int, parts: int) -> float:
    began = time.perf_counter()
    env = {**os.environ, "GATEKEEPER_BENCH_PART_OF": str(parts)}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench", "backtest", "--", "--part", str(k), "--first",
             first.isoformat(), "--days", str(days)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )
        for k in range(parts)
    ]  # fmt: skip
    decisions = 0
    for child in children:
        out, _ = child.communicate()
        decisions += int(out.strip().splitlines()[-1])
    seconds = time.perf_counter() - began
    print(
        f"fast: {decisions:,} decisions ({days} days x {per_day:,}) replayed under the policy in "
        f"force and a draft in {parts} processes in {seconds:.1f} s "
        f"({decisions / seconds:,.0f} decisions/s)"
    )
    return seconds


def part(k: int, parts: int, first: date, days: int) -> None:
    from limits.policy.selectors import policy_read
    from worker.backtest import backtest_part

    result = backtest_part(
        start=first, end=first + timedelta(days=days - 1), in_force=policy_read(),
        draft=_draft().table, part=k, parts=parts,
    )  # fmt: skip
    print(result.decisions)


def main(argv: list[str]) -> None:
    if on_bench_database("backtest", argv):
        return
    parser = argparse.ArgumentParser(prog="bench backtest")
    parser.add_argument("--sample", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--part", type=int, default=None)
    parser.add_argument("--first", default=None)
    args = parser.parse_args(argv)
    if args.part is not None:
        part(
            args.part,
            int(os.environ["GATEKEEPER_BENCH_PART_OF"]),
            date.fromisoformat(args.first),
            args.days,
        )
        return
    policy_made()
    if args.sample:
        exact(args.sample, args.users)
    if args.days:
        fast(args.days, args.per_day, args.parts)
