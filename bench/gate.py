"""The gate: end-to-end throughput beside the limiter alone, and a campaign through workers.

python -m bench gate [-- --recipients 1000000 --seconds 4]
python -m bench gate -- --cluster [--recipients N]: the campaign alone, on a 3-master cluster
python -m bench gate -- --postgres [--recipients N]: the campaign alone, on PostgreSQL, with the
  ledger drained as it goes
python -m bench gate -- --profile [--recipients N]: the campaign alone, one worker under cProfile
python -m bench gate -- --postgres --beats 2 [--kill-leader 20]: the ledger drained by beat's
  task on the upkeep worker, as deployed, with two beat processes (the leader killed 20 s in)
"""

import argparse
import array
import contextlib
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import redis
from pyroaring import BitMap64, FrozenBitMap
from redis.cluster import RedisCluster

from limits.engine.limiter import Limiter
from limits.engine.quiet import QuietView
from limits.engine.table import DAY_SECONDS, WEEK_SECONDS, PolicyTable, counting_rule, encode
from limits.people.preferences import PreferenceCache
from limits.people.suppression import SuppressionCache
from limits.policy.selectors import PolicyCache
from limits.reasons import Reason
from segments.index import SegmentIndex
from worker.gate import Gate

ROOT = Path(__file__).resolve().parent.parent
USERS = 1_000_000
SEGMENTS = ["vip", "active", "new", "dormant", "churned"]


def in_memory_index(users: int = USERS) -> SegmentIndex:
    """`users` ids (from 0) spread over the segments, a sixth of them in none."""
    rng = np.random.default_rng(5)
    assignment = rng.integers(0, len(SEGMENTS) + 1, users)  # the last value: in no list
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


def _redis(url: str) -> redis.Redis:
    """A client that waits for slow commands: flushing a 10M-recipient campaign's keys takes
    seconds."""
    return redis.Redis.from_url(url, socket_timeout=600)


