"""The experiments report on PostgreSQL: a cap experiment's daily counts as 90 days of a
10-million-decisions-a-day gate leave them, and how long its report takes.

make bench BENCH_ARGS="experiments" [-- --days 90 --per-day 10000000 --arms 3 --events 2 --runs 5]

It runs on the benchmarks' own PostgreSQL database (bench/postgres.py). The report reads the
study's days (StudyDay, StudyEvent: a row per day, arm and bucket, and per event name), never
the ledger, so their number is what matters: days x arms x 128 buckets (x event names). The
figures put in them are those of `--per-day` decisions a day spread over the arms: the users
entering fall day by day (most enter in the first week), sends and events every day.
"""

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.core.management import call_command
from django.db import connection

from bench.postgres import on_bench_database
from limits.models.studies import Experiment, ExperimentArm, StudyDay, StudyEvent
from limits.studies.experiments import ArmFields, ExperimentFields
from limits.studies.lift import BUCKETS
from limits.studies.report import study_of, study_report

RULE = {"name": "n a week", "channel": "email", "window": {"kind": "rolling", "seconds": 604_800}}


def _experiment(days: int, arms: int) -> Experiment:
    Experiment.objects.all().delete()
    starts = datetime.now(UTC) - timedelta(days=days - 1)
    fields = ExperimentFields(
        name="bench", segment=None, starts_at=starts, ends_at=starts + timedelta(days=days + 1),
        salt="bench", arms=[ArmFields(f"{n + 3} a week", 1 / arms, [{**RULE, "limit": n + 3}])
                            for n in range(arms)],
    )  # fmt: skip
    row = Experiment.objects.create(
        name=fields.name, segment=None, salt=fields.salt, starts_at=fields.starts_at,
        ends_at=fields.ends_at,
    )  # fmt: skip
    for n, arm in enumerate(fields.arms):
        ExperimentArm.objects.create(
            experiment=row, position=n, name=arm.name, share=arm.share, rules=arm.rules
        )
    return row


def fill(study: int, first: Any, args: argparse.Namespace) -> tuple[int, int, float]:
    rng = np.random.default_rng(3)
    per_cell = args.per_day / args.arms / BUCKETS
    days_rows: list[tuple[Any, ...]] = []
    event_rows: list[tuple[Any, ...]] = []
    for d in range(args.days):
        day = first + timedelta(days=d)
        entering = per_cell * 0.3 * 0.7**d  # most enter in the first days
        for arm in range(args.arms):
            for bucket in range(BUCKETS):
                days_rows.append((study, day, arm, bucket, int(rng.poisson(entering)),
                                  int(rng.poisson(per_cell * 0.8)), int(rng.poisson(per_cell * 1e-4)),
                                  int(rng.poisson(per_cell * 1e-5))))  # fmt: skip
                for e in range(args.events):
                    count = int(rng.poisson(per_cell * 0.01))
                    event_rows.append((study, day, arm, bucket, f"event-{e}", count, count * 42.5))
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for model, rows, columns in (
            (StudyDay, days_rows,
             "study, day, arm, bucket, entered, sends, unsubscribes, complaints"),
            (StudyEvent, event_rows, "study, day, arm, bucket, name, count, value"),
        ):  # fmt: skip
            table = model._meta.db_table
            cursor.execute(f"TRUNCATE {table}")
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cursor.execute(f"VACUUM ANALYZE {table}")
    return len(days_rows), len(event_rows), time.perf_counter() - started


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench experiments")
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--per-day", type=int, default=10_000_000, help="decisions a day")
    parser.add_argument("--arms", type=int, default=3)
    parser.add_argument("--events", type=int, default=2, help="event names")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if on_bench_database("experiments", argv):
        return
    call_command("migrate", verbosity=0)
    row = _experiment(args.days, args.arms)
    first = row.starts_at.date()
    days_rows, event_rows, seconds = fill(row.pk, first, args)
    print(
        f"{args.days} days of {args.per_day:,} decisions a day over {args.arms} arms and "
        f"{args.events} event names: StudyDay {days_rows:,} rows, StudyEvent {event_rows:,} "
        f"rows, written with COPY in {seconds:.1f} s"
    )
    today = datetime.now(UTC).date()
    study = study_of(str(row.pk), today=today)
    assert study is not None
    runs = []
    report: dict[str, Any] = {}
    for _ in range(args.runs):
        started = time.perf_counter()
        report = study_report(study, start=first, end=today)
        runs.append(time.perf_counter() - started)
    median = statistics.median(runs)
    users = [arm["users"] for arm in report["arms"]]
    print(
        f"the report over {(today - first).days + 1} days ({len(report['measures'])} measures, "
        f"users per arm {users}): first {runs[0] * 1e3:.0f} ms, median of {args.runs} "
        f"{median * 1e3:.0f} ms   (target < 1000 ms)"
    )
    print(f"  verdict: {report['verdict']}")
    drained = drain_cost(row.pk)
    print("figures:", json.dumps({"study_day_rows": days_rows, "study_event_rows": event_rows,
                                  "seconds": runs, "drain_us": drained}))  # fmt: skip


def drain_cost(study: int, calls: int = 100, size: int = 1_000) -> list[float]:
    """What the drain pays for decisions of users in a running experiment
    (limits.studies.measures.decisions_noted, in its transaction): per decision, for users new to it and
    for the same users again."""
    from django.db import transaction

    from limits.ledger.stream import ARM_CODES, Decided
    from limits.models.studies import StudyMember
    from limits.reasons import Category, Reason

    StudyMember.objects.filter(study=study).delete()
    at = int(time.time() * 1000)
    batch = [
        Decided(
            at_ms=at, channel="email", campaign="bench", tags=[], priority=5,
            category=Category.MARKETING, version="bench", users=users, messages=[""] * size,
            segments=["active"] * size, reasons=[Reason.ALLOWED] * size, rules=[None] * size,
            arms=[study * ARM_CODES + 1 + u % 2 for u in users],
        )
        for c in range(calls)
        for users in [list(range(c * size, (c + 1) * size))]
    ]  # fmt: skip
    from limits.studies.measures import decisions_noted

    figures = []
    for what in ("new to it", "already in it"):
        started = time.perf_counter()
        with transaction.atomic():
            decisions_noted(batch, None)
        seconds = time.perf_counter() - started
        figures.append(seconds / (calls * size) * 1e6)
        print(
            f"the drain's share for {calls * size:,} decisions of users {what}: {seconds:.2f} s, "
            f"{figures[-1]:.1f} us a decision"
        )
    return figures
