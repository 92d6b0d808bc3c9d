"""The decisions report on PostgreSQL: the ledger's hourly counts (LedgerCount) as 30 days of a
10-million-decisions-a-day gate leave them, and how long the report takes for every grouping.

make bench BENCH_ARGS="reports"
    [-- --days 30 --per-day 10000000 --campaigns 40 --recurring 10 --hours 6 --segments 12
        --both-channels --runs 3]

It runs on the benchmarks' own PostgreSQL database (bench/postgres.py): its counts table is
emptied and refilled. The report reads LedgerCount only, so only the number of
count rows matters, not the 10 million decisions a day they count; the mix:

- `--campaigns` campaigns a day (`--recurring` of them every day, the others new each day),
  each on one channel (email or push; `--both-channels`: both), sending for `--hours`
  consecutive hours from a random hour; in each of those hours every segment (`--segments`)
  gets every reason of a marketing send (8: allowed, duplicate, daily_cap, weekly_cap, cap,
  blocked, quiet_hours, unavailable), so the rows are an upper bound for the mix;
- plus the transactional sends: no campaign, reason exempt, every hour, segment and channel.

With the defaults: 40 campaign-runs x 6 hours x 12 segments x 8 reasons + 24 x 12 x 2 = 23,616
rows a day, 708,480 for 30 days (984 an hour). The worst case, every campaign on both channels
in every hour (`--hours 24 --both-channels`): 7,680 + 24 rows an hour, 5.5 million for 30 days.
"""

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from itertools import combinations
from typing import Any

from django.core.management import call_command
from django.db import connection
from rest_framework.renderers import JSONRenderer

from bench.postgres import on_bench_database
from limits.ledger.reports import GROUPS, decisions_query, decisions_report
from limits.models.ledger import LedgerCount
from limits.reasons import MARKETING_REASONS, REFUSED, Reason

# Each reason's share of a campaign's decisions (most sends go through); a reason the gate
# gains and this table does not name stops the benchmark (zip's strict below).
SHARES = {
    Reason.ALLOWED: 0.765, Reason.DUPLICATE: 0.01, Reason.DAILY_CAP: 0.09,
    Reason.WEEKLY_CAP: 0.04, Reason.CAP: 0.02, Reason.BLOCKED: 0.01, Reason.QUIET_HOURS: 0.04,
    Reason.SUPPRESSED: 0.01, Reason.PREFERENCE: 0.01, Reason.PAUSED: 0.005,
    Reason.UNAVAILABLE: 0.005,
}  # fmt: skip
TRANSACTIONAL_SHARE = 0.05
CHANNELS = ("email", "push")


def rows_of_the_mix(args: argparse.Namespace, *, today: datetime) -> list[tuple[Any, ...]]:
    """(hour, channel, campaign, segment, reason, count) rows: `args.days` days up to today."""
    rng = random.Random(7)
    segments = [f"segment-{n:02d}" for n in range(args.segments)]
    rows: list[tuple[Any, ...]] = []
    first = today - timedelta(days=args.days - 1)
    for d in range(args.days):
        day = first + timedelta(days=d)
        names = [f"recurring-{n:02d}" for n in range(args.recurring)]
        names += [f"{day:%m%d}-campaign-{n:02d}" for n in range(args.campaigns - args.recurring)]
        runs: list[tuple[str, str, int]] = []  # (campaign, channel, first hour)
        for n, name in enumerate(names):
            channels = CHANNELS if args.both_channels else (CHANNELS[n % 5 >= 3],)
            start = rng.randrange(0, 24 - args.hours + 1)
            runs.extend((name, channel, start) for channel in channels)
        # Each campaign-hour sends an equal part of the day's marketing sends, split by SHARES.
        cells = len(runs) * args.hours * len(segments)
        per_cell = args.per_day * (1 - TRANSACTIONAL_SHARE) / cells
        for name, channel, start in runs:
            for h in range(start, start + args.hours):
                hour = day + timedelta(hours=h)
                for segment in segments:
                    for reason, share in zip(MARKETING_REASONS, SHARES.values(), strict=True):
                        n = max(1, round(per_cell * share * rng.uniform(0.5, 1.5)))
                        rows.append((hour, channel, name, segment, reason, n))
        exempt = args.per_day * TRANSACTIONAL_SHARE / (24 * len(segments) * len(CHANNELS))
        for h in range(24):
            for segment in segments:
                for channel in CHANNELS:
                    n = max(1, round(exempt * rng.uniform(0.5, 1.5)))
                    rows.append((day + timedelta(hours=h), channel, "", segment, Reason.EXEMPT, n))
    return rows


