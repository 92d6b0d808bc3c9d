"""The gate: end-to-end throughput beside the limiter alone, and a campaign through workers.

python -m bench gate [-- --recipients 1000000 --seconds 4]
"""

import argparse
import array
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis
from pyroaring import FrozenBitMap

from limits.limiter import Limiter
from limits.policy import DAY_SECONDS, WEEK_SECONDS, PolicyTable, counting_rule, encode
from limits.quiet import QuietView
from limits.selectors import PolicyCache, _Cached
from segments.index import SegmentIndex
from worker.gate import Gate

ROOT = Path(__file__).resolve().parent.parent
USERS = 1_000_000
SEGMENTS = ["vip", "active", "new", "dormant", "churned"]


def in_memory_index() -> SegmentIndex:
    rng = np.random.default_rng(5)
    assignment = rng.integers(0, len(SEGMENTS) + 1, USERS)  # the last value: in no list
    bitmaps = {
        slug: FrozenBitMap(
            array.array("I", np.flatnonzero(assignment == i).astype(np.uint32).tobytes())
        )
        for i, slug in enumerate(SEGMENTS)
    }
    return SegmentIndex(
        version="bench",
        id_width=32,
        segments=SEGMENTS,
        default_slug="default",
        bitmaps=bitmaps,  # type: ignore[arg-type]
        cardinalities={slug: len(b) for slug, b in bitmaps.items()},
    )


# The classic caps of every segment: email 3 a day and 10 a week, 5 and 20 in all.
CLASSIC = (
    counting_rule(channel="email", seconds=DAY_SECONDS, limit=3),
    counting_rule(channel="email", seconds=WEEK_SECONDS, limit=10),
    counting_rule(channel="all", seconds=DAY_SECONDS, limit=5),
    counting_rule(channel="all", seconds=WEEK_SECONDS, limit=20),
)


def fixed_policy(table: PolicyTable) -> PolicyCache:
    """A policy cache that always answers `table` (no database)."""
    cache = PolicyCache(ttl=float("inf"))
    cache._cached = _Cached(table=table, read_at=time.monotonic())
    return cache


