"""The limiter's costs, side by side with their anchors, measured in one run.

python -m bench limiter [-- --quick --seconds 5]
python -m bench limiter -- --mix [--users 1000000] [--designs]

1. Redis cost against the seed's script (seeds/002: one sorted set per user and channel;
   ZREMRANGEBYSCORE, ZCOUNT, ZADD, EXPIRE; member = time and message id; one EVALSHA per
   user, pipelined), on the same users and sends with the classic daily and weekly caps: CPU per
   decision (INFO cpu) and memory per recorded send (INFO used_memory). Both run on a Redis
   server of the benchmark's own, so nothing else is counted; CPU is measured three times,
   alternating, and the median ratio printed.
2. 10 rules applying to every request against 1 rule, the same way.
3. One process's decisions/s (batches of 1,000) against Redis's own bulk client streaming the
   same function, one request per call (redis-cli --pipe; see pipe_ceiling for why not
   redis-benchmark); and one-request latency.

With `--mix`, instead: the realistic mix (../shared/DESIGN.md, "Costs to beat"). 1M users whose
last 7 days hold 1, 2, 3, 5, 10 and 30 sends in the shares 40, 20, 15, 12, 10 and 3 %, written in
time order by the gate and by the seed's script, each in a Redis server of its own, batch by
batch in turn; then a one-send-per-user blast over as many users, the same way. Printed for
both: Redis bytes per user (INFO used_memory, everything in: the difference from the empty
server) and Redis CPU per decision (INFO commandstats: the calls of the function or script
themselves, which include the commands they run).
"""

import argparse
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import redis
from hiredis import pack_command

from bench.servers import RedisServer
from limits.engine import log
from limits.engine.limiter import Limiter
from limits.engine.table import RuleSet, RuleView, counting_rule, encode
from limits.engine.transport import LIMITER_LIBRARY
from limits.reasons import Reason

BASE_MS = 1_780_000_000_000
SPAN_MS = 6 * 86_400_000  # a workload's sends are spread over 6 days: all inside the week
DAILY, WEEKLY = 10, 50  # caps that admit every send of these workloads
RETENTION_MS = 8 * 86_400_000
BATCH = 1_000
THROUGHPUT_USERS = 1_000_000

# The seed's algorithm with the classic daily and weekly caps: its ZCOUNT once per window.
SEED_SCRIPT = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 604800000)
local daily = redis.call('ZCOUNT', key, '(' .. (now - 86400000), '+inf')
local weekly = redis.call('ZCOUNT', key, '(' .. (now - 604800000), '+inf')
if daily < tonumber(ARGV[3]) and weekly < tonumber(ARGV[4]) then
  redis.call('ZADD', key, now, now .. ':' .. ARGV[2])
  redis.call('EXPIRE', key, 691200)
  return 1
