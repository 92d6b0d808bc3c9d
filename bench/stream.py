"""The event stream: how fast it is read and posted, and how far behind a blast it runs.

make bench BENCH_ARGS="stream" [-- --events 1000000 --blast-seconds 60 --rate 27778]

On the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database:

1. **Pull**: `--events` decisions (gate calls of 1,000, a third of them with an outcome) put
   through the ledger's stream and drained, then read back with `stream_read` a page of 1,000
   at a time: events/s.
2. **Webhook**: the same events posted to a local receiver (another process: http.server, which
   parses each request and answers 200) by one `webhook_deliver` run in this process, batches
   of 1,000, signed: events/s on one worker process (target: at least 50,000).
3. **Behind a blast**: a producer process appends gate calls to the ledger's stream at `--rate`
   decisions a second (the 10M-recipient blast's: 10,000,000 in 6 minutes) for
   `--blast-seconds`, a drainer process runs beat's drain every 2 s, and this process runs a
   delivery every second, as beat does; the receiver notes, per event, how long after its
   decision it arrived: p50, p99, max (target: p99 under 5 s).
4. **The gate beside it**: gate decisions/s (the ledger on, a drainer on beat's schedule) with
   an endpoint being posted the stream in another process against none, runs alternated
   (target: at least 0.95x). The gate itself does nothing more for the stream: what it can
   lose is the CPU the delivery takes on these 2 cores.
"""

import argparse
import contextlib
import functools
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import redis
from django import db

from bench.gate import USERS, alternated
from bench.ledger import DRAINER, _fill_batch, _gates, _reset_tables
from bench.postgres import REDIS_URL, ROOT, on_bench_database
from limits.ledger.drain import ledger_drain, ledger_drain_all
from limits.ledger.stream import ledger_outcomes
from limits.models.stream import StreamBatch, WebhookDelivery, WebhookEndpoint
from limits.stream.events import START, position_from_text, stream_end, stream_read
from limits.stream.webhooks import WebhookFields, webhook_create, webhook_deliver

BLAST_RATE = 10_000_000 / 360  # the 10M blast in 6 minutes


def _receiver(port_out: Any, results: Any) -> None:
    """A company's endpoint: parses each batch, answers 200, notes each event's lag."""
    lags: list[float] = []
    counted = [0]
    ids: set[str] = set()  # each event's id: repeats of an at-least-once delivery count once

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            arrived = time.time()
            # Taken, then read: the sender goes on to its next batch meanwhile, as it would
            # with a receiver that stores a batch and answers (not one on the same 2 cores).
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()
            events = msgspec.json.decode(body)["events"]
            counted[0] += len(events)
            ids.update(event["id"] for event in events)
            for event in events:
                if event["type"] == "decision":
                    at = datetime.fromisoformat(event["at"]).timestamp()
                    lags.append(arrived - at)

        def do_GET(self) -> None:
            # /count: how many so far; /distinct: how many ids; /report: the figures, then
            # they are forgotten.
            body = str(len(ids) if self.path == "/distinct" else counted[0]).encode()
            if self.path not in ("/count", "/distinct"):
                results.put((counted[0], list(lags)))
                counted[0] = 0
                lags.clear()
                ids.clear()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def receiver_started(stack: contextlib.ExitStack) -> tuple[int, Any]:
    """A `_receiver` in a process of its own, stopped with `stack`: (its port, what `_report`
    reads)."""
    ports: Any = multiprocessing.Queue()
    results: Any = multiprocessing.Queue()
    receiver = multiprocessing.Process(target=_receiver, args=(ports, results), daemon=True)
    receiver.start()
    stack.callback(receiver.terminate)
    return ports.get(timeout=30), results


def _report(port: int, results: Any) -> tuple[int, list[float]]:
    import requests

    requests.get(f"http://127.0.0.1:{port}/report", timeout=60)
    got: tuple[int, list[float]] = results.get(timeout=60)
    return got


def _fill(client: redis.Redis, events: int) -> None:
    started = time.perf_counter()
    step = 100_000
    for start in range(0, events, step):
        count = min(step, events - start)
        _fill_batch(client, start, count, events, 1)
        ledger_outcomes(
            channel="email", since_ms=round((time.time() - 7200) * 1000),
            outcomes=[(u, f"m{u}", "sent") for u in range(start, start + count, 3)],
            client=client,
        )  # fmt: skip
        while ledger_drain(client=client).entries:
            pass
    print(
        f"filled: {events:,} decisions drained with {events // 3:,} outcomes in "
        f"{time.perf_counter() - started:.1f} s; {StreamBatch.objects.count():,} stream batches",
        flush=True,
    )


def pull(events: int) -> int:
    started = time.perf_counter()
    after, read = START, 0
    while True:
        page = stream_read(after, 1000)
        read += len(page.events)
        after = page.next
        if not page.more:
            break
    spent = time.perf_counter() - started
    print(f"pull: {read:,} events in {spent:.1f} s: {read / spent:,.0f} events/s "
          f"(pages of 1,000, stream_read in one process)", flush=True)  # fmt: skip
    return read