def rate(step: Callable[[], int], seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += step()
    return done / (time.perf_counter() - started)


def alternated(
    anchor: Callable[[], int],
    measured: Callable[[], int],
    seconds: float,
    *,
    rounds: int = 8,
    between: Callable[[], Any] | None = None,
) -> tuple[float, float, float]:
    """Short runs of each alternated: the median rate of each, and the median of the ratios of
    neighbouring runs (measured / anchor); a machine busy with something else slows both alike."""
    rates: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for found, step in zip(rates, (anchor, measured), strict=True):
            found.append(rate(step, seconds / rounds))
            if between is not None:
                between()
    ratio = statistics.median(m / a for a, m in zip(*rates, strict=True))
    return statistics.median(rates[0]), statistics.median(rates[1]), ratio


def gate_beside_limiter(url: str, seconds: float) -> None:
    client = redis.Redis.from_url(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    gate = Gate(
        limiter=limiter,
        policy=fixed_policy(PolicyTable(rules=CLASSIC, classic={}, zones={})),
        index=in_memory_index(),
        record_stats=True,
        record_ledger=False,  # as the figures before the ledger were measured
    )
    rule_set = encode(list(CLASSIC), priority=5, zone="UTC", now_ms=0)
    rng = random.Random(3)
    counter = iter(range(10**9))

    def batch() -> list[tuple[int, str]]:
        n = next(counter)
        return [(u, f"m{n}-{u}") for u in rng.sample(range(USERS), 1000)]

    alone = rate(lambda: len(limiter.acquire("email", batch(), rule_set)), seconds)
    client.flushdb()
    whole = rate(lambda: len(gate.check(channel="email", requests=batch())), seconds)
    client.flushdb()
    print(f"limiter alone, batches of 1,000 over {USERS:,} users: {alone:,.0f} decisions/s")
    print(f"gate (resolve + caps + limiter + counters): {whole:,.0f} decisions/s")
    print(
        f"gate loses {100 * (1 - whole / alone):.1f}% against the limiter alone   (target <= 15%)"
    )


# Zones within a few hours of each other, so that quiet hours can be set where none holds.
ZONES = [
    "Europe/London",
    "Europe/Paris",
    "Europe/Berlin",
    "Europe/Madrid",
    "Europe/Athens",
    "Europe/Lisbon",
    "Africa/Lagos",
    "Europe/Helsinki",
]


def quiet_hours_beside_none(url: str, seconds: float) -> None:
    """Gate decisions/s with quiet hours configured (every segment, each channel and `all`,
    none holding at the moment, so every send still reaches Redis) against none configured,
    on the same users, sends and per-request zones, runs alternated."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    classic = CLASSIC
    # Twelve hours away from the zones' clocks now: configured, asked, holding nobody.
    hour = (time.gmtime().tm_hour + 12) % 24
    quiet = tuple(
        QuietView(
            id=i,
            segment=segment,
            channel=channel,
            start=hour * 60,
            end=((hour + 2) % 24) * 60,
            spread_minutes=30,
        )
        for i, (segment, channel) in enumerate(
            [(None, "all"), (None, "email"), ("vip", "email"), ("dormant", "all")]
        )
    )
    index = in_memory_index()

    def gate_with(entries: tuple[QuietView, ...]) -> Gate:
        table = PolicyTable(rules=classic, classic={}, zones={}, quiet=entries)
        return Gate(
            limiter=limiter,
            policy=fixed_policy(table),
            index=index,
            record_stats=True,
            record_ledger=False,
        )

    without, with_quiet = gate_with(()), gate_with(quiet)
    rng = random.Random(4)
    counter = iter(range(10**9))
    zones = [ZONES[i % len(ZONES)] for i in range(1000)]

    def step(gate: Gate) -> int:
        n = next(counter)
        requests = [(u, f"q{n}-{u}") for u in rng.sample(range(USERS), 1000)]
        decisions = gate.check(channel="email", requests=requests, time_zones=zones)
        assert decisions[0].reason != "quiet_hours"
        return len(decisions)

    rounds = 8
    plain, configured, ratio = alternated(
        functools.partial(step, without),
        functools.partial(step, with_quiet),
        seconds,
        rounds=rounds,
        between=client.flushdb,
    )
    print(
        f"gate without quiet hours: {plain:,.0f} decisions/s; with {len(quiet)} quiet-hours "
        f"entries configured (none holding): {configured:,.0f} decisions/s "
        f"(medians of {rounds} alternated runs)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)   (target >= 0.95x)")


def campaign(recipients: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
            "REDIS_URL": "redis://127.0.0.1:6379/14",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
            "GATEKEEPER_STORE_URL": f"{tmp}/store",
            "GATEKEEPER_SNAPSHOT_CACHE_DIR": f"{tmp}/cache",
            "MEDIA_ROOT": f"{tmp}/media",
            "GATEKEEPER_PUSH_BACKEND": "worker.dispatchers.NullPushBackend",
            "LOG_LEVEL": "WARNING",
        }
        for url in (env["REDIS_URL"], env["CELERY_BROKER_URL"]):
            redis.Redis.from_url(url).flushdb()
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        subprocess.run(
            [python, "manage.py", "seed_demo"], cwd=ROOT, env=env, check=True, capture_output=True
        )
        csv = Path(tmp) / "recipients.csv"
        # One send per user: ids past the demo's 200,000 listed users fall in the default segment.
        csv.write_text("".join(f"{i},token-{i}\n" for i in range(recipients)))
        worker = subprocess.Popen(
            [str(Path(python).parent / "celery"), "-A", "gatekeeper", "worker", "-Q", "sends", "-c", "2",
             "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            started = time.perf_counter()
            subprocess.run(
                [python, "manage.py", "send_campaign", "--channel", "push", "--template", "offer", "--recipients", str(csv)],
                cwd=ROOT, env=env, check=True, capture_output=True,
            )  # fmt: skip
            queued = time.perf_counter() - started
            script = (
                "import time;from worker.models import SendJob\n"
                "while SendJob.objects.get(campaign='offer').status != 'done': time.sleep(0.2)\n"
                "job=SendJob.objects.get(campaign='offer');print(job.sent, job.reasons)"
            )
            out = subprocess.run(
                [python, "manage.py", "shell", "-v", "0", "-c", script],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            wall = time.perf_counter() - started
        finally:
            os.killpg(worker.pid, 15)
            worker.wait(timeout=30)
        print(
            f"campaign of {recipients:,} push recipients through 2 worker processes (null dispatcher): {wall:.1f} s, {recipients / wall:,.0f} recipients/s"
        )
        print(f"  of which send_campaign reading, validating and queueing the file: {queued:.1f} s")
        print(f"  sent and gate reasons: {out.strip()}")
        print(
            f"  at this rate 1M recipients take {1_000_000 / (recipients / wall):.0f} s   (target < 60 s)"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench gate")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--recipients", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    gate_beside_limiter(args.redis_url, args.seconds)
    quiet_hours_beside_none(args.redis_url, 2 * args.seconds)
    campaign(args.recipients)
