"""Chaos under a blast: one campaign sent as deployed, faults in turn while it sends, and what
came of it. A report, not a test.

make bench BENCH_ARGS="chaos [-- --recipients 1000000 --rate 7000 --every 20]"

The campaign (`send_campaign`, a file of `--recipients` push recipients, one send each) runs on
a PostgreSQL server of its own (so that it can be restarted) and a Redis Cluster of 3 primaries,
each with a replica, started on loopback; the broker stays on the machine's Redis (database 13).
Two send workers (a process each), the upkeep worker, two beats (one leads: gatekeeper/beat.py)
and a webhook endpoint posted the event stream by beat's delivery runs, as deployed. The
dispatcher writes every send it is handed to a file (tests/support/dispatch_log.py), throttled
to `--rate` sends a second, so that the blast lasts long enough for every fault.

From the first send on, every `--every` seconds, in turn: a primary SIGKILLed (its replica takes
over; it comes back as a replica), `CLUSTER FAILOVER TAKEOVER` on a replica, PostgreSQL
restarted (fast: every connection dropped), a send worker SIGKILLed (started again, as systemd
would), the leading beat SIGKILLed, the upkeep worker SIGKILLed (started again). A prober asks
the gate's Redis (through the limiter), PostgreSQL and the dispatch file ten times a second.

Printed: lost, doubled, the job's counts against its recipients, the ledger against the sends,
the stream against the ledger, and each fault's window: how long the gate answered
`unavailable`, PostgreSQL refused connections, and the sends stood still.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests
from redis.cluster import RedisCluster

from bench.gate import (
    CLASSIC,
    _Beats,
    _beats,
    _caught_up,
    _redis,
    demo_seeded,
    endpoint_made,
    recipients_file,
    upkeep_worker,
)
from bench.postgres import ROOT
from bench.servers import PostgresServer, RedisClusterProcesses, poll
from limits.engine.limiter import Limiter
from limits.engine.table import encode
from limits.reasons import Reason

BROKER_URL = "redis://127.0.0.1:6379/13"
CAMPAIGN = "chaos"
PROBE_USERS = [10**9 + k * 257 for k in range(12)]  # buckets on every primary
FILE_DISPATCHER = "tests.support.dispatch_log.FileDispatcher"


@dataclass
class Probes:
    """What the prober saw, as (monotonic time, value) samples."""

    gate: list[tuple[float, bool]] = field(default_factory=list)  # answered (not unavailable)
    database: list[tuple[float, bool]] = field(default_factory=list)  # took a connection
    sent: list[tuple[float, int]] = field(default_factory=list)  # bytes in the dispatch file
    stop: threading.Event = field(default_factory=threading.Event)


def _probe(probes: Probes, cluster_url: str, database_url: str, dispatched: Path) -> None:
    client = RedisCluster.from_url(cluster_url, socket_timeout=1, socket_connect_timeout=1)
    limiter = Limiter(client, prefix="chaos-probe:")
    rules = encode(list(CLASSIC), priority=5, zone="UTC", now_ms=0)
    n = 0
    while not probes.stop.wait(0.1):
        n += 1
        now = time.monotonic()
        try:
            decisions = limiter.acquire("email", [(u, f"p{n}-{u}") for u in PROBE_USERS], rules)
            answered = all(d.reason != Reason.UNAVAILABLE for d in decisions)
        except Exception:
            answered = False
        probes.gate.append((now, answered))
        try:
            with psycopg.connect(database_url, connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            probes.database.append((now, True))
        except psycopg.Error:
            probes.database.append((now, False))
        probes.sent.append((now, dispatched.stat().st_size if dispatched.exists() else 0))


def _job(database_url: str) -> tuple[str, int, int] | None:
    """The campaign's job: (status, recipients, recipients settled), None before it exists or
    while the database is away."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(database_url, connect_timeout=1) as c:
        row = c.execute(
            "SELECT status, total, sent + failed + capped + ambiguous + duplicate + invalid"
            " + expired + cancelled FROM worker_sendjob WHERE campaign = %s",
            [CAMPAIGN],
        ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))
    return None


