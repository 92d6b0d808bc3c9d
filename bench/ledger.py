"""The send ledger: what it costs the gate, what it costs PostgreSQL, how fast it is written, and
how long rebuilding Redis's logs from it takes.

python -m bench ledger [-- --seconds 8 --rows 1000000 --rebuild-users 1000000]

Runs on PostgreSQL, in a database of its own (bench/postgres.py), against Redis database 14.
"""

import argparse
import functools
import os
import random
import subprocess
import sys
import time
from typing import Any

import redis

from bench.postgres import REDIS_URL, ROOT, on_bench_database


def _reset_tables() -> None:
    from django.db import connection

    from limits.ledger.drain import partition_name, partitions_list
    from limits.ledger.table import kinds_forget

    with connection.cursor() as cursor:
        for day in partitions_list():
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
        cursor.execute("TRUNCATE limits_ledgercount, limits_ledgerbatch, limits_ledgerkind")
    kinds_forget()


def _gates() -> tuple[Any, Any]:
    """The same gate (classic caps, an in-memory index) with the ledger on, and off."""
    from bench.gate import CLASSIC, in_memory_index
    from limits.engine.limiter import Limiter
    from limits.engine.table import PolicyTable
    from limits.policy.selectors import PolicyCache
    from worker.gate import Gate

    make = functools.partial(
        Gate,
        limiter=Limiter(redis.Redis.from_url(REDIS_URL), prefix="gk:"),
        policy=PolicyCache.holding(PolicyTable(rules=CLASSIC, classic={}, zones={})),
        index=in_memory_index(),
        record_stats=True,
    )
    return make(record_ledger=True), make(record_ledger=False)


def ledger_beside_none(seconds: float) -> None:
    """Gate decisions/s with the ledger on against off, runs alternated, a drainer process
    writing the stream into PostgreSQL all along, on beat's schedule (every 2 s)."""
    from bench.gate import USERS, alternated
    from limits.ledger.stream import stream_key

    on, off = _gates()
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    drainer = subprocess.Popen(
        [sys.executable, "-c", DRAINER],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "gatekeeper.settings"},
    )
    rng = random.Random(6)
    counter = iter(range(10**9))

    def step(gate: Any) -> int:
        n = next(counter)
        requests = [(u, f"l{n}-{u}") for u in rng.sample(range(USERS), 1000)]
        return len(gate.check(channel="email", requests=requests, campaign="bench"))

    rounds = 8
    try:
        plain, kept, ratio = alternated(
            functools.partial(step, off), functools.partial(step, on), seconds, rounds=rounds
        )
        behind = client.xlen(stream_key())
    finally:
        drainer.terminate()
        drainer.wait(timeout=30)
    print(
        f"gate with the ledger off: {plain:,.0f} decisions/s; on: {kept:,.0f} decisions/s "
        f"(batches of 1,000, medians of {rounds} alternated runs, beat's drain every 2 s; "
        f"{behind:,} gate calls left in the stream at the end)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)   (target >= 0.85x)")
    redis_cost(step, on, off, client)


def _redis_cpu(client: redis.Redis) -> float:
    found: Any = client.info("cpu")
    return float(found["used_cpu_user"]) + float(found["used_cpu_sys"])


def redis_cost(step: Any, on: Any, off: Any, client: redis.Redis) -> None:
    """Redis's CPU per decision with the ledger off and on (the XADD, and the drain's reads,
    acknowledgements and deletes, drained here in this process), and the stream's bytes per
    decision while it waits to be drained. INFO cpu of the whole server: run it quiet."""
    from limits.ledger.drain import ledger_drain_all
    from limits.ledger.stream import stream_key

    calls = 300
    client.delete(stream_key())
    ledger_drain_all(client=client)  # the consumer group, made before measuring
    figures = []
    for gate in (off, on):
        before = _redis_cpu(client)
        decisions = sum(step(gate) for _ in range(calls))
        waiting = client.memory_usage(stream_key()) or 0
        ledger_drain_all(client=client, seconds=600)
        figures.append(((_redis_cpu(client) - before) / decisions * 1e6, waiting / decisions))
    (plain, _), (kept, waiting) = figures
    print(
        f"Redis CPU per decision: {plain:.2f} us with the ledger off, {kept:.2f} us on, drained "
        f"({kept / plain:.2f}x); the stream holds {waiting:.1f} bytes per decision until drained"
    )