def rate(step: Callable[[], int], seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += step()
    return done / (time.perf_counter() - started)


def gate_rate_beside(url: str, work: Callable[[], Any], *, alone_seconds: float = 8.0) -> None:
    """The gate's decisions/s (gate_rate_measured) alone for `alone_seconds`, then while `work`
    runs in this process: printed side by side."""
    alone = gate_rate_measured(url, seconds=alone_seconds)
    beside = gate_rate_measured(url, seconds=3600.0, beside=work)
    print(
        f"the gate beside it: {beside:,.0f} decisions/s against {alone:,.0f} alone "
        f"({beside / alone:.2f}x; one process each, on the machine's {os.cpu_count()} cores)"
    )


def beside_gate(url: str) -> Gate:
    """The gate the measures beside a work use: the classic caps, every user of USERS in a
    segment, keys of its own prefix in the Redis at `url`, its decisions counted as a worker's."""
    return deciding(
        Gate(
            limiter=Limiter(_redis(url), prefix="bench-beside:"),
            policy=PolicyCache.holding(PolicyTable(rules=CLASSIC, classic={}, zones={})),
            index=in_memory_index(),
            suppressions=SuppressionCache.holding(),
            preferences=PreferenceCache.holding({}),
            record_stats=True,
            record_ledger=False,
        )
    )


def gate_rate_measured(
    url: str, *, seconds: float, beside: Callable[[], Any] | None = None
) -> float:
    """The gate's decisions/s (batches of 1,000 random users of USERS under the classic caps,
    one process of its own, keys of its own prefix) for `seconds`, or until `beside`, run in
    this process meanwhile, is done."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    stop = context.Event()
    pipe, child_end = context.Pipe()

    def measure(limit: float) -> None:
        gate = beside_gate(url)
        child_end.send("ready")
        rng = random.Random(11)
        done, n, started = 0, 0, time.perf_counter()
        while not stop.is_set() and time.perf_counter() - started < limit:
            n += 1
            batch = [(u, f"b{n}-{u}") for u in rng.sample(range(USERS), 1000)]
            done += len(gate.check(channel="email", requests=batch))
        child_end.send(done / (time.perf_counter() - started))

    child = context.Process(target=measure, args=(seconds,))
    child.start()
    assert pipe.recv() == "ready"
    if beside is not None:
        beside()
        stop.set()
    found: float = pipe.recv()
    child.join()
    return found


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


ROUNDS = 8  # alternated runs of each gate, in the parts below


def deciding(gate: Gate) -> Gate:
    """`gate`, once a probe of it is answered otherwise than `unavailable`: a gate whose stage
    cannot read what it needs (a table not migrated, Redis away) answers every request
    `unavailable` in microseconds, and a figure of it would measure nothing."""
    (probe,) = gate.check(channel="email", requests=[(1, "probe")], dry_run=True)
    if probe.reason == Reason.UNAVAILABLE:
        raise SystemExit("the benchmark's gate answers `unavailable`: its figures would be void")
    return gate


def gates_alternated(
    gates: list[Gate],
    client: redis.Redis,
    seconds: float,
    *,
    seed: int,
    check: Callable[[Gate, list[tuple[int, str]]], list[Any]],
    size: int = 1000,
) -> tuple[float, float, float]:
    """Decisions/s of two gates, each asked batches of `size` random users (fresh message ids)
    by `check`, in ROUNDS alternated runs with the logs flushed between: (the first's, the
    second's, the median of the run pairs' ratios)."""
    pick = random.Random(seed)
    counter = iter(range(10**9))

    def step(gate: Gate) -> int:
        n = next(counter)
        return len(check(gate, [(u, f"{seed}-{n}-{u}") for u in pick.sample(range(USERS), size)]))

    return alternated(
        functools.partial(step, deciding(gates[0])),
        functools.partial(step, deciding(gates[1])),
        seconds,
        rounds=ROUNDS,
        between=client.flushdb,
    )


def gate_beside_limiter(url: str, seconds: float) -> None:
    client = _redis(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    gate = Gate(
        limiter=limiter,
        policy=PolicyCache.holding(PolicyTable(rules=CLASSIC, classic={}, zones={})),
        index=in_memory_index(),
        suppressions=SuppressionCache.holding(),
        preferences=PreferenceCache.holding({}),
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
    deciding(gate)
    whole = rate(lambda: len(gate.check(channel="email", requests=batch())), seconds)
    client.flushdb()
    print(f"limiter alone, batches of 1,000 over {USERS:,} users: {alone:,.0f} decisions/s")
    print(f"gate (resolve + caps + limiter + counters): {whole:,.0f} decisions/s")
    print(
        f"gate loses {100 * (1 - whole / alone):.1f}% against the limiter alone   (target <= 15%)"
    )


# The metrics' parts, each switched on alone and together, beside neither (first): the label,
# and the gate's `record_stats` (the decision counters) and `record_latency` (the histogram).
METRICS_PARTS = (
    ("none", False, False),
    ("counters only", True, False),
    ("histogram only", False, True),
    ("both", True, True),
)


def interleaved(
    steps: list[Callable[[], int]],
    seconds: float,
    *,
    blocks: int = 24,
    between: Callable[[], Any] | None = None,
) -> list[tuple[float, float, float, float]]:
    """Steps taken in turn, one call of each after the other (each turn starting one step
    further on, so that none always follows the same), each call timed by the clock and by
    this process's CPU: a load that comes and goes falls on every step alike, even over a
    fraction of a second. `seconds` of each in all, in `blocks` (`between` after each). Per
    step: its rate (decisions per second of its calls) and the median over the blocks of its
    rate over the first step's in the same block (the first's own: 1), then the same two per
    CPU second of this process."""
    n = len(steps)
    # Per block, per step: [decisions, seconds, CPU seconds].
    found = [[[0.0, 0.0, 0.0] for _ in steps] for _ in range(blocks)]
    clock, cpu = time.perf_counter, time.process_time
    for block in found:
        turn, ends = 0, clock() + n * seconds / blocks
        while clock() < ends:
            for k in range(n):
                at = (turn + k) % n
                wall_0, cpu_0 = clock(), cpu()
                done = steps[at]()
                cpu_1, wall_1 = cpu(), clock()
                tally = block[at]
                tally[0] += done
                tally[1] += wall_1 - wall_0
                tally[2] += cpu_1 - cpu_0
            turn += 1
        if between is not None:
            between()

    def ratios(k: int, of: int) -> float:
        return statistics.median(
            (b[k][0] / b[k][of]) / (b[0][0] / b[0][of]) for b in found if b[0][of] and b[k][of]
        )

    return [
        (
            sum(b[k][0] for b in found) / sum(b[k][1] for b in found),
            ratios(k, 1),
            sum(b[k][0] for b in found) / sum(b[k][2] for b in found),
            ratios(k, 2),
        )
        for k in range(n)
    ]


# Blocks of the metrics' parts, whose ratios' median each line gives.
METRICS_BLOCKS = 24


def metrics_beside_none(url: str, seconds: float) -> None:
    """What recording the operator's figures costs the gate, each part alone: the same gate
    with neither, the decision counters only (worker/stats.py, by segment, channel and reason),
    the latency histogram only (worker/latency.py), and both, each buffered in the process and
    written to Redis once a second; their calls taken in turn (`interleaved`; `seconds` of each
    in all), one-request calls, then batches of 1,000. Each line: a part's decisions/s and the
    gate's without either, and their ratio (the median of METRICS_BLOCKS blocks'); the same per
    second of this process's CPU, and what that ratio adds to a call in CPU; and the target (of
    the metrics' whole, so of each part alone too). The metrics cost the gate's process CPU
    only, so the ratio by CPU is the lower of the two but for noise (wall = CPU + waiting, and
    (c + w) / (c + w + d) >= c / (c + d)), and the one a machine busy with other work (other
    processes, Redis answering them) blurs least."""
    client = _redis(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()

    def gate(counters: bool, histogram: bool) -> Gate:
        return deciding(
            Gate(
                limiter=limiter,
                policy=PolicyCache.holding(PolicyTable(rules=CLASSIC, classic={}, zones={})),
                index=index,
                suppressions=SuppressionCache.holding(),
                preferences=PreferenceCache.holding({}),
                record_stats=counters,
                record_latency=histogram,
                record_ledger=False,
            )
        )

    gates = [gate(counters, histogram) for _, counters, histogram in METRICS_PARTS]
    pick = random.Random(8)
    counter = iter(range(10**9))

    def step(g: Gate, size: int) -> int:
        n, users = next(counter), pick.sample(range(USERS), size)
        return len(g.check(channel="email", requests=[(u, f"8-{n}-{u}") for u in users]))

    for size, target in ((1, 0.95), (1000, 0.98)):
        found = interleaved(
            [functools.partial(step, g, size) for g in gates],
            seconds,
            blocks=METRICS_BLOCKS,
            between=client.flushdb,
        )
        calls = "one request a call" if size == 1 else "batches of 1,000"
        plain, _, plain_cpu, _ = found[0]
        for (part, _, _), (kept, ratio, kept_cpu, cpu_ratio) in zip(
            METRICS_PARTS[1:], found[1:], strict=True
        ):
            adds = 1e6 * size / plain_cpu * (1 / cpu_ratio - 1)
            print(
                f"gate with the metrics' {part} against none, {calls}: {kept:,.0f} against "
                f"{plain:,.0f} decisions/s, ratio {ratio:.3f}x; per CPU second {kept_cpu:,.0f} "
                f"against {plain_cpu:,.0f}, ratio {cpu_ratio:.3f}x, {adds:+,.1f} us of CPU a "
                f"call   (target >= {target:.2f}x; calls in turn, medians of {METRICS_BLOCKS} blocks)"
            )
    client.flushdb()


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
    client = _redis(url)
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
            policy=PolicyCache.holding(table),
            index=index,
            suppressions=SuppressionCache.holding(),
            preferences=PreferenceCache.holding({}),
            record_stats=True,
            record_ledger=False,
        )

    without, with_quiet = deciding(gate_with(())), deciding(gate_with(quiet))
    rng = random.Random(4)
    counter = iter(range(10**9))
    zones = [ZONES[i % len(ZONES)] for i in range(1000)]

    def step(gate: Gate) -> int:
        n = next(counter)
        requests = [(u, f"q{n}-{u}") for u in rng.sample(range(USERS), 1000)]
        decisions = gate.check(channel="email", requests=requests, time_zones=zones)
        assert decisions[0].reason != Reason.QUIET_HOURS
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


def suppressions_beside_none(seconds: float, suppressed: int) -> None:
    """Gate decisions/s with `suppressed` users on the email list (none of them among the
    gated users: every lookup misses, so both sides ask Redis the same) against an empty list,
    runs alternated; and the Redis calls per batch of each (the list costs none), counted on a
    Redis server of the benchmark's own (its command counts are the server's, every database's)."""
    from bench.servers import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            _suppressions_beside_none(_redis(server.url), seconds, suppressed)
        finally:
            server.stop()


