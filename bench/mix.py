"""The limiter on a realistic mix of users, side by side with the seed's script in one run.

python -m bench limiter -- --mix [--users 1000000] [--designs]

Each contender has a Redis server of its own, so that INFO speaks of it alone:
- the gate's limiter (limits/engine/limiter.py, the Lua library), the classic daily and weekly
  caps on one channel;
- the seed's one-sorted-set script (bench/limiter.py, SEED_SCRIPT: ZREMRANGEBYSCORE, ZCOUNT,
  ZADD, EXPIRE; member = time and message id), one EVALSHA per request, pipelined.

Two workloads, each on empty servers, fed to both batch by batch in turn:
1. the mix: users (ids 1..N, as a user table hands them out) whose last 7 days hold 1, 2, 3, 5,
   10 and 30 sends in the shares 40, 20, 15, 12, 10 and 3 %, the sends in time order, in batches
   of 1,000 that each share a time;
2. a blast: one send to each of the N users, in a random order.

Printed for each: Redis bytes per user (INFO used_memory, everything in: the difference from
the empty server) and Redis CPU per decision (INFO commandstats: the usec of the function or
script calls themselves, which include the commands they run), for both and as a ratio.
"""

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from bench.limiter import BASE_MS, BATCH, RETENTION_MS, SEED_SCRIPT, used_memory
from bench.servers import RedisServer
from limits.engine.limiter import Limiter
from limits.engine.table import counting_rule, encode
from limits.engine.transport import LIMITER_LIBRARY
from limits.engine.upkeep import logs_group
from limits.reasons import Reason

# (sends in the user's last 7 days, share of users in %): ../shared/DESIGN.md, "Costs to beat"
MIX = ((1, 40), (2, 20), (3, 15), (5, 12), (10, 10), (30, 3))
WEEK_MS = 7 * 86_400_000
# Caps that admit every send of the mix: a user's 30 sends may fall 12 in one day.
DAILY, WEEKLY = 30, 50
CHANNEL = "email"
TOP_LEVEL = ("fcall", "fcall_ro", "evalsha", "eval")

Batches = Iterator[tuple[int, list[tuple[int, str]]]]
"""Per batch: its time (ms) and its (user, message id) requests."""


def mix_counts(users: int, rng: np.random.Generator) -> np.ndarray:
    """Each user's sends (index = id - 1), in the mix's exact shares, dealt at random."""
    counts = np.empty(users, dtype=np.int64)
    start = 0
    for sends, share in MIX:
        end = users if sends == MIX[-1][0] else start + users * share // 100
        counts[start:end] = sends
        start = end
    return rng.permutation(counts)