# Beat's schedule: the drain task every 2 s, up to 10 rounds of 200 gate calls each. SIGTERM
# stops it after the drain under way (an exception raised by the handler could land in a
# finalizer, which swallows it, and the loop would go on).
DRAINER = """
import django, signal, threading, time
django.setup()
from limits.tasks import ledger_drain
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
while not stop.is_set():
    started = time.monotonic()
    ledger_drain()
    stop.wait(max(0.0, 2.0 - (time.monotonic() - started)))
"""


def _fill_stream(client: redis.Redis, rows: int, *, users: int, own_ids: bool = False) -> None:
    """`rows` decisions in the stream as the gate writes them: calls of 1,000, four campaigns,
    six segments, the classic reasons in a marketing mix, over the last few days. Message ids
    of their own (`m<n>`), or with `own_ids` the campaign's (`<campaign>:<user>`, as send jobs
    name their sends)."""
    from limits.engine.limiter import Decision
    from limits.ledger.stream import ledger_append
    from limits.reasons import Category, Reason

    mix = {Reason.ALLOWED: 7, Reason.DAILY_CAP: 1, Reason.WEEKLY_CAP: 1, Reason.QUIET_HOURS: 1}
    reasons = [reason for reason, n in mix.items() for _ in range(n)]
    segments = ["vip", "active", "new", "dormant", "churned", "default"]
    now = time.time()
    for call in range(0, rows, 1000):
        size = min(1000, rows - call)
        decisions = [
            Decision(
                user_id=(call + i) % users,
                message_id=f"campaign-{call % 4}:{(call + i) % users}"
                if own_ids
                else f"m{call + i}",
                allowed=True,
                reason=reasons[(call + i) % len(reasons)],
                counts={},
                limits={},
                retry_after=None,
                segment=segments[(call + i) % len(segments)],
            )
            for i in range(size)
        ]
        ledger_append(
            at_ms=round((now - 3 * 86_400 * (call / rows)) * 1000),
            channel="email" if call % 3 else "push",
            campaign=f"campaign-{call % 4}",
            tags=("promo",),
            priority=5,
            category=Category.MARKETING,
            snapshot_version="20261124T000000Z-b0000001-1",
            decisions=decisions,
            client=client,
        )


def writer_and_storage(rows: int) -> None:
    """Rows/s the drain writes (stream read, COPY into day partitions, hourly counts, stream
    ids, acknowledgement), and the bytes a decision takes in PostgreSQL (table, indexes and
    kinds): with message ids of their own, then with the campaign's."""
    from limits.ledger.drain import ledger_drain

    client = redis.Redis.from_url(REDIS_URL)
    for own_ids in (False, True):
        client.flushdb()
        _reset_tables()
        _fill_stream(client, rows, users=rows, own_ids=own_ids)
        started, written = time.perf_counter(), 0
        while True:
            report = ledger_drain(client=client)
            written += report.rows
            if not report.entries:
                break
        wall = time.perf_counter() - started
        total, table, kinds, counts = _ledger_bytes()
        ids = "the campaign's own message ids" if own_ids else "message ids of their own"
        if not own_ids:
            print(
                f"drain: {written:,} decisions in {wall:.1f} s: {written / wall:,.0f} rows/s "
                f"(gate calls of 1,000; a 10M-a-day ledger needs 116 rows/s on average)"
            )
        print(
            f"PostgreSQL, {ids}: {total / written:.1f} bytes per decision   (target <= 100; "
            f"table {table / written:.1f}, indexes {(total - table - kinds) / written:.1f}, "
            f"kinds {kinds / written:.2f}; {total / 2**20:,.0f} MiB for {written:,}); "
            f"{counts:,} hourly count rows"
        )