class Deployment:
    """The processes of one Gatekeeper: send workers, beats and the upkeep worker."""

    def __init__(self, env: dict[str, str], tmp: Path, stack: contextlib.ExitStack) -> None:
        self.env, self.tmp, self.stack = env, tmp, stack
        self.workers = [self.worker(n) for n in range(2)]
        self.beats: _Beats = _beats(sys.executable, env, 2, tmp, stack)
        self.started = 2

    def worker(self, n: int) -> subprocess.Popen[Any]:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "gatekeeper", "worker", "-Q", "sends", "-c", "1",
             "-n", f"sends{n}@%h", "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=self.env, start_new_session=True,
        )  # fmt: skip
        self.stack.callback(_stopped, process)
        return process

    def kill_worker(self) -> None:
        os.killpg(self.workers[0].pid, signal.SIGKILL)
        self.workers[0].wait(timeout=30)
        self.started += 1
        self.workers[0] = self.worker(self.started)  # as systemd's Restart= would

    def kill_upkeep(self) -> None:
        os.killpg(self.beats.upkeep.pid, signal.SIGKILL)
        self.beats.upkeep.wait(timeout=30)
        self.beats.upkeep = upkeep_worker(self.env, "upkeep2")


def _stopped(process: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=60)


def _faults(
    nodes: RedisClusterProcesses, pg: PostgresServer, deployment: Deployment, data: Any
) -> list[tuple[str, Callable[[], str]]]:
    """Each fault: its name and what does it (returning what it noted)."""

    def kill_primary() -> str:
        primary, replica = nodes.primary_and_replica()
        primary.kill()
        began = time.monotonic()
        with _client(replica.port) as client:
            poll("the replica promoted", lambda: client.info("replication")["role"] == "master")
        promoted = time.monotonic() - began
        primary.start()  # back, as its replica's replica
        nodes.wait_settled()
        return (
            f"replica promoted {promoted:.1f} s after the kill; the old primary back as a replica"
        )

    def take_over() -> str:
        _, replica = nodes.primary_and_replica()
        began = time.monotonic()
        nodes.take_over(replica)
        return f"every node agreed {time.monotonic() - began:.1f} s after the takeover"

    def restart_postgres() -> str:
        began = time.monotonic()
        pg.restart()
        return f"back {time.monotonic() - began:.1f} s after the restart began"

    def kill_worker() -> str:
        deployment.kill_worker()
        return "started again at once"

    def kill_beat() -> str:
        deployment.beats.kill_leader(data)
        began = time.monotonic()
        led: list[float] = []

        def other_leads() -> bool:
            found = deployment.beats.led_again(data)
            if found is not None:
                led.append(found)
            return found is not None

        poll("another beat leading", other_leads, timeout=120)
        return f"another beat led {led[0]:.1f} s after ({time.monotonic() - began:.1f} s waited)"

    def kill_upkeep() -> str:
        deployment.kill_upkeep()
        return "started again at once"

    return [
        ("a primary SIGKILLed", kill_primary),
        ("CLUSTER FAILOVER TAKEOVER", take_over),
        ("PostgreSQL restarted", restart_postgres),
        ("a send worker SIGKILLed", kill_worker),
        ("the leading beat SIGKILLed", kill_beat),
        ("the upkeep worker SIGKILLed", kill_upkeep),
    ]


@contextlib.contextmanager
def _client(port: int) -> Any:
    import redis

    client = redis.Redis(port=port, socket_timeout=2)
    try:
        yield client
    finally:
        client.close()


def _span(samples: list[tuple[float, bool]], start: float, end: float) -> float:
    """Seconds from the first failed sample to the last in [start, end) (0: none failed)."""
    failed = [t for t, ok in samples if start <= t < end and not ok]
    return (failed[-1] - failed[0] + 0.1) if failed else 0.0


