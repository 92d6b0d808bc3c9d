"""The front door: a campaign file handed over as a campaign system does, over REST.

python -m bench front_door [-- --recipients 10000000]

A campaign file of N push recipients (`<user_id>,token-<user_id>`, one send per user) is
POSTed to /api/v1/sends/ as multipart/form-data (the file streamed from disk) to the web process
as deployed (gunicorn, gatekeeper/gunicorn_conf.py), on PostgreSQL (a fresh database), with 2
Celery worker processes on the `sends` queue (null dispatcher) and the ledger drained every 2 s
as beat's task does, all on this machine. The clock starts when the upload starts; printed:
the answer (the upload, its first lines checked, the file stored), the first send counted on the
job (its `sent` above 0, as GET /api/v1/sends/<id>/ shows it, polled every 0.2 s), the job
`done`, and where the time went (worker.timings' steps, each process's CPU and peak memory,
Redis CPU).
"""

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests

from bench.gate import (
    _command_usec,
    _group,
    _hash,
    _process_figures,
    _redis,
    _redis_cpu,
    campaign_env,
    demo_seeded,
    recipients_file,
)

ROOT = Path(__file__).resolve().parent.parent
FIRST_SEND_TARGET = 10.0  # seconds from the upload's start
DONE_TARGET = 240.0  # seconds from the upload's start, at 10M recipients


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _multipart(path: Path, csv: Path, fields: dict[str, str]) -> str:
    """The request body written to `path` (the file part streamed in from `csv`): its
    Content-Type."""
    boundary = uuid.uuid4().hex
    with path.open("wb") as body:
        for name, value in fields.items():
            body.write(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                f"{value}\r\n".encode()
            )
        body.write(
            f'--{boundary}\r\nContent-Disposition: form-data; name="recipients_file"; '
            f'filename="{csv.name}"\r\nContent-Type: text/csv\r\n\r\n'.encode()
        )
        with csv.open("rb") as lines:
            while block := lines.read(1 << 22):
                body.write(block)
        body.write(f"\r\n--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}"


def _stopped(process: subprocess.Popen[bytes], *, group: bool) -> None:
    """SIGTERM to a process (and its process group), and its end waited for."""
    if group:
        os.killpg(process.pid, 15)
    else:
        process.terminate()
    process.wait(timeout=60)


def _ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"The web process at {url} did not answer /readyz in time.")