end
return 0
"""

Workload = Iterator[tuple[int, str, list[tuple[int, str]]]]
"""Per batch: the time (ms), the channel, and (user, message id) requests."""


def workload(users: int, sends: int, channels: bool) -> Workload:
    """The same sends for every contender: `sends` rounds over `users` users (ids 1..users, as a
    user table hands them out), each round in a random order, in batches; with `channels`, each
    send goes by email or push at random."""
    rng = random.Random(11)
    ids = list(range(1, users + 1))
    for r in range(sends):
        now = BASE_MS + r * (SPAN_MS // sends)
        order = ids[:]
        rng.shuffle(order)
        for k in range(0, users, BATCH):
            batch = [(u, f"c{r}:{u}") for u in order[k : k + BATCH]]
            if not channels:
                yield now + k, "email", batch
                continue
            email = [req for req in batch if rng.random() < 0.5]
            chosen = set(email)
            yield now + k, "email", email
            yield now + k, "push", [req for req in batch if req not in chosen]


def classic_rules(channel: str) -> RuleSet:
    rules = [
        counting_rule(channel=channel, seconds=86_400, limit=DAILY),
        counting_rule(channel=channel, seconds=604_800, limit=WEEKLY),
    ]
    return encode(rules, priority=5, zone="UTC", now_ms=BASE_MS)


def ten_rules(channel: str) -> RuleSet:
    """Ten rules of every kind, all applying to every request, none full in these workloads."""
    rules: list[RuleView] = [
        counting_rule(channel=channel, seconds=86_400, limit=DAILY),
        counting_rule(channel=channel, seconds=604_800, limit=WEEKLY),
        counting_rule(channel="all", seconds=86_400, limit=DAILY),
        counting_rule(channel="all", seconds=604_800, limit=WEEKLY),
        counting_rule(channel=channel, seconds=4 * 3600, limit=5),
        counting_rule(channel=channel, seconds=3 * 86_400, limit=30),
        counting_rule(channel=channel, seconds=30 * 86_400, limit=100),
    ]
    base = rules[0]
    rules.append(
        RuleView(**{**_fields(base), "id": 8, "match": "campaign", "window_seconds": 86_400})
    )
    rules.append(
        RuleView(**{**_fields(base), "id": 9, "window_kind": "calendar", "window_unit": "day"})
    )
    rules.append(
        RuleView(**{**_fields(base), "id": 10, "match": "tag", "tag": "promo", "limit": 100})
    )
    return encode(rules, priority=5, zone="Europe/London", now_ms=BASE_MS)


def _fields(rule: RuleView) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in RuleView.__slots__}


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def run_seed(client: redis.Redis, users: int, sends: int, channels: bool) -> int:
    sha = client.script_load(SEED_SCRIPT)
    admitted = 0
    for now, channel, batch in workload(users, sends, channels):
        pipe = client.pipeline(transaction=False)
        for user, message in batch:
            pipe.evalsha(sha, 1, f"seed:{{u:{user}}}:{channel}", now, message, DAILY, WEEKLY)
        admitted += sum(pipe.execute())
    return admitted


def run_log(
    client: redis.Redis,
    users: int,
    sends: int,
    channels: bool,
    rules: Callable[[str], RuleSet],
    tags: tuple[str, ...] = (),
) -> int:
    limiter = Limiter(client, prefix="bench:")
    sets = {channel: rules(channel) for channel in ("email", "push")}
    admitted = 0
    for now_ms, channel, batch in workload(users, sends, channels):
        campaign = batch[0][1].partition(":")[0] if batch else ""
        decisions = limiter.acquire(
            channel,
            batch,
            sets[channel],
            campaign=campaign,
            tags=tags,
            retention_ms=RETENTION_MS,
            now_ms=now_ms,
        )
        admitted += sum(1 for d in decisions if d.reason == Reason.ALLOWED)
    return admitted


def measure(
    client: redis.Redis, run: Callable[[], int], decisions: int
) -> tuple[float, float, int]:
    """(CPU us per decision, bytes per recorded send, recorded) of one run on an empty server."""
    client.flushall()
    LIMITER_LIBRARY.load(client)
    client.script_flush()
    cpu0, memory0 = cpu_seconds(client), used_memory(client)
    recorded = run()
    cpu, memory = cpu_seconds(client) - cpu0, used_memory(client) - memory0
    return cpu / decisions * 1e6, memory / max(recorded, 1), recorded


def against_seed(client: redis.Redis, repeats: int) -> None:
    print("Redis cost per decision against the seed's script (classic daily and weekly caps):")
    for users, sends in ((100_000, 5), (20_000, 30)):
        for channels in (False, True):
            decisions = users * sends
            seed_cpu, log_cpu = [], []
            seed_mem = log_mem = 0.0
            for _ in range(repeats):
                s_cpu, s_mem, s_rec = measure(
                    client, partial(run_seed, client, users, sends, channels), decisions
                )
                l_cpu, l_mem, l_rec = measure(
                    client,
                    partial(run_log, client, users, sends, channels, classic_rules),
                    decisions,
                )
                assert s_rec == l_rec == decisions, (s_rec, l_rec)
                seed_cpu.append(s_cpu)
                log_cpu.append(l_cpu)
                seed_mem, log_mem = s_mem, l_mem
            ratios = sorted(mine / seed for mine, seed in zip(log_cpu, seed_cpu, strict=True))
            target_cpu, target_mem = (0.6, 40) if sends == 5 else (0.8, 30)
            spread = "email and push" if channels else "one channel"
            label = f"{users // 1000}k users x {sends} sends, {spread}"
            print(
                f"  {label}: CPU {statistics.median(log_cpu):.2f} us against "
                f"{statistics.median(seed_cpu):.2f} us, ratio {statistics.median(ratios):.2f}x "
                f"(runs {', '.join(f'{r:.2f}' for r in ratios)}; target <= {target_cpu}x); "
                f"memory {log_mem:.1f} bytes per send against {seed_mem:.1f} "
                f"(target <= {target_mem})"
            )


def rules_scaling(client: redis.Redis, repeats: int) -> None:
    users, sends = 100_000, 5
    one = lambda channel: encode(  # noqa: E731
        [counting_rule(channel=channel, seconds=86_400, limit=DAILY)],
        priority=5,
        zone="UTC",
        now_ms=BASE_MS,
    )
    decisions = users * sends
    single, ten = [], []
    for _ in range(repeats):
        run_one = partial(run_log, client, users, sends, False, one)
        run_ten = partial(run_log, client, users, sends, False, ten_rules, tags=("promo",))
        single.append(measure(client, run_one, decisions)[0])
        ten.append(measure(client, run_ten, decisions)[0])
    ratio = statistics.median(t / s for t, s in zip(ten, single, strict=True))
    print(
        f"10 rules applying to every request against 1 ({users // 1000}k users x {sends} sends): "
        f"{statistics.median(ten):.2f} us against {statistics.median(single):.2f} us "
        f"per decision, ratio {ratio:.2f}x   (target <= 1.5x)"
    )


def pipe_ceiling(server: RedisServer, requests: int) -> float:
    """Redis's own bulk client (`redis-cli --pipe`) streaming gk_acquire calls of one random user
    each, as fast as the server answers them: the server's ceiling for the function.

    (redis-benchmark cannot be the anchor: it passes arguments as C strings, and `-x` cuts its
    stdin argument at the first NUL byte, while the function's arguments are binary.)"""
    rules = classic_rules("email")
    head = b"".join(
        (log.short_hash("c0"), b"\x00", b"\x01", bytes((len(rules.rules),)), rules.records)
    )
    rng = random.Random(5)
    stream = bytearray()
    acquire = LIMITER_LIBRARY.function("gk_acquire")
    for i in range(requests):
        user = rng.randrange(THROUGHPUT_USERS)
        payload = head + b"\x00\x01" + log.bucket_field(user) + log.message_hash(f"p{i}") + b"\x01"
        key = log.bucket_key("bench:", user)
        call = ("FCALL", acquire, 1, key, "", "0", "email", 5, RETENTION_MS, payload)
        stream += pack_command(call)  # type: ignore[arg-type]
    cli = shutil.which("redis-cli") or "redis-cli"
    started = time.perf_counter()
    out = subprocess.run(
        [cli, "-p", str(server.port), "--pipe"],
        input=bytes(stream),
        capture_output=True,
        check=True,
    ).stdout.decode()
    elapsed = time.perf_counter() - started
    if f"errors: 0, replies: {requests}" not in out:
        raise RuntimeError(f"redis-cli --pipe: {out.strip()}")
    return requests / elapsed


def throughput(server: RedisServer, client: redis.Redis, seconds: float) -> None:
    client.flushall()
    LIMITER_LIBRARY.load(client)
    limiter = Limiter(client, prefix="bench:")
    rules = classic_rules("email")
    rng = random.Random(7)
    decided, started, batch_no = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        batch_no += 1
        users = rng.sample(range(THROUGHPUT_USERS), BATCH)
        decisions = limiter.acquire("email", [(u, f"b{batch_no}-{u}") for u in users], rules)
        decided += len(decisions)
    batched = decided / (time.perf_counter() - started)
    assert all(d.reason != Reason.UNAVAILABLE for d in decisions), "Redis did not answer"
    client.flushall()
    LIMITER_LIBRARY.load(client)
    top = pipe_ceiling(server, requests=max(int(batched * 3), 100_000))
    latencies = []
    for i in range(3000):
        t0 = time.perf_counter()
        limiter.acquire("email", [(rng.randrange(THROUGHPUT_USERS), f"one-{i}")], rules)
        latencies.append(time.perf_counter() - t0)
    latencies.sort()
    print(
        f"acquire, batches of {BATCH:,} from {THROUGHPUT_USERS:,} users, one process: "
        f"{batched:,.0f} decisions/s"
    )
    print(f"redis-cli --pipe, the same function, one request per call: {top:,.0f} decisions/s")
    print(f"ratio batched / redis-cli --pipe: {batched / top:.2f}x   (target >= 1.0x)")
    print(
        f"one-request acquire latency: p50 {latencies[1500] * 1e3:.3f} ms, "
        f"p99 {latencies[2969] * 1e3:.3f} ms"
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench limiter")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="one run of each, not three")
    parser.add_argument("--mix", action="store_true", help="the realistic mix, against the seed")
    parser.add_argument("--users", type=int, default=1_000_000, help="with --mix: how many")
    parser.add_argument(
        "--designs", action="store_true", help="with --mix: the same logs in other containers"
    )
    parser.add_argument(
        "--unmoved",
        action="store_true",
        help="with --mix: the gate before group_logs has run (buckets still read)",
    )
    args = parser.parse_args(argv)
    if args.mix:
        from bench import mix

        mix.main(args.users, args.designs, moved=not args.unmoved)
        return
    repeats = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            client = redis.Redis.from_url(server.url)
            version = client.info("server")["redis_version"]
            print(f"(a Redis {version} server of the benchmark's own, on 127.0.0.1:{server.port})")
            against_seed(client, repeats)
            rules_scaling(client, repeats)
            throughput(server, client, args.seconds)
        finally:
            server.stop()