def _still(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """The longest time in [start, end) the dispatch file did not grow."""
    longest, since, last = 0.0, start, -1
    for t, size in samples:
        if not start <= t < end:
            continue
        if size != last:
            last, since = size, t
        longest = max(longest, t - since)
    return longest


SHELL_COUNTS = """
import json
from worker.models import SendJob
from limits.models import LedgerEntry, LedgerKind
from limits.models.ledger import LEDGER_OUTCOME_CODES
job = SendJob.objects.get(campaign=%r)
kinds = list(LedgerKind.objects.filter(campaign=%r).values_list("id", flat=True))
rows = LedgerEntry.objects.filter(kind_id__in=kinds)
print(json.dumps({
    "total": job.total, "pending": job.pending, "reasons": job.reasons,
    **{o: getattr(job, o) for o in SendJob.OUTCOMES},
    "ledger": rows.count(),
    "ledger_sent": rows.filter(outcome=LEDGER_OUTCOME_CODES["sent"]).count(),
    "ledger_outcomes": rows.exclude(outcome=0).count(),
    "ledger_users": rows.values("user_id").distinct().count(),
}))
"""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench chaos")
    parser.add_argument("--recipients", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=7000, help="sends a second, all workers")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--broker-url", default=BROKER_URL, help="emptied first")
    args = parser.parse_args(argv)
    for name, least in (("recipients", 1), ("rate", 1), ("every", 1)):
        if getattr(args, name) < least:
            parser.error(f"--{name} is {getattr(args, name)}; it must be at least {least}")
    log = ROOT / "var" / "chaos" / "processes.log"
    with (
        tempfile.TemporaryDirectory() as name,
        _children_logged(log) as out,
        contextlib.redirect_stdout(out),
        contextlib.ExitStack() as stack,
    ):
        print(f"the processes' own output: {log}")
        run(args, Path(name), stack)


@contextlib.contextmanager
def _children_logged(path: Path) -> Any:
    """Standard output and error (which the processes started meanwhile inherit) go to `path`;
    yields this process's own output, to print the report on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    saved = os.dup(1), os.dup(2)
    out = open(os.dup(1), "w", buffering=1)  # noqa: SIM115  (closed below)
    with path.open("w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield out
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        out.close()


def run(args: argparse.Namespace, tmp: Path, stack: contextlib.ExitStack) -> None:
    from bench.stream import _report, receiver_started

    tmp.chmod(0o755)  # PostgreSQL's own user reads its directory in here
    print("starting PostgreSQL, a 3-primary Redis Cluster with replicas and the processes...")
    pg = PostgresServer(tmp).start()
    stack.callback(pg.stop)
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE gatekeeper")
    nodes = RedisClusterProcesses(tmp / "cluster", masters=3, replicas=1).start()
    stack.callback(nodes.stop)
    dispatched = tmp / "dispatched.log"
    env = {
        **os.environ,
        "DATABASE_URL": pg.url("gatekeeper"),
        "REDIS_URL": nodes.url,
        "REDIS_CLUSTER": "true",
        "CELERY_BROKER_URL": args.broker_url,
        "GATEKEEPER_STORE_URL": f"{tmp}/store",
        "GATEKEEPER_SNAPSHOT_CACHE_DIR": f"{tmp}/cache",
        "MEDIA_ROOT": f"{tmp}/media",
        "GATEKEEPER_DISPATCHERS": json.dumps({"push": FILE_DISPATCHER}),
        "DISPATCH_LOG": str(dispatched),
        "GATEKEEPER_PROVIDER_RATES": f"file={args.rate}",
        "LOG_LEVEL": "WARNING",
    }
    _redis(args.broker_url).flushdb()
    python = sys.executable
    demo_seeded(env)
    port, results = receiver_started(stack)
    endpoint_made(env, port, campaigns=(CAMPAIGN,))
    data = RedisCluster.from_url(nodes.url, socket_timeout=10)
    deployment = Deployment(env, tmp, stack)
    probes = Probes()
    prober = threading.Thread(
        target=_probe, args=(probes, nodes.url, pg.url("gatekeeper"), dispatched), daemon=True
    )
    csv = recipients_file(tmp / "recipients.csv", args.recipients)
    time.sleep(3)  # the workers' start-up is not the campaign's
    prober.start()
    stack.callback(probes.stop.set)
    began = time.monotonic()
    subprocess.run(
        [python, "manage.py", "send_campaign", "--channel", "push", "--template", "offer",
         "--campaign", CAMPAIGN, "--recipients", str(csv)],
        cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    poll("the first send", lambda: dispatched.exists(), timeout=300)
    first = time.monotonic()
    print(f"  the campaign handed over; first send {first - began:.1f} s after")
    windows: list[tuple[str, float, float, str]] = []
    faults = _faults(nodes, pg, deployment, data)
    for place, (what, fault) in enumerate(faults):
        at = first + (place + 1) * args.every
        while time.monotonic() < at:
            time.sleep(0.1)
        job = _job(pg.url("gatekeeper"))
        if job is not None and job[0] == "done":
            print(f"  the job ended before '{what}': raise --recipients or lower --rate")
            break
        started = time.monotonic()
        noted = fault()
        windows.append((what, started, time.monotonic(), noted))
        print(f"  {started - first:6.1f} s  {what}: {noted}")
    deadline = time.monotonic() + 1800

    def done() -> bool:
        job = _job(pg.url("gatekeeper"))
        return job is not None and job[0] == "done"

    poll("the job done", done, timeout=deadline - time.monotonic())
    ended = time.monotonic()
    print(f"  the job done {ended - first:.1f} s after its first send")
    stream = _stream_key(env)
    poll("the ledger drained", lambda: not data.xlen(stream), timeout=300)
    _caught_up(port, quiet=5.0)
    probes.stop.set()
    prober.join(timeout=10)
    ids = int(requests.get(f"http://127.0.0.1:{port}/distinct", timeout=60).text)
    received, _ = _report(port, results)
    counts = json.loads(
        subprocess.run(
            [python, "manage.py", "shell", "-v", "0", "-c",
             SHELL_COUNTS % (CAMPAIGN, CAMPAIGN)],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    _print(args, counts, dispatched, received, ids, probes, windows, ended)


def _stream_key(env: dict[str, str]) -> str:
    from limits.ledger.stream import stream_key

    return stream_key()


def _print(
    args: argparse.Namespace,
    counts: dict[str, Any],
    dispatched: Path,
    received: int,
    ids: int,
    probes: Probes,
    windows: list[tuple[str, float, float, str]],
    ended: float,
) -> None:
    handed: Counter[tuple[str, str]] = Counter()
    with dispatched.open() as lines:
        handed.update(tuple(line.split()) for line in lines)  # type: ignore[misc]
    users = Counter(user for user, _ in handed)
    doubled = sum(n - 1 for n in users.values() if n > 1)
    settled = sum(counts[o] for o in ("sent", "failed", "capped", "ambiguous", "duplicate",
                                      "invalid", "expired", "cancelled"))  # fmt: skip
    # Lost: a recipient the job counts as sent that no dispatcher was handed, or one the job
    # does not account for at all.
    lost = max(0, counts["sent"] - len(users)) + max(0, counts["total"] - settled)
    print(
        f"chaos under a campaign of {args.recipients:,} push recipients ({args.rate:,} sends/s at"
        f" most), PostgreSQL and a 3-primary Redis Cluster with replicas, 2 send workers, 2"
        f" beats, the upkeep worker, the stream to a webhook endpoint:"
    )
    print(f"  lost {lost}, doubled {doubled}   (target 0 and 0)")
    print(
        f"  the job: {counts['total']:,} recipients = sent {counts['sent']:,} + ambiguous "
        f"{counts['ambiguous']:,} + failed {counts['failed']:,} + capped {counts['capped']:,} + "
        f"other {settled - counts['sent'] - counts['ambiguous'] - counts['failed'] - counts['capped']:,}"
        f" + pending {counts['pending']:,}: {'adds up' if settled + counts['pending'] == counts['total'] else 'DOES NOT ADD UP'}"
        f"; refusals {counts['reasons']}"
    )
    print(
        f"  handed to the dispatcher: {len(users):,} recipients ({sum(handed.values()):,} sends);"
        f" sent or ambiguous in the job: {counts['sent'] + counts['ambiguous']:,}; of the"
        f" {counts['ambiguous']:,} ambiguous (a run cut off during its batch: kept, never sent"
        f" again), {len(users) - counts['sent']:,} had reached the dispatcher"
    )
    print(
        f"  the ledger: {counts['ledger']:,} decisions of {counts['ledger_users']:,} users, "
        f"{counts['ledger_sent']:,} sent   ({'exact' if counts['ledger_sent'] == counts['sent'] else 'NOT EXACT'} against the job's {counts['sent']:,})"
    )
    expected = counts["ledger"] + counts["ledger_outcomes"]
    print(
        f"  the stream: {ids:,} distinct events of {received:,} posted, of {expected:,} the ledger"
        f" holds (decisions and outcomes): {'complete' if ids == expected else 'NOT COMPLETE'}"
    )
    print("  each fault's window (the gate `unavailable`, PostgreSQL refusing, the sends still):")
    for place, (what, started, _, noted) in enumerate(windows):
        end = windows[place + 1][1] if place + 1 < len(windows) else ended
        print(
            f"    {what:30} gate {_span(probes.gate, started, end):5.1f} s, database "
            f"{_span(probes.database, started, end):5.1f} s, sends still "
            f"{_still(probes.sent, started, end):5.1f} s   ({noted})"
        )