def run(recipients: int) -> None:
    from bench.ledger import DRAINER
    from bench.postgres import BENCH_DB, database_made
    from worker.timings import STEPS, timings_key

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        port = _free_port()
        env = {
            **campaign_env(tmp, f"{BENCH_DB.rsplit('/', 1)[0]}/gk_bench_front_door"),
            "GATEKEEPER_BIND": f"127.0.0.1:{port}",
            "GUNICORN_ACCESSLOG": "",
            "DJANGO_HTTPS": "false",  # plain HTTP on loopback, as `make run` serves
            "DJANGO_SETTINGS_MODULE": "gatekeeper.settings",
        }
        database_made(env["DATABASE_URL"], fresh=True)
        data = _redis(env["REDIS_URL"])
        broker = _redis(env["CELERY_BROKER_URL"])
        for db in (data, broker):
            db.flushdb()
        python = sys.executable
        demo_seeded(env)
        token = subprocess.run(
            [python, "manage.py", "create_api_token", "campaigns"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip().split()[-1]  # fmt: skip
        csv = recipients_file(Path(tmp) / "recipients.csv", recipients)
        body = Path(tmp) / "body"
        content_type = _multipart(
            body, csv, {"channel": "push", "campaign": "offer", "template": "offer"}
        )
        csv.unlink()  # the body holds it: half the disk
        size = body.stat().st_size
        web = subprocess.Popen(
            [python, "-m", "gunicorn", "--config", "gatekeeper/gunicorn_conf.py",
             "gatekeeper.wsgi:application"],
            cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(_stopped, web, group=True)
        worker = subprocess.Popen(
            [python, "-m", "celery", "-A", "gatekeeper", "worker", "-Q", "sends", "-c", "2",
             "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=env, start_new_session=True,
        )  # fmt: skip
        stack.callback(_stopped, worker, group=True)
        drainer = subprocess.Popen([python, "-c", DRAINER], cwd=ROOT, env=env)
        stack.callback(_stopped, drainer, group=False)
        url = f"http://127.0.0.1:{port}"
        _ready(url, time.monotonic() + 60)
        time.sleep(3)  # the worker's start-up (snapshot loaded, pool forked) is not the campaign's
        data.delete(timings_key())  # the demo's own small campaigns
        redis_cpu = _redis_cpu([data])
        before = _command_usec([data])
        headers = {"Authorization": f"Token {token}"}
        peaks: dict[str, tuple[float, float]] = {}
        session = requests.Session()
        started = time.perf_counter()
        with body.open("rb") as upload:
            answer = session.post(
                f"{url}/api/v1/sends/",
                data=upload,
                headers={**headers, "Content-Type": content_type},
                timeout=600,
            )
        answered = time.perf_counter() - started
        if answer.status_code != 202:
            raise SystemExit(f"POST /api/v1/sends/ answered {answer.status_code}: {answer.text}")
        job_url = answer.json()["url"]
        first_send: float | None = None
        job: dict[str, Any] = {}
        while True:
            job = session.get(job_url, headers=headers, timeout=60).json()
            now = time.perf_counter() - started
            if first_send is None and job["sent"] > 0:
                first_send = now
            if job["status"] in ("done", "failed", "cancelled"):
                break
            for role, parent in (("web", web.pid), ("worker", worker.pid)):
                for pid in _group(parent):
                    with contextlib.suppress(OSError, StopIteration):
                        name = f"{role} {'parent' if pid == parent else 'process'} {pid}"
                        peaks[name] = _process_figures(pid)
            time.sleep(0.2)
        wall = time.perf_counter() - started
        redis_cpu = _redis_cpu([data]) - redis_cpu
        commands = _command_usec([data])
        commands.subtract(before)
        spent = {k.decode(): float(v) for k, v in _hash(data, timings_key()).items()}
        for db in (data, broker):
            db.flushdb()  # gigabytes at 10M: not left to the next benchmark
    print(
        f"front door: a campaign file of {recipients:,} push recipients ({size / 2**20:,.0f} MiB "
        f"with its multipart envelope) POSTed to /api/v1/sends/, gunicorn, 2 worker processes "
        f"(null dispatcher), PostgreSQL, one Redis, the ledger drained every 2 s:"
    )
    print(
        f"  job {job['status']}: {wall:.1f} s from the upload's start   (target < {DONE_TARGET:.0f} s at 10M)"
    )
    print(
        f"  answered (202) after {answered:.1f} s: the upload, its first lines checked, the file kept"
    )
    print(
        "  first send counted on the job after "
        + (f"{first_send:.1f} s" if first_send is not None else "never")
        + f"   (target < {FIRST_SEND_TARGET:.0f} s)"
    )
    print(
        f"  sent {job['sent']:,}, capped {job['capped']:,}, duplicate {job['duplicate']:,}, "
        f"invalid {job['invalid']:,}, failed {job['failed']:,}; reasons {job['reasons']}"
    )
    print(f"  at this rate 10M recipients take {10_000_000 * wall / recipients:.0f} s")
    for name, (peak, cpu) in sorted(peaks.items()):
        print(f"  {name}: peak memory {peak:,.0f} MB, CPU {cpu:,.1f} s")
    print(f"  Redis CPU: {redis_cpu:,.1f} s ({1e6 * redis_cpu / recipients:.1f} us per recipient)")
    top = sorted(commands.items(), key=lambda item: -item[1])[:6]
    print(
        "    by command: "
        + ", ".join(f"{name} {1e-6 * usec:,.1f} s" for name, usec in top if usec > 0)
    )
    print("  where the time went (wall seconds summed over processes, per recipient):")
    for step in STEPS:
        seconds = spent.get(step, 0.0)
        print(f"    {step:<10} {seconds:8.1f} s  {1e6 * seconds / recipients:6.1f} us")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench front_door")
    parser.add_argument("--recipients", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    if args.recipients < 1:
        parser.error("--recipients must be at least 1")
    run(args.recipients)
