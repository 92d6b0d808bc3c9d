"""`make run`: prepare the embedded defaults and start every Gatekeeper process.

Checks that Redis answers; applies migrations, collects static files and seeds the demo on the
first start (in a process of its own); then starts honcho, which runs the processes in Procfile
side by side. Once every process answers (web's /readyz, beat holding its lease, both Celery
workers a ping), it prints where to go and how to log in, as the console's last lines, and waits
for honcho: Ctrl-C stops everything.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
# How long the processes have to answer before the logins are printed anyway, with what did not.
READY_SECONDS = 120.0
# The Celery nodes of the Procfile: the send worker's default name and the upkeep worker's.
WORKER_NODES = ("celery", "upkeep")


def prepare() -> None:
    """Migrate, collect static files, seed the demo (first start only) and keep the send logs
    in their groups (group_logs: nothing to move after the first start), in one process of
    its own (`run.py prepare`): one Django start-up for them all, and its memory (the demo's
    snapshot, numpy) given back before the processes start."""
    import io

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    call_command("seed_demo")
    # This machine's processes are all of this checkout: any the registry still shows are ones
    # `make run` started before and stopped.
    call_command("group_logs", force=True, stdout=io.StringIO())


def web_url() -> str:
    """Where gunicorn listens (gatekeeper/gunicorn_conf.py reads the same variable)."""
    host, _, port = os.environ.get("GATEKEEPER_BIND", "127.0.0.1:8000").rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):  # every address: this machine's loopback is one of them
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def web_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def workers_ready() -> bool:
    """Both Celery workers of the Procfile answer a ping (they have taken their queues)."""
    import socket

    from gatekeeper.celery import app

    host = socket.gethostname()
    wanted = {f"{node}@{host}" for node in WORKER_NODES}
    try:
        answers = app.control.ping(destination=sorted(wanted), timeout=1.0, limit=len(wanted))
    except Exception:  # the broker itself not answering yet: not ready
        return False
    return wanted <= {name for answer in answers or [] for name in answer}


def beat_ready() -> bool:
    """A beat leads: the lease (gatekeeper/beat.py) is held by a live process of this host (a
    beat of an earlier start, killed before it gave the lease back, holds it until it ends)."""
    import socket

    from gatekeeper.beat import lease_key
    from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis

    try:
        token = get_redis().get(lease_key())
    except REDIS_DOWN:
        return False
    if token is None:
        return False
    text = token.decode() if isinstance(token, bytes) else str(token)
    host, pid, _ = text.rsplit(":", 2)
    if host != socket.gethostname():
        return True  # a beat elsewhere leads (REDIS_URL shared): this one waits, as it should
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


def wait_for_processes(honcho: "subprocess.Popen[Any]", url: str) -> list[str]:
    """Wait until every process answers, honcho exits or READY_SECONDS pass; what did not
    answer (empty: everything did). In this order: the web's access log line for the last
    /readyz is written before the other checks end; a worker writes "ready." before it can
    answer a ping."""
    deadline = time.monotonic() + READY_SECONDS
    checks: list[tuple[str, Callable[[], bool]]] = [
        (f"web ({url}/readyz)", lambda: web_ready(url)),
        ("beat (its lease in Redis)", beat_ready),
        ("the Celery workers (a ping)", workers_ready),
    ]
    waiting = list(checks)
    while waiting and honcho.poll() is None and time.monotonic() < deadline:
        if waiting[0][1]():
            waiting.pop(0)
        else:
            time.sleep(0.5)
    return [name for name, _ in waiting]


def logins(url: str, seconds: float, missing: list[str]) -> str:
    from worker.management.commands.seed_demo import (
        DEMO_PASSWORD,
        DEMO_SERVICE,
        DEMO_USER,
        DEMO_VIEWER,
    )

    rule = "=" * 78
    head = (
        f"Gatekeeper is running (web, worker, upkeep, beat; ready in {seconds:.0f} s)."
        if not missing
        else f"Gatekeeper started, but these did not answer within {READY_SECONDS:.0f} s: "
        + ", ".join(missing)
        + ". Their lines above say why."
    )
    return "\n".join(
        [
            "",
            rule,
            head,
            "",
            f"  Admin      {url}/admin/",
            f"  Log in     {DEMO_USER} / {DEMO_PASSWORD}   (group Marketer)",
            f"             {DEMO_VIEWER} / {DEMO_PASSWORD}     (group Viewer, read-only)",
            f"  API        {url}/api/docs/ ; a token for the campaign system's account:",
            f"             .venv/bin/python manage.py create_api_token {DEMO_SERVICE}",
            f'             curl -H "Authorization: Token <token>" {url}/api/v1/segments/',
            "  Stop       Ctrl-C (stops every process)",
            rule,
            "",
        ]
    )


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatekeeper.settings")
    # A laptop serves plain HTTP on loopback: no HTTPS redirect, no secure-only cookies.
    os.environ.setdefault("DJANGO_HTTPS", "false")
    # Nothing else on a laptop: /metrics and /readyz's details answer callers on it.
    os.environ.setdefault("GATEKEEPER_METRICS_NETWORKS", "127.0.0.0/8,::1/128")
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:] == ["prepare"]:
        prepare()
        return 0
    import redis
    from django.conf import settings

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        print(f"Redis is not answering at {settings.REDIS_URL} ({exc}).", file=sys.stderr)
        print(
            "Start it (redis-server) or set REDIS_URL, then run `make run` again.", file=sys.stderr
        )
        return 1

    begun = time.monotonic()
    (ROOT / "var").mkdir(exist_ok=True)
    prepared = subprocess.run(
        [str(BIN / "python"), str(Path(__file__).resolve()), "prepare"], cwd=ROOT
    )
    if prepared.returncode != 0:
        return prepared.returncode  # what went wrong is printed above
    honcho = subprocess.Popen(
        [str(BIN / "honcho"), "start", "-f", str(ROOT / "Procfile")], cwd=ROOT
    )

    def stop(signum: int, frame: Any) -> None:
        # SIGTERM sent to this process is passed on (honcho stops every process once, however
        # often it is told). Ctrl-C's SIGINT reaches honcho itself (one process group): this
        # process only waits for it to stop everything.
        if signum == signal.SIGTERM and honcho.poll() is None:
            honcho.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    import django

    django.setup()  # while the processes start: the checks below use the project's clients
    url = web_url()
    missing = wait_for_processes(honcho, url)
    if honcho.poll() is None:
        print(logins(url, time.monotonic() - begun, missing), flush=True)
    return honcho.wait()


if __name__ == "__main__":
    sys.exit(main())
