"""REST API over HTTP against the production server (gunicorn, as `make run` starts it).

python -m bench api [-- --seconds 5 --clients 4 --workers 2 --redis-url redis://127.0.0.1:6379/14]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from bench.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
USERS = 200_000  # the demo's user lists


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench api")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (4 threads each)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args(argv)

    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
            "REDIS_URL": args.redis_url,
            "GATEKEEPER_STORE_URL": f"{tmp}/store",
            "GATEKEEPER_SNAPSHOT_CACHE_DIR": f"{tmp}/cache",
            "MEDIA_ROOT": f"{tmp}/media",
            "GATEKEEPER_BIND": f"127.0.0.1:{port}",
            "WEB_CONCURRENCY": str(args.workers),
            "GUNICORN_ACCESSLOG": "",
            "LOG_LEVEL": "WARNING",
            "DJANGO_HTTPS": "false",  # plain HTTP on loopback
        }
        python = sys.executable
        for command in (["migrate", "-v", "0"], ["seed_demo"]):
            subprocess.run(
                [python, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True
            )
        token = subprocess.run(
            [python, "manage.py", "create_api_token", "campaigns"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        server = subprocess.Popen(
            [str(Path(python).parent / "gunicorn"), "-c", "gatekeeper/gunicorn_conf.py", "gatekeeper.wsgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Token {token}"}
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if requests.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the web process did not become ready")
                time.sleep(0.2)
            run(base, headers, args)
        finally:
            server.terminate()
            server.wait(timeout=20)


def run(base: str, headers: dict[str, str], args: argparse.Namespace) -> None:
    decided = 0
    lock = threading.Lock()
    stop = time.monotonic() + args.seconds

    def batches(client: int) -> None:
        nonlocal decided
        session = requests.Session()
        session.headers.update(headers)
        n = 0
        while time.monotonic() < stop:
            n += 1
            body: Any = {
                "channel": "email",
                "requests": [
                    {
                        "user_id": (client * 7919 + n * 1000 + i) % USERS,
                        "message_id": f"c{client}-{n}-{i}",
                    }
                    for i in range(1000)
                ],
            }
            response = session.post(f"{base}/api/v1/gate/check/", json=body, timeout=30)
            response.raise_for_status()
            with lock:
                decided += len(response.json()["results"])

    started = time.monotonic()
    threads = [threading.Thread(target=batches, args=(c,)) for c in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = decided / (time.monotonic() - started)

    session = requests.Session()
    session.headers.update(headers)

    def latencies(call: object, count: int = 2000) -> tuple[float, float]:
        samples = []
        for i in range(count):
            t0 = time.perf_counter()
            call(i)  # type: ignore[operator]
            samples.append(time.perf_counter() - t0)
        samples.sort()
        return samples[count // 2] * 1e3, samples[int(count * 0.99)] * 1e3

    one_check = latencies(
        lambda i: session.post(
            f"{base}/api/v1/gate/check/",
            json={"channel": "push", "requests": [{"user_id": i, "message_id": f"one-{i}"}]},
            timeout=10,
        ).raise_for_status()
    )
    one_lookup = latencies(
        lambda i: session.get(
            f"{base}/api/v1/segments/lookup/?user_id={i}", timeout=10
        ).raise_for_status()
    )
    print(
        f"gate/check, bodies of 1,000 requests, {args.clients} clients, gunicorn {args.workers} workers: {rate:,.0f} decisions/s   (target >= 20,000)"
    )
    print(
        f"one-request gate/check: p50 {one_check[0]:.2f} ms, p99 {one_check[1]:.2f} ms   (target p99 < 10 ms)"
    )
    print(f"single lookup: p50 {one_lookup[0]:.2f} ms, p99 {one_lookup[1]:.2f} ms")