def _ledger_bytes() -> tuple[int, int, int, int]:
    """The ledger's bytes in PostgreSQL (its day partitions with their indexes, and the
    kinds), its tables' alone, the kinds', and how many hourly counts there are."""
    from django.db import connection

    from limits.ledger.drain import partition_name, partitions_list

    with connection.cursor() as cursor:
        total = table = 0
        for day in partitions_list():
            cursor.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s)",
                [partition_name(day)] * 2,
            )
            whole, alone = cursor.fetchone()
            total, table = total + int(whole), table + int(alone)
        cursor.execute("SELECT pg_total_relation_size('limits_ledgerkind')")
        kinds = int(cursor.fetchone()[0])
        cursor.execute("SELECT count(*) FROM limits_ledgercount")
        counts = int(cursor.fetchone()[0])
    return total + kinds, table, kinds, counts


def rebuild(users: int, per_user: int) -> None:
    """rebuild_logs for `users` users with `per_user` countable sends each, Redis empty."""
    from django.db import connection

    from limits.ledger.drain import ledger_drain
    from limits.ledger.rebuild import logs_rebuild

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    _reset_tables()
    rows = users * per_user
    started = time.perf_counter()
    # Straight into the ledger: the stream's way, 1,000 at a time, as in production.
    step = 200_000
    for start in range(0, rows, step):
        _fill_batch(client, start, min(step, rows - start), users, per_user)
        while ledger_drain(client=client).entries:
            pass
    filled = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE limits_ledgerentry")
    client.flushdb()  # Redis lost everything
    report = logs_rebuild()
    keys = client.dbsize()
    print(
        f"rebuild_logs: {report.users:,} users x {per_user} sends ({report.sends:,} sends, "
        f"{report.added:,} put back into {keys:,} buckets) in {report.seconds:.1f} s: "
        f"{report.sends / report.seconds:,.0f} sends/s   (ledger filled in {filled:.0f} s)"
    )


def _fill_batch(
    client: redis.Redis, start: int, count: int, users: int, per_user: int, *, at: float = 0.0
) -> None:
    """Gate calls of 1,000 allowed decisions: users `start` to `start + count` (modulo
    `users`), each user's k-th an hour later than their (k-1)-th, the last an hour ago; all at
    `at` instead when given."""
    from limits.engine.limiter import Decision
    from limits.ledger.stream import ledger_append
    from limits.reasons import Category, Reason

    now = time.time()
    for call in range(start, start + count, 1000):
        size = min(1000, start + count - call)
        k = call // users  # the round: each user's k-th send
        ledger_append(
            at_ms=round((at or now - 3600 * (per_user - k)) * 1000),
            channel="email",
            campaign=f"campaign-{k}",
            tags=("promo",) if k % 2 else (),
            priority=5,
            category=Category.MARKETING,
            snapshot_version="20261124T000000Z-b0000001-1",
            decisions=[
                Decision(
                    user_id=(call + i) % users,
                    message_id=f"m{call + i}",
                    allowed=True,
                    reason=Reason.ALLOWED,
                    counts={},
                    limits={},
                    retry_after=None,
                    segment="default",
                )
                for i in range(size)
            ],
            client=client,
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench ledger")
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rebuild-users", type=int, default=1_000_000)
    parser.add_argument("--sends-per-user", type=int, default=5)
    args = parser.parse_args(argv)
    if on_bench_database("ledger", argv):
        return
    ledger_beside_none(args.seconds)
    writer_and_storage(args.rows)
    rebuild(args.rebuild_users, args.sends_per_user)