def fill(rows: list[tuple[Any, ...]]) -> float:
    table = LedgerCount._meta.db_table
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        columns = "hour, channel, campaign, segment, reason, count"
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - started


def timed(params: dict[str, list[str]], runs: int) -> tuple[list[float], float, int]:
    """Each run's seconds for the report (the query, its rows as dicts), the JSON's seconds (of
    the last run) and the rows."""
    seconds: list[float] = []
    rendered, found = 0.0, 0
    for _ in range(runs):
        started = time.perf_counter()
        query = decisions_query(params)
        rows = decisions_report(query=query)
        seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        JSONRenderer().render({"results": rows})
        rendered, found = time.perf_counter() - started, len(rows)
    return seconds, rendered, found


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench reports")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=10_000_000, help="decisions a day")
    parser.add_argument("--campaigns", type=int, default=40, help="campaigns a day")
    parser.add_argument("--recurring", type=int, default=10, help="of them, sent every day")
    parser.add_argument("--hours", type=int, default=6, help="hours each campaign sends a day")
    parser.add_argument("--segments", type=int, default=12)
    parser.add_argument("--both-channels", action="store_true", help="each campaign on both")
    parser.add_argument("--runs", type=int, default=3, help="runs of each report")
    args = parser.parse_args(argv)
    if not 1 <= args.hours <= 24 or not 0 <= args.recurring <= args.campaigns:
        raise SystemExit("--hours is 1 to 24, --recurring at most --campaigns")

    if on_bench_database("reports", argv):
        return
    settings = connection.settings_dict
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT version(), current_setting('work_mem')")
        version, work_mem = cursor.fetchone()
    print(f"{version.split(' on ')[0]} (work_mem {work_mem}), database {settings['NAME']}")

    today = datetime.now(tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rows = rows_of_the_mix(args, today=today)
    seconds = fill(rows)
    total = sum(row[5] for row in rows)
    print(
        f"{args.days} days of {args.per_day:,} decisions a day ({total / args.days:,.0f} "
        f"counted): {args.campaigns} campaigns a day ({args.recurring} every day), "
        f"{'both channels' if args.both_channels else 'one channel'} each, {args.hours} h a "
        f"day, {args.segments} segments, 8 reasons + exempt transactional sends"
    )
    print(
        f"LedgerCount: {len(rows):,} rows ({len(rows) / args.days:,.0f} a day, "
        f"{len(rows) / args.days / 24:,.0f} an hour), written with COPY in {seconds:.1f} s"
    )
    window = {
        "from": [str(today.date() - timedelta(days=args.days - 1))],
        "to": [str(today.date())],
    }
    cases: list[tuple[str, dict[str, list[str]]]] = [
        (",".join(group_by) or "(none: the total)", {**window, "group_by": [",".join(group_by)]})
        for n in range(len(GROUPS) + 1)
        for group_by in combinations(GROUPS, n)
    ]
    cases += [
        (
            "day,campaign,reason of refused reasons (the dashboard's)",
            {**window, "group_by": ["day,campaign,reason"], "reason": list(REFUSED)},
        ),
        (
            "day,segment,reason of one campaign",
            {**window, "group_by": ["day,segment,reason"], "campaign": ["recurring-00"]},
        ),
    ]
    print(
        f"\nThe report over the {args.days} days, per group_by (ms: first run, median of "
        f"{args.runs}; then the JSON of its rows):"
    )
    print(f"{'group_by':<60} {'rows':>9} {'first':>8} {'median':>8} {'json':>8}")
    worst = 0.0
    figures = []
    for name, params in cases:
        runs, rendered, found = timed(params, args.runs)
        worst = max(worst, statistics.median(runs))
        figures.append({"group_by": name, "rows": found, "seconds": runs, "json": rendered})
        print(
            f"{name:<60} {found:>9,} {runs[0] * 1e3:>8.0f} {statistics.median(runs) * 1e3:>8.0f} "
            f"{rendered * 1e3:>8.0f}"
        )
    print(f"\nslowest median: {worst * 1e3:.0f} ms   (target < 1000 ms)")
    print("figures:", json.dumps({"count_rows": len(rows), "cases": figures}))