def mix_batches(users: int) -> tuple[int, Callable[[], Batches]]:
    """The mix's sends in time order: (how many, their batches). Every user's sends fall at
    random places in the week's order; batch b is at BASE_MS + b/batches of the week."""
    rng = np.random.default_rng(49)
    counts = mix_counts(users, rng)
    order = rng.permutation(np.repeat(np.arange(1, users + 1, dtype=np.int64), counts))
    total = len(order)
    batches = -(-total // BATCH)

    def generate() -> Batches:
        for b in range(batches):
            first = b * BATCH
            part = order[first : first + BATCH].tolist()
            yield (
                BASE_MS + b * WEEK_MS // batches,
                [(user, f"m{first + k}") for k, user in enumerate(part)],
            )

    return total, generate


def blast_batches(users: int) -> tuple[int, Callable[[], Batches]]:
    order = np.random.default_rng(50).permutation(np.arange(1, users + 1, dtype=np.int64))

    def generate() -> Batches:
        for first in range(0, users, BATCH):
            part = order[first : first + BATCH].tolist()
            yield BASE_MS + first, [(user, f"b:{user}") for user in part]

    return users, generate


def function_usec(client: redis.Redis) -> int:
    """The usec Redis spent in function and script calls, the commands they ran included."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in TOP_LEVEL)


@dataclass
class Contender:
    name: str
    client: redis.Redis
    memory0: int = 0
    usec0: int = 0
    recorded: int = 0

    def reset(self) -> None:
        self.client.flushall()
        self.client.config_resetstat()
        self.prepare()
        self.memory0, self.usec0, self.recorded = used_memory(self.client), 0, 0

    def prepare(self) -> None:
        raise NotImplementedError

    def decide(self, now_ms: int, batch: list[tuple[int, str]]) -> None:
        raise NotImplementedError

    def bytes_per_user(self, users: int) -> float:
        return (used_memory(self.client) - self.memory0) / users

    def usec_per_decision(self, decisions: int) -> float:
        return (function_usec(self.client) - self.usec0) / decisions


class Gate(Contender):
    moved = True  # group_logs has run (as on a new install): buckets are read no more

    def prepare(self) -> None:
        LIMITER_LIBRARY.load(self.client)
        self.limiter = Limiter(self.client, prefix="bench:")
        if self.moved:
            for _ in logs_group(self.limiter, retention_ms=RETENTION_MS):
                pass
        rules = [
            counting_rule(channel=CHANNEL, seconds=86_400, limit=DAILY),
            counting_rule(channel=CHANNEL, seconds=604_800, limit=WEEKLY),
        ]
        self.rules = encode(rules, priority=5, zone="UTC", now_ms=BASE_MS)

    def decide(self, now_ms: int, batch: list[tuple[int, str]]) -> None:
        decisions = self.limiter.acquire(
            CHANNEL,
            batch,
            self.rules,
            campaign=f"c{now_ms // 3_600_000 % 24}",
            retention_ms=RETENTION_MS,
            now_ms=now_ms,
        )
        self.recorded += sum(1 for d in decisions if d.reason == Reason.ALLOWED)


class Seed(Contender):
    def prepare(self) -> None:
        self.sha = self.client.script_load(SEED_SCRIPT)

    def decide(self, now_ms: int, batch: list[tuple[int, str]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for user, message in batch:
            key = f"seed:{{u:{user}}}:{CHANNEL}"
            pipe.evalsha(self.sha, 1, key, now_ms, message, DAILY, WEEKLY)
        self.recorded += sum(pipe.execute())


def compare(
    title: str, users: int, work: tuple[int, Callable[[], Batches]], both: list[Contender]
) -> None:
    decisions, batches = work
    print(f"{title}: {users:,} users, {decisions:,} sends, batches of {BATCH:,}")
    for contender in both:
        contender.reset()
    started = shown = time.monotonic()
    for done, (now_ms, batch) in enumerate(batches(), start=1):
        for contender in both:
            contender.decide(now_ms, batch)
        if time.monotonic() - shown > 30:
            shown = time.monotonic()
            print(f"  ... {done * BATCH / decisions:.0%} after {shown - started:.0f} s", flush=True)
    for contender in both:
        if contender.recorded != decisions:
            raise RuntimeError(f"{contender.name} recorded {contender.recorded} of {decisions}")
    gate, seed = both
    g_bytes, s_bytes = gate.bytes_per_user(users), seed.bytes_per_user(users)
    g_cpu, s_cpu = gate.usec_per_decision(decisions), seed.usec_per_decision(decisions)
    print(
        f"  Redis bytes per user: {g_bytes:.1f} against the seed's {s_bytes:.1f}, "
        f"ratio {g_bytes / s_bytes:.2f}x"
    )
    print(
        f"  Redis CPU per decision: {g_cpu:.2f} us against the seed's {s_cpu:.2f} us, "
        f"ratio {g_cpu / s_cpu:.2f}x"
    )


def main(users: int, designs: bool = False, moved: bool = True) -> None:
    if users < 1:
        raise SystemExit("bench limiter: --users must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        servers = [RedisServer(Path(tmp)).start(), RedisServer(Path(tmp)).start()]
        try:
            gate = Gate("the gate", redis.Redis.from_url(servers[0].url))
            gate.moved = moved
            print(
                "(the gate's logs in their groups, "
                + ("group_logs run: buckets read no more)" if moved else "buckets still read)")
            )
            seed = Seed("the seed's script", redis.Redis.from_url(servers[1].url))
            version = gate.client.info("server")["redis_version"]
            print(f"(two Redis {version} servers of the benchmark's own: the gate's, the seed's)")
            shares = "/".join(str(share) for _, share in MIX)
            sends = "/".join(str(n) for n, _ in MIX)
            compare(
                f"The mix ({sends} sends in 7 days: {shares} % of users; targets: bytes <= 0.5x, "
                "CPU <= 0.8x)",
                users,
                mix_batches(users),
                [gate, seed],
            )
            if designs:
                from bench import designs as containers

                containers.run(gate.client, "bench:", users)
            compare(
                "One send per user (targets: bytes <= 48 per user, CPU <= 0.8x)",
                users,
                blast_batches(users),
                [gate, seed],
            )
        finally:
            for server in servers:
                server.stop()