def _suppressions_beside_none(client: redis.Redis, seconds: float, suppressed: int) -> None:
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()
    table = PolicyTable(rules=CLASSIC, classic={}, zones={})
    # Spread over 200M ids beyond the gated users, as opt-outs are over a large user base.
    spread = np.random.default_rng(7).integers(USERS, USERS + 200_000_000, suppressed)
    listed = BitMap64(array.array("Q", np.sort(spread).astype(np.uint64).tobytes()))
    gates = [
        Gate(
            limiter=limiter,
            policy=PolicyCache.holding(table),
            index=index,
            suppressions=SuppressionCache.holding(**lists),
            preferences=PreferenceCache.holding({}),
            record_stats=True,
            record_ledger=False,
        )
        for lists in ({}, {"email": listed})
    ]
    gates = [deciding(gate) for gate in gates]
    rng = random.Random(6)
    counter = iter(range(10**9))

    def step(gate: Gate) -> int:
        n = next(counter)
        requests = [(u, f"s{n}-{u}") for u in rng.sample(range(USERS), 1000)]
        decisions = gate.check(channel="email", requests=requests)
        assert decisions[0].reason != Reason.SUPPRESSED
        return len(decisions)

    def calls() -> Counter[str]:
        return Counter({k: int(v["calls"]) for k, v in client.info("commandstats").items()})

    per_batch = []  # (function calls, commands in all) per batch, each side from an empty Redis
    for gate in gates:
        client.flushdb()
        client.config_resetstat()
        for _ in range(20):
            step(gate)
        counted = calls()
        per_batch.append((counted["cmdstat_fcall"] / 20, counted.total() / 20))
    rounds = 8
    plain, listed_rate, ratio = alternated(
        functools.partial(step, gates[0]),
        functools.partial(step, gates[1]),
        seconds,
        rounds=rounds,
        between=client.flushdb,
    )
    started = time.perf_counter()
    lookups = 200
    probe = [u for u in range(0, USERS, USERS // 5000)][:5000]
    for _ in range(lookups):
        gates[1].suppressions.suppressed("email", probe)
    lookup_us = (time.perf_counter() - started) / lookups * 1e6
    print(
        f"gate with an empty suppression list: {plain:,.0f} decisions/s; with {suppressed:,} "
        f"users suppressed: {listed_rate:,.0f} decisions/s (medians of {rounds} alternated runs)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)")
    print(
        f"  Redis per batch of 1,000, from an empty Redis: {per_batch[0][0]:.1f} function calls "
        f"({per_batch[0][1]:,.0f} commands in all) without the list, {per_batch[1][0]:.1f} "
        f"({per_batch[1][1]:,.0f}) with it; a lookup of 5,000 users against it: {lookup_us:,.0f} us; the list "
        f"of {len(listed):,} takes {len(listed.serialize()):,} bytes serialized"
    )


def _gate_holding(
    limiter: Limiter,
    table: PolicyTable,
    index: SegmentIndex,
    said: dict[int, dict[str, Any]],
    *,
    record_stats: bool = True,
) -> Gate:
    """A gate over `table` and `index` whose people said `said` (user id -> preferences), with
    nobody suppressed and no ledger."""
    from limits.people.preferences import PreferenceCache

    return Gate(
        limiter=limiter,
        policy=PolicyCache.holding(table),
        index=index,
        suppressions=SuppressionCache.holding(),
        preferences=PreferenceCache.holding(said),
        record_stats=record_stats,
        record_ledger=False,
    )


def preferences_beside_none(url: str, seconds: float, share: float = 0.1) -> None:
    """Gate decisions/s of sends about a topic when `share` of the users hold preferences
    (most about other topics and channels, 1 in 10 of them this topic off, 1 in 10 a pause of
    this channel, 1 in 10 their own frequency on this channel) against nobody holding any, runs
    alternated; and a lookup's cost."""
    from limits.engine.topics import TopicView

    client = _redis(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()
    table = PolicyTable(
        rules=CLASSIC, classic={}, zones={},
        topics={"news": TopicView("news", (), "subscribed"),
                "offers": TopicView("offers", (), "unsubscribed")},
    )  # fmt: skip
    rng = np.random.default_rng(11)
    holders = rng.choice(USERS, int(USERS * share), replace=False)
    later = time.time() + 7 * 86_400
    said: dict[int, dict[str, Any]] = {}
    for n, user in enumerate(holders.tolist()):
        kind = n % 10
        if kind == 0:
            said[user] = {"topics": {"news": {"email": False}}}
        elif kind == 1:
            said[user] = {"paused_channels": {"email": later}}
        elif kind == 2:
            said[user] = {"frequency": [{"channel": "email", "window": OWN_WEEK, "limit": 7}]}
        elif kind < 6:
            said[user] = {"topics": {"offers": {"email": True, "push": True}}}
        else:
            said[user] = {"topics": {"news": {"push": False}}, "channels": {"sms": False}}
    gates = [_gate_holding(limiter, table, index, {}), _gate_holding(limiter, table, index, said)]
    plain, held, ratio = gates_alternated(
        gates,
        client,
        seconds,
        seed=12,
        check=lambda gate, requests: gate.check(channel="email", requests=requests, topic="news"),
    )
    probe = list(range(0, USERS, USERS // 5000))[:5000]
    started = time.perf_counter()
    for _ in range(200):
        now_ms = time.time_ns() // 1_000_000
        gates[1].preferences.refusals("email", table.topics["news"], probe, now_ms)
    lookup_us = (time.perf_counter() - started) / 200 * 1e6
    print(
        f"gate with nobody's preferences: {plain:,.0f} decisions/s; with {len(said):,} of "
        f"{USERS:,} users holding some ({share:.0%}; 1 in 10 of them this topic off, 1 in 10 "
        f"this channel paused, 1 in 10 their own frequency on it): {held:,.0f} decisions/s "
        f"(medians of {ROUNDS} alternated runs)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)   (target >= 0.95x)")
    print(f"  a lookup of 5,000 users against them: {lookup_us:,.0f} us")


OWN_WEEK = {"kind": "rolling", "seconds": WEEK_SECONDS}


def studies_beside_none(url: str, seconds: float) -> None:
    """Gate decisions/s with a control group of 5 % and a cap experiment running on the
    `active` segment (two arms of 45 %: its own "3 a week" against "5 a week", replacing its
    rules) against neither, runs alternated."""
    from limits.engine.assignment import HoldoutView
    from limits.engine.table import ArmView, ExperimentView, RuleView

    client = _redis(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()

    def weekly(rule_id: int, limit: int, kind: str) -> RuleView:
        rule = counting_rule(channel="email", seconds=WEEK_SECONDS, limit=limit, name=f"{limit}")
        return RuleView(**{**{f: getattr(rule, f) for f in rule.__slots__}, "id": rule_id,
                           "segment": "active", "kind": kind})  # fmt: skip

    rules = (*CLASSIC, weekly(9, 3, "rule"))
    now_ms = int(time.time() * 1000)
    experiment = ExperimentView(
        id=1, segment="active", salt="bench-experiment", starts_ms=now_ms - 86_400_000,
        ends_ms=now_ms + 30 * 86_400_000, shares=(0.45, 0.45),
        arms=(ArmView("3 a week", "replace", (weekly(-101, 3, "arm"),)),
              ArmView("5 a week", "replace", (weekly(-201, 5, "arm"),))),
    )  # fmt: skip
    group = HoldoutView(0.05, "bench-group", frozenset(), frozenset())
    plain = PolicyTable(rules=rules, classic={}, zones={})
    studied = PolicyTable(
        rules=rules, classic={}, zones={}, holdout=group, experiments=(experiment,)
    )
    gates = [_gate_holding(limiter, t, index, {}) for t in (plain, studied)]
    neither, both, ratio = gates_alternated(
        gates,
        client,
        seconds,
        seed=13,
        check=lambda gate, requests: gate.check(channel="email", requests=requests),
    )
    print(
        f"gate with no control group and no experiment: {neither:,.0f} decisions/s; with a "
        f"control group of 5 % and an experiment of two arms on a sixth of the users: "
        f"{both:,.0f} decisions/s (medians of {ROUNDS} alternated runs)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)   (target >= 0.97x)")


def reservations_beside_none(url: str, seconds: float, jobs: int = 20) -> None:
    """Gate decisions/s of priority-5 sends with `jobs` reserved scheduled jobs holding slots
    (priority 9, starting over the next day, 50,000 users each, overlapping) against none, runs
    alternated; and the bytes the holds take where they are stored (Redis)."""
    from limits.engine.reservations import HeldJob, Holds, holds_decode, holds_encode
    from limits.people.preferences import PreferenceCache

    client = _redis(url)
    client.flushdb()
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()
    table = PolicyTable(rules=CLASSIC, classic={}, zones={})
    rng = np.random.default_rng(21)
    now_ms = int(time.time() * 1000)
    held = [
        (
            HeldJob(n + 1, 9, now_ms + (2 + n) * 3_600_000, "email", f"launch-{n}", ()),
            np.sort(rng.choice(USERS, 50_000, replace=False).astype(np.uint64)),
        )
        for n in range(jobs)
    ]
    blob = holds_encode(held)
    holds = holds_decode(blob)
    client.set("bench:holds", blob)
    stored = client.memory_usage("bench:holds") or 0
    client.delete("bench:holds")
    reserved_sends = sum(int(users.size) for _, users in held)

    def gate(with_holds: Holds) -> Gate:
        return Gate(
            limiter=limiter, policy=PolicyCache.holding(table), index=index,
            suppressions=SuppressionCache.holding(), preferences=PreferenceCache.holding({}),
            holds=with_holds, record_ledger=False,
        )  # fmt: skip

    gates = [gate(Holds()), gate(holds)]
    reasons: Counter[str] = Counter()

    def check(g: Gate, requests: list[tuple[int, str]]) -> list[Any]:
        decisions = g.check(channel="email", requests=requests, priority=5)
        reasons.update(d.reason for d in decisions)
        return decisions

    none, reserved, ratio = gates_alternated(gates, client, seconds, seed=14, check=check)
    print(
        f"gate with no reservation: {none:,.0f} decisions/s; with {jobs} reserved jobs holding "
        f"{reserved_sends:,} sends (a user held by {reserved_sends / USERS:.1f} jobs on "
        f"average): {reserved:,.0f} decisions/s (medians of {ROUNDS} alternated runs)"
    )
    print(f"  ratio {ratio:.3f}x (median of run pairs)   (target >= 0.95x)")
    print(f"  decisions by reason, both gates: {dict(reasons.most_common())}")
    print(
        f"  the holds in Redis: {stored:,} bytes (MEMORY USAGE), "
        f"{stored / reserved_sends:.2f} bytes a reserved send   (target <= 8); and in each "
        f"process {holds.users.nbytes + holds.owners.nbytes:,} bytes"
    )


def own_cap_redis_cpu(url: str, users: int = 50_000, rounds: int = 12) -> None:
    """Redis CPU per decision (INFO commandstats, the function calls' microseconds) when every
    user holds their own frequency on the channel ("at most 7 in any 7 days", a fifth rule
    beside the four classic ones, refusing nobody here) against nobody holding one: the same
    requests on each side, from an empty Redis filled with two sends per user first, sides
    alternated `rounds` times."""

    client = _redis(url)
    limiter = Limiter(client, prefix="bench:")
    index = in_memory_index()
    table = PolicyTable(rules=CLASSIC, classic={}, zones={})
    own = {u: {"frequency": [{"channel": "email", "window": OWN_WEEK, "limit": 7}]}
           for u in range(users)}  # fmt: skip
    gates = [
        _gate_holding(limiter, table, index, {}, record_stats=False),
        _gate_holding(limiter, table, index, own, record_stats=False),
    ]
    now = datetime.now(UTC)

    def side(gate: Gate, seed: int) -> tuple[float, float, int]:
        client.flushdb()
        pick = random.Random(seed)
        batches = [[(u, f"o{n}-{u}") for u in pick.sample(range(users), 1000)] for n in range(150)]
        for n, requests in enumerate(batches[:100]):  # two sends per user in their logs
            gate.check(channel="email", requests=requests, now=now + timedelta(seconds=n))
        client.config_resetstat()
        refused = 0
        for n, requests in enumerate(batches[100:]):
            at = now + timedelta(seconds=100 + n)
            decided = gate.check(channel="email", requests=requests, now=at)
            refused += sum(d.rule is not None and d.rule["kind"] == "person" for d in decided)
        usec = _command_usec([client])
        decisions = 50 * 1000
        return usec["fcall"] / decisions, usec.total() / decisions, refused

    per: tuple[list[float], list[float]] = ([], [])
    whole: tuple[list[float], list[float]] = ([], [])
    refused_own = 0
    for k in range(rounds):
        for found, everything, gate in zip(per, whole, gates, strict=True):
            fcall, total, refused = side(gate, 100 + k)
            found.append(fcall)
            everything.append(total)
            refused_own += refused
    client.flushdb()
    ratios = sorted(b / a for a, b in zip(*per, strict=True))
    ratio = statistics.median(ratios)
    print(
        f"Redis CPU per decision, {users:,} users with two sends each in their logs, 4 rules: "
        f"{statistics.median(per[0]):.2f} us (function calls; "
        f"{statistics.median(whole[0]):.2f} us in all) with nobody's own frequency; "
        f"{statistics.median(per[1]):.2f} us ({statistics.median(whole[1]):.2f} us) with "
        f"everyone's own (a fifth rule; {refused_own:,} refused by it)"
    )
    print(
        f"  ratio {ratio:.3f}x (median of {rounds} alternated pairs; they range from "
        f"{ratios[0]:.3f}x to {ratios[-1]:.3f}x)   (target <= 1.10x)"
    )


def preferences_memory(people: int = 27_000_000, base: int = 270_000_000) -> None:
    """The memory a process holds for `people` of `base` users holding preferences (10 %): half
    of them a topic off on a channel (5 topics, 2 channels), a fifth a topic they must ask for
    switched on, a fifth a channel off, a tenth paused, one in twenty one channel paused, and a
    fifth (some of the others) their own frequency on a channel.
    Bitmaps count their serialized size (CRoaring's in-memory size is about that), pauses
    their arrays."""
    from limits.engine.table import own_rule
    from limits.people.preferences import Pauses, PreferenceCache

    rng = np.random.default_rng(21)
    started = time.perf_counter()
    holders = np.unique(rng.integers(0, base, int(people * 1.06), dtype=np.uint64))[:people]
    rng.shuffle(holders)
    cache = PreferenceCache.holding({})
    n = len(holders)

    def bitmap(ids: Any) -> BitMap64:
        return BitMap64(array.array("Q", np.sort(ids).astype(np.uint64).tobytes()))

    half, fifth, tenth = n // 2, n // 5, n // 10
    offs = holders[:half]
    for k in range(10):
        cache._off[(f"topic-{k // 2}", ("email", "push")[k % 2])] = bitmap(offs[k::10])
    ons = holders[half : half + fifth]
    for k in range(2):
        cache._on[(f"ask-{k}", "email")] = bitmap(ons[k::2])
    channel_off = holders[half + fifth : half + 2 * fifth]
    for k, channel in enumerate(("email", "push", "sms")):
        cache._channel_off[channel] = bitmap(channel_off[k::3])
    later = time.time() + 30 * 86_400
    paused = holders[half + 2 * fifth : half + 2 * fifth + tenth]
    cache._paused = Pauses.built(paused, np.full(len(paused), later))
    one = holders[: n // 20]  # some of them also pause one channel
    cache._paused_channels["push"] = Pauses.built(one, np.full(len(one), later))
    # A fifth also say how often on email: 1, 2 or 3 in any 7 days.
    own = holders[n // 4 : n // 4 + fifth]
    cache._own["email"] = {
        own_rule(channel="email", window=OWN_WEEK, limit=k + 1): bitmap(own[k::3]) for k in range(3)
    }
    built = time.perf_counter() - started
    held = cache.nbytes()
    print(
        f"preferences of {n:,} people of {base:,} users held in a process: {held / 2**20:,.0f} "
        f"MiB, {held / n:.2f} bytes per person holding any   (target <= 8); built in {built:.0f} s"
    )


def _group(pgid: int) -> list[int]:
    """The live processes of a process group (a Celery worker and its pool)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                found.append(int(entry.name))
    return sorted(found)


def _process_figures(pid: int) -> tuple[float, float]:
    """(peak resident memory in MB, CPU seconds so far) of a live process."""
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return peak_kb / 1024, cpu


def _redis_cpu(servers: list[redis.Redis]) -> float:
    """CPU seconds the Redis servers have used, summed."""
    total = 0.0
    for server in servers:
        info = server.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def _hash(client: Any, key: str) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = client.hgetall(key)
    return found


def _command_usec(servers: list[redis.Redis]) -> Counter[str]:
    """Microseconds the Redis servers spent per command so far (INFO commandstats; every
    database), summed."""
    found: Counter[str] = Counter()
    for server in servers:
        for name, v in server.info("commandstats").items():
            found[name.removeprefix("cmdstat_")] += int(v["usec"])
    return found


class _Beats:
    """Beat processes and the upkeep worker, standing in for the drainer process: `poll()` is
    None while they run; `terminate()` and `wait()` stop them all."""

    def __init__(self, beats: list[subprocess.Popen[Any]], upkeep: subprocess.Popen[Any]):
        self.beats, self.upkeep = beats, upkeep
        self.killed: tuple[int | None, float] = (None, 0.0)

    def poll(self) -> int | None:
        running = [b for b in self.beats if b.poll() is None]
        return None if running and self.upkeep.poll() is None else 1

    def terminate(self) -> None:
        for process in (*self.beats, self.upkeep):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)

    def wait(self, timeout: float) -> None:
        for process in (*self.beats, self.upkeep):
            process.wait(timeout=timeout)

    def kill_leader(self, data: Any) -> None:
        """Kill the leading beat (SIGKILL); `led_again` then tells when another leads."""
        first = self._leader(data)
        chosen = next(b for b in self.beats if b.pid == first)
        os.killpg(chosen.pid, 9)
        chosen.wait(timeout=30)
        self.killed = (first, time.perf_counter())

    def led_again(self, data: Any) -> float | None:
        """Seconds from the kill until another beat held the lease, once one does."""
        leader = self._leader(data)
        if leader is None or leader == self.killed[0]:
            return None
        return time.perf_counter() - self.killed[1]

    @staticmethod
    def _leader(data: Any) -> int | None:
        from gatekeeper.beat import lease_key

        token = data.get(lease_key())
        return int(token.split(b":")[1]) if token else None


def upkeep_worker(env: dict[str, str], name: str = "upkeep") -> subprocess.Popen[Any]:
    """A worker on the upkeep queue, as the Procfile runs it (a process group of its own)."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "gatekeeper", "worker", "-Q", "upkeep", "-c", "1",
         "-n", f"{name}@%h", "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip


def _beats(
    python: str, env: dict[str, str], count: int, tmp: Path, stack: contextlib.ExitStack
) -> _Beats:
    """`count` beat processes and a worker on the upkeep queue, as the Procfile runs them."""
    from gatekeeper.beat import lease_key

    url = env["REDIS_URL"]
    on_cluster = env.get("REDIS_CLUSTER") == "true"
    (RedisCluster.from_url(url) if on_cluster else _redis(url)).delete(lease_key())
    beats = []
    for n in range(count):
        (tmp / f"beat{n}").mkdir()
        beat = subprocess.Popen(
            [python, "-m", "celery", "-A", "gatekeeper", "beat", "--loglevel", "WARNING",
             "--pidfile", str(tmp / f"beat{n}" / "beat.pid")],
            cwd=ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        beats.append(beat)
    group = _Beats(beats, upkeep_worker(env))
    stack.callback(lambda: group.wait(60))
    stack.callback(group.terminate)
    return group


def campaign(
    recipients: int,
    *,
    cluster: bool = False,
    postgres: bool = False,
    profile: bool = False,
    stream_out: bool = False,
    beats: int = 0,
    kill_leader: float | None = None,
) -> None:
    """A campaign file of `recipients` through `send_campaign` and 2 worker processes: wall
    time from the file handed over to the last send settled, each process's peak memory, and
    where the time went (worker.timings' steps, Redis CPU).

    `cluster`: the gate's Redis is a 3-master Redis Cluster started on loopback for the run
    (the broker stays on the machine's Redis); Redis CPU is the masters' summed.
    `postgres`: the database is PostgreSQL (a fresh one), and a drainer process drains the
    ledger every 2 s as beat's task does: how far the ledger falls behind during the campaign
    (the age of the oldest undrained entry, sampled every half second) and how long after the
    last send it holds every decision.
    `profile`: one worker process (Celery's solo pool) under cProfile instead of two; the
    functions that took the most of its own time are printed after the figures.
    `stream_out` (with `postgres`): a webhook endpoint is posted the event stream by a process
    delivering every second as beat's runs do, to a local receiver: how long after its
    decision each decision event arrived.
    `beats` (with `postgres`): instead of a drainer process, that many beat processes (one
    leads: gatekeeper/beat.py) and a worker on the upkeep queue, as deployed: the drain is
    beat's task. `kill_leader`: that many seconds into the campaign the leading beat is killed
    (SIGKILL): how long until another leads, and the drain's lag through it."""
    from limits.ledger.stream import stream_key
    from worker.timings import STEPS, timings_key

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        env = campaign_env(tmp, f"sqlite:///{tmp}/bench.sqlite3")
        if postgres:
            from bench.postgres import BENCH_DB, database_made

            env["DATABASE_URL"] = f"{BENCH_DB.rsplit('/', 1)[0]}/gk_bench_campaign"
            database_made(env["DATABASE_URL"], fresh=True)
        broker = _redis(env["CELERY_BROKER_URL"])
        data: Any = _redis(env["REDIS_URL"])
        servers = [data]  # the gate's Redis servers (one also holds the broker's database)
        if cluster:
            from bench.servers import RedisClusterProcesses

            nodes = RedisClusterProcesses(Path(tmp) / "cluster").start()
            stack.callback(nodes.stop)
            env |= {"REDIS_URL": nodes.url, "REDIS_CLUSTER": "true"}
            data = RedisCluster.from_url(nodes.url)
            servers = [redis.Redis(port=node.port, socket_timeout=600) for node in nodes.nodes]
        for db in (*servers, broker):
            db.flushdb()
        python = sys.executable
        demo_seeded(env)
        data.delete(timings_key())  # the demo's own small campaigns
        csv = recipients_file(Path(tmp) / "recipients.csv", recipients)
        profiled = Path(tmp) / "worker.prof"
        pool = ["-P", "solo"] if profile else ["-c", "2"]
        under = [python, "-m", "cProfile", "-o", str(profiled), "-m"] if profile else [python, "-m"]
        worker = subprocess.Popen(
            [*under, "celery", "-A", "gatekeeper", "worker", "-Q", "sends", *pool,
             "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        drainer: Any = None
        if postgres and beats:
            drainer = _beats(python, env, beats, Path(tmp), stack)
        elif postgres:
            from bench.ledger import DRAINER

            drainer = subprocess.Popen(
                [python, "-c", DRAINER], cwd=ROOT,
                env={**env, "DJANGO_SETTINGS_MODULE": "gatekeeper.settings"},
            )  # fmt: skip
            stack.callback(drainer.wait)
            stack.callback(drainer.terminate)  # if the run fails before it is stopped below
        stream = stream_key()
        lags: list[float] = []

        def lag() -> float:
            """Seconds since the oldest entry the drain has not yet taken was appended."""
            first = data.xrange(stream, count=1)
            if not first:
                return 0.0
            appended_ms = int(first[0][0].split(b"-")[0])  # Redis's clock: this machine's
            return max(0.0, time.time() - appended_ms / 1000)

        time.sleep(3)  # the worker's start-up (snapshot loaded, pool forked) is not the campaign's
        data.delete(stream)  # the demo's decisions: Redis's memory is measured without them
        deliverer, receiving = None, None
        if stream_out:  # from here on: the demo's decisions are not the campaign's
            deliverer, receiving = _stream_out(env, stack)
        held_before = _used_memory(servers)
        redis_cpu = _redis_cpu(servers)
        broker_cpu = _redis_cpu([broker])
        before = _command_usec(servers)
        peaks: dict[int, tuple[float, float]] = {}
        try:
            started = time.perf_counter()
            sender = subprocess.Popen(
                [python, "manage.py", "send_campaign", "--channel", "push", "--template", "offer", "--recipients", str(csv)],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            _, status, usage = os.wait4(sender.pid, 0)
            sender.returncode = os.waitstatus_to_exitcode(status)
            if sender.returncode:
                raise SystemExit(f"send_campaign failed: {sender.stderr.read().decode()}")  # type: ignore[union-attr]
            queued = time.perf_counter() - started
            script = (
                "import time;from worker.models import SendJob\n"
                "while SendJob.objects.get(campaign='offer').status != 'done': time.sleep(0.2)\n"
                "job=SendJob.objects.get(campaign='offer');print(job.sent, job.reasons)"
            )
            waiter = subprocess.Popen(
                [python, "manage.py", "shell", "-v", "0", "-c", script],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            failover: float | None = None
            killed = False
            while waiter.poll() is None:
                if kill_leader is not None and failover is None:
                    if killed:
                        failover = drainer.led_again(data)
                    elif time.perf_counter() - started >= kill_leader:
                        drainer.kill_leader(data)
                        killed = True
                for pid in _group(worker.pid):
                    with contextlib.suppress(OSError, StopIteration):
                        peaks[pid] = _process_figures(pid)
                if drainer is not None:
                    lags.append(lag())
                time.sleep(0.5)
            wall = time.perf_counter() - started
            out = waiter.stdout.read() if waiter.stdout else ""
            redis_cpu = _redis_cpu(servers) - redis_cpu
            broker_cpu = _redis_cpu([broker]) - broker_cpu
            for pid in _group(worker.pid):
                with contextlib.suppress(OSError, StopIteration):
                    peaks[pid] = _process_figures(pid)
            # After the campaign's figures: the drain's tail is not the campaign's.
            caught_up, left = 0.0, 0
            if drainer is not None:
                while (left := data.xlen(stream)) and drainer.poll() is None and caught_up < 600:
                    time.sleep(0.2)
                    caught_up = time.perf_counter() - started - wall
                drainer.terminate()  # before the flush below: it would make the stream again
                drainer.wait(timeout=60)
            if deliverer is not None and receiving is not None:
                _caught_up(receiving[0])
                deliverer.terminate()
                deliverer.wait(timeout=60)
        finally:
            os.killpg(worker.pid, 15)
            worker.wait(timeout=60)
        if drainer is not None:
            counted = subprocess.run(
                [python, "manage.py", "shell", "-v", "0", "-c",
                 "from limits.models import LedgerEntry as E;"
                 "print(E.objects.count(), E.objects.exclude(outcome='').count())"],
                cwd=ROOT, env=env, capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
        spent = {k.decode(): float(v) for k, v in _hash(data, timings_key()).items()}
        commands = _command_usec(servers)
        commands.subtract(before)
        memory = _used_memory(servers)
        # What the sends keep in Redis: the ledger's stream drained (deleted here, as a drain
        # leaves it), the broker's database empty by now, the figures' own key gone.
        data.delete(stream, timings_key())
        held = _used_memory(servers) - held_before
        for db in (*servers, broker):
            db.flushdb()  # gigabytes at 10M: not left to the next benchmark
        where = "a 3-master Redis Cluster" if cluster else "one Redis"
        where += ", PostgreSQL" if postgres else ""
        print(
            f"campaign of {recipients:,} push recipients through {'1 worker process under cProfile' if profile else '2 worker processes'} (null dispatcher), {where}: {wall:.1f} s, {recipients / wall:,.0f} recipients/s"
        )
        if beats:
            print(
                f"  {beats} beat processes and an upkeep worker (the drain is beat's task)"
                + (
                    f"; the leading beat killed {kill_leader:.0f} s in, another led "
                    f"{failover:.1f} s later   (target < 30 s)"
                    if failover is not None
                    else ""
                )
            )
        if drainer is not None:
            print(
                f"  ledger drained every 2 s: lag at most {max(lags, default=0):.1f} s, p99 "
                f"{sorted(lags or [0])[int(len(lags) * 0.99)]:.1f} s, median "
                f"{statistics.median(lags or [0]):.1f} s during the campaign   (target < 5 s); "
                + (
                    f"every decision in the ledger {caught_up:.1f} s after the last send; "
                    if not left
                    else f"{left:,} stream entries not drained {caught_up:.0f} s after it; "
                )
                + f"{int(counted[0]):,} rows, {int(counted[1]):,} with their outcome"
            )
        if receiving is not None:
            from bench.stream import _report

            received, arrived = _report(*receiving)
            arrived.sort()
            print(
                f"  the event stream posted to a webhook endpoint (a delivery every second): "
                f"{received:,} events; from decision to the endpoint p50 "
                f"{statistics.median(arrived or [0]):.1f} s, p99 "
                f"{arrived[int(len(arrived) * 0.99)] if arrived else 0:.1f} s, max "
                f"{max(arrived, default=0):.1f} s   (target p99 < 5 s)"
            )
        print(f"  of which send_campaign reading, validating and queueing the file: {queued:.1f} s")
        print(f"  sent and gate reasons: {out.strip()}")
        print(
            f"  at this rate 1M recipients take {1_000_000 / (recipients / wall):.0f} s   (target < 60 s)"
        )
        print(
            f"  at this rate 10M recipients take {10_000_000 / (recipients / wall):.0f} s   (target <= 360 s)"
        )
        print(f"  send_campaign peak memory: {usage.ru_maxrss / 1024:,.0f} MB")
        for pid, (peak, cpu) in sorted(peaks.items()):
            role = "worker parent" if pid == worker.pid else "worker process"
            print(
                f"  {role} {pid}: peak memory {peak:,.0f} MB, CPU {cpu:,.1f} s   (target <= 1 GB)"
            )
        print(
            f"  Redis CPU: {redis_cpu:,.1f} s ({1e6 * redis_cpu / recipients:.1f} us per recipient)"
            + (
                f"; the broker's Redis: {broker_cpu:,.1f} s"
                if cluster
                else " (the broker's database included)"
            )
        )
        top = sorted(commands.items(), key=lambda item: -item[1])[:6]
        print(
            "    by command: "
            + ", ".join(f"{name} {1e-6 * usec:,.1f} s" for name, usec in top if usec > 0)
        )
        print(
            f"  Redis memory at the end: {memory / 2**30:.2f} GiB (logs, chunk records, ledger stream)"
        )
        print(
            f"  Redis memory held per recipient, the ledger's stream drained: "
            f"{held / recipients:.1f} bytes (logs and chunk records; target <= 48)"
        )
        print("  where the time went (wall seconds summed over processes, per recipient):")
        for step in STEPS:
            seconds = spent.get(step, 0.0)
            print(f"    {step:<10} {seconds:8.1f} s  {1e6 * seconds / recipients:6.1f} us")
        # The pool's processes; a solo worker (profile) is its own pool.
        busy = sum(cpu for pid, (_, cpu) in peaks.items() if profile or pid != worker.pid)
        timed = sum(v for k, v in spent.items() if k not in ("reading", "chunking"))
        print(
            f"    worker processes' CPU {busy:,.1f} s against {timed:,.1f} s timed in their steps"
        )
        if profile:
            _profile_print(profiled, recipients)


# Beat's schedule for one webhook endpoint: a delivery run every second (webhooks_deliver_due).
DELIVERER = """
import django, signal, sys, threading, time
django.setup()
from limits.stream.webhooks import webhook_deliver
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
while not stop.is_set():
    started = time.monotonic()
    webhook_deliver(int(sys.argv[1]))
    stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
"""


def _caught_up(port: int, *, quiet: float = 3.0, longest: float = 300.0) -> None:
    """Until the receiver has taken nothing more for `quiet` seconds: the delivery has posted
    everything (the campaign's figures are not cut short of its slowest events)."""
    import requests

    began, last, still = time.monotonic(), -1, time.monotonic()
    while time.monotonic() - began < longest:
        count = int(requests.get(f"http://127.0.0.1:{port}/count", timeout=30).text)
        if count != last:
            last, still = count, time.monotonic()
        elif time.monotonic() - still >= quiet:
            return
        time.sleep(0.5)


def campaign_env(tmp: str, database_url: str) -> dict[str, str]:
    """The environment of a campaign's processes: `database_url`, Redis databases 14 (the gate)
    and 13 (the broker), files under `tmp`, the null push dispatcher."""
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": "redis://127.0.0.1:6379/14",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
        "GATEKEEPER_STORE_URL": f"{tmp}/store",
        "GATEKEEPER_SNAPSHOT_CACHE_DIR": f"{tmp}/cache",
        "MEDIA_ROOT": f"{tmp}/media",
        "GATEKEEPER_DISPATCHERS": '{"push": "null"}',
        "LOG_LEVEL": "WARNING",
    }


def demo_seeded(env: dict[str, str]) -> None:
    """The database of `env` migrated and seeded with the demo (its segments, published), and
    the send logs kept in their groups alone, as on a new install (`make run` does the same)."""
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    for command in (["seed_demo"], ["group_logs", "--force"]):
        subprocess.run(
            [python, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True
        )


def recipients_file(path: Path, recipients: int) -> Path:
    """A campaign file of `recipients` push recipients, one send per user: ids past the demo's
    200,000 listed users fall in the default segment."""
    with path.open("w") as lines:
        for start in range(0, recipients, 100_000):
            stop = min(recipients, start + 100_000)
            lines.write("".join(f"{i},token-{i}\n" for i in range(start, stop)))
    return path


def endpoint_made(env: dict[str, str], port: int, campaigns: tuple[str, ...] = ()) -> int:
    """A webhook endpoint for a local receiver on `port`, made in the database of `env`
    (`campaigns`: its filter): its id."""
    made = subprocess.run(
        [sys.executable, "manage.py", "shell", "-v", "0", "-c",
         "from limits.stream.webhooks import WebhookFields, webhook_create;"
         f"print(webhook_create(fields=WebhookFields(url='http://127.0.0.1:{port}/in', "
         f"campaigns={campaigns!r})).pk)"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(made.stdout.strip())


def _stream_out(env: dict[str, str], stack: contextlib.ExitStack) -> tuple[Any, Any]:
    """A local receiver (bench/stream.py's), an endpoint for it made in the campaign's database,
    and a process delivering to it every second: (the deliverer, what _report reads)."""
    from bench.stream import receiver_started

    port, results = receiver_started(stack)
    deliverer = subprocess.Popen(
        [sys.executable, "-c", DELIVERER, str(endpoint_made(env, port))], cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "gatekeeper.settings"},
    )  # fmt: skip
    stack.callback(deliverer.wait)
    stack.callback(deliverer.terminate)
    return deliverer, (port, results)


def _used_memory(servers: list[Any]) -> int:
    """Bytes the Redis servers hold (INFO memory's used_memory, summed)."""
    return sum(int(server.info("memory")["used_memory"]) for server in servers)


def _profile_print(path: Path, recipients: int) -> None:
    """The profiled worker's functions by their own time, per recipient."""
    import pstats

    stats = cast(Any, pstats.Stats(str(path))).stats
    rows = sorted(stats.items(), key=lambda item: -item[1][2])
    print("  the worker's own time by function (cProfile; microseconds per recipient, calls):")
    for (file, line, name), (_, calls, own, _cumulative, _) in rows[:25]:
        where = file.split("site-packages/")[-1].removeprefix(str(ROOT) + "/")
        print(f"    {1e6 * own / recipients:7.2f} us  {calls:>9,}  {where}:{line}({name})")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench gate")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--recipients", type=int, default=1_000_000)
    parser.add_argument("--suppressed", type=int, default=1_000_000)
    parser.add_argument(
        "--only",
        choices=[
            "limiter",
            "quiet-hours",
            "suppressions",
            "preferences",
            "preference-memory",
            "own-cap",
            "studies",
            "reservations",
            "metrics",
        ],
        help="run only this part (with its figures)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only the campaign, one worker process under cProfile: where its time goes",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="only the campaign, on PostgreSQL, the ledger drained as it goes (its lag)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="with --postgres: the event stream posted to a webhook endpoint as it goes (its lag)",
    )
    parser.add_argument(
        "--beats",
        type=int,
        default=0,
        help="with --postgres: the drain run by this many beat processes and an upkeep worker",
    )
    parser.add_argument(
        "--kill-leader",
        type=float,
        help="with --beats: kill the leading beat this many seconds into the campaign",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="only the campaign, its gate's Redis a 3-master cluster started on loopback",
    )
    parser.add_argument(
        "--campaign", action="store_true", help="only the campaign, on one Redis and SQLite"
    )
    args = parser.parse_args(argv)
    if args.cluster or args.postgres or args.profile or args.campaign:
        campaign(
            args.recipients, cluster=args.cluster, postgres=args.postgres, profile=args.profile,
            stream_out=args.stream, beats=args.beats, kill_leader=args.kill_leader,
        )  # fmt: skip
        return
    if args.only == "limiter":
        gate_beside_limiter(args.redis_url, args.seconds)
        return
    if args.only == "quiet-hours":
        quiet_hours_beside_none(args.redis_url, 2 * args.seconds)
        return
    if args.only == "suppressions":
        suppressions_beside_none(2 * args.seconds, args.suppressed)
        return
    if args.only == "preferences":
        preferences_beside_none(args.redis_url, 2 * args.seconds)
        return
    if args.only == "preference-memory":
        preferences_memory()
        return
    if args.only == "own-cap":
        own_cap_redis_cpu(args.redis_url)
        return
    if args.only == "studies":
        studies_beside_none(args.redis_url, 2 * args.seconds)
        return
    if args.only == "reservations":
        reservations_beside_none(args.redis_url, 2 * args.seconds)
        return
    if args.only == "metrics":
        metrics_beside_none(args.redis_url, 2 * args.seconds)
        return
    gate_beside_limiter(args.redis_url, args.seconds)
    quiet_hours_beside_none(args.redis_url, 2 * args.seconds)
    suppressions_beside_none(2 * args.seconds, args.suppressed)
    preferences_beside_none(args.redis_url, 2 * args.seconds)
    studies_beside_none(args.redis_url, 2 * args.seconds)
    reservations_beside_none(args.redis_url, 2 * args.seconds)
    metrics_beside_none(args.redis_url, 2 * args.seconds)
    preferences_memory()
    own_cap_redis_cpu(args.redis_url)
    campaign(args.recipients)
