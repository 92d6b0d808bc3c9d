"""`make run`: prepare the embedded defaults and start every Gatekeeper process.

Checks that Redis answers, applies migrations, collects static files, seeds the demo on the
first start, then hands over to honcho, which runs the processes in Procfile side by side.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"


def manage(*args: str) -> None:
    subprocess.run([str(BIN / "python"), "manage.py", *args], cwd=ROOT, check=True)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatekeeper.settings")
    # A laptop serves plain HTTP on loopback: no HTTPS redirect, no secure-only cookies.
    os.environ.setdefault("DJANGO_HTTPS", "false")
    # Nothing else on a laptop: /metrics and /readyz's details answer callers on it.
    os.environ.setdefault("GATEKEEPER_METRICS_NETWORKS", "127.0.0.0/8,::1/128")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
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

    (ROOT / "var").mkdir(exist_ok=True)
    manage("migrate", "--no-input", "-v", "0")
    manage("collectstatic", "--no-input", "-v", "0")
    manage("seed_demo")
    os.execv(str(BIN / "honcho"), [str(BIN / "honcho"), "start", "-f", str(ROOT / "Procfile")])


if __name__ == "__main__":
    sys.exit(main())