def webhook(port: int, results: Any, expected: int) -> None:
    endpoint = webhook_create(fields=WebhookFields(url=f"http://127.0.0.1:{port}/in"), start="0")
    started = time.perf_counter()
    report = webhook_deliver(endpoint.pk, seconds=3600)
    spent = time.perf_counter() - started
    received, _ = _report(port, results)
    assert report is not None and not report.failed, report
    print(
        f"webhook: {report.events:,} events in {report.requests:,} signed requests in "
        f"{spent:.1f} s: {report.events / spent:,.0f} events/s on one process (target >= "
        f"50,000); the receiver took {received:,} (expected {expected:,})",
        flush=True,
    )
    endpoint.delete()


def _producer(seconds: float, rate: float, start: int) -> None:
    """Gate calls of 1,000 decisions appended at `rate` a second, each at its own time."""
    db.connections.close_all()
    client = redis.Redis.from_url(REDIS_URL)
    began = time.time()
    sent = 0
    while time.time() - began < seconds:
        due = int((time.time() - began) * rate)
        while sent + 1000 <= due:
            _fill_batch(client, start + sent, 1000, 10**9, 1, at=time.time())
            sent += 1000
        time.sleep(0.01)


def _drainer(stop: Any) -> None:
    db.connections.close_all()
    client = redis.Redis.from_url(REDIS_URL)
    while not stop.is_set():
        ledger_drain_all(rounds=10, wait=0, client=client)
        stop.wait(2.0)


def blast(port: int, results: Any, seconds: float, rate: float) -> None:
    endpoint = webhook_create(fields=WebhookFields(url=f"http://127.0.0.1:{port}/in"))
    db.connections.close_all()
    stop = multiprocessing.Event()
    producer = multiprocessing.Process(target=_producer, args=(seconds, rate, 10**8))
    drainer = multiprocessing.Process(target=_drainer, args=(stop,))
    producer.start()
    drainer.start()
    began = time.time()
    delivered = 0
    while producer.is_alive() or time.time() - began < seconds + 30:
        tick = time.time()
        report = webhook_deliver(endpoint.pk)
        delivered += report.events if report else 0
        if not producer.is_alive() and stream_end() == _position(endpoint):
            break
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    stop.set()
    producer.join()
    drainer.join()
    received, lags = _report(port, results)
    lags.sort()
    p50 = statistics.median(lags)
    p99 = lags[int(len(lags) * 0.99)]
    print(
        f"behind a blast of {rate:,.0f} decisions/s for {seconds:.0f} s ({received:,} events): "
        f"from decision to the endpoint p50 {p50:.1f} s, p99 {p99:.1f} s, max {lags[-1]:.1f} s "
        f"(target p99 < 5 s); drain every 2 s, delivery every 1 s, as beat runs them",
        flush=True,
    )
    endpoint.delete()


def _deliverer(endpoint_id: int, on: Any, stop: Any) -> None:
    """Delivers the endpoint's events, as beat's runs do, while `on` is set."""
    db.connections.close_all()
    while not stop.is_set():
        if on.wait(0.05):
            webhook_deliver(endpoint_id)
            time.sleep(0.05)


def gate_beside_stream(port: int, seconds: float) -> None:
    """Gate decisions/s (ledger on, a drainer on beat's schedule all along) with an endpoint
    being posted the stream against none, runs alternated on these 2 cores."""
    gate, _ = _gates()
    endpoint = webhook_create(fields=WebhookFields(url=f"http://127.0.0.1:{port}/in"))
    db.connections.close_all()
    on, stop = multiprocessing.Event(), multiprocessing.Event()
    deliverer = multiprocessing.Process(target=_deliverer, args=(endpoint.pk, on, stop))
    deliverer.start()
    drainer = subprocess.Popen(
        [sys.executable, "-c", DRAINER], cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "gatekeeper.settings"},
    )  # fmt: skip
    rng = random.Random(7)
    counter = iter(range(10**9))

    def step(streaming: bool) -> int:
        (on.set if streaming else on.clear)()
        n = next(counter)
        requests = [(u, f"s{n}-{u}") for u in rng.sample(range(USERS), 1000)]
        return len(gate.check(channel="email", requests=requests, campaign="bench"))

    rounds = 8
    try:
        plain, streamed, ratio = alternated(
            functools.partial(step, False), functools.partial(step, True), seconds, rounds=rounds
        )
    finally:
        stop.set()
        deliverer.join(timeout=30)
        drainer.terminate()
        drainer.wait(timeout=30)
    endpoint.refresh_from_db()
    print(
        f"gate with no endpoint: {plain:,.0f} decisions/s; with one posted the stream: "
        f"{streamed:,.0f} decisions/s (ratio {ratio:.3f}x, median of {rounds} alternated run "
        f"pairs; target >= 0.95x); the endpoint took {endpoint.delivered:,} events",
        flush=True,
    )
    endpoint.delete()


def _position(endpoint: WebhookEndpoint) -> Any:
    endpoint.refresh_from_db()
    return position_from_text(endpoint.position)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench stream")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blast-seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=BLAST_RATE)
    parser.add_argument("--gate-seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    if on_bench_database("stream", argv):
        return
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    _reset_tables()
    for table in (StreamBatch, WebhookDelivery, WebhookEndpoint):
        table.objects.all().delete()
    ledger_drain_all(client=client)  # the stream's start
    _fill(client, args.events)
    expected = pull(args.events)
    db.connections.close_all()
    with contextlib.ExitStack() as stack:
        port, results = receiver_started(stack)
        webhook(port, results, expected)
        if args.blast_seconds > 0:
            blast(port, results, args.blast_seconds, args.rate)
        gate_beside_stream(port, args.gate_seconds)
