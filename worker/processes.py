"""Which processes gate with which snapshot version, for the dashboard.

Every process that gates (each gunicorn worker, each Celery child) writes one field of the Redis
hash `<prefix>processes`, `<host>:<pid>`, holding its role, snapshot version, the version of the
limiter's function library it calls (`functions`; none from a release before versioned
libraries) and when it last reported: once at start-up and after every snapshot poll. A
process that has not reported for three poll intervals (at least 30 s) is taken for gone;
listing drops it from the hash.
"""

import json
import logging
import os
import socket
from datetime import datetime
from typing import Any

from django.conf import settings

from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis
from gatekeeper.lib.words import count
from limits.engine.transport import LIMITER_LIBRARY

logger = logging.getLogger(__name__)

_started_at: dict[int, float] = {}  # per pid: a forked child starts its own clock


def _key() -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}processes"


def stale_after() -> float:
    return max(30.0, 3 * float(settings.GATEKEEPER_SNAPSHOT_POLL_SECONDS))


def process_report(*, role: str, status: dict[str, Any], now: datetime | None = None) -> None:
    """Record this process and the snapshot it holds. Never raises: a Redis outage only leaves
    the dashboard a little behind."""
    host, pid = socket.gethostname(), os.getpid()
    seen_at = instant_or_now(now).timestamp()  # kept as epoch seconds (the dashboard reads them)
    entry = {
        "role": role,
        "host": host,
        "pid": pid,
        "version": status.get("version"),
        "source": status.get("source"),
        "error": status.get("error"),
        "functions": LIMITER_LIBRARY.version,
        "started_at": _started_at.setdefault(pid, seen_at),
        "seen_at": seen_at,
    }
    try:
        get_redis().hset(_key(), f"{host}:{pid}", json.dumps(entry))
    except REDIS_DOWN as exc:
        logger.debug("Could not report this process to Redis: %s", exc)


def processes_list(now: datetime | None = None) -> list[dict[str, Any]]:
    """Processes seen recently, newest version first; forgets those gone quiet."""
    seconds = instant_or_now(now).timestamp()
    client = get_redis()
    alive, gone = [], []
    for field, raw in client.hgetall(_key()).items():
        try:
            entry = json.loads(raw)
            fresh = seconds - float(entry["seen_at"]) <= stale_after()
        except (ValueError, KeyError, TypeError):
            fresh = False
        if fresh:
            alive.append(entry)
        else:
            gone.append(field)
    if gone:
        client.hdel(_key(), *gone)
    return sorted(alive, key=lambda e: (e.get("version") or "", e["role"], e["host"], e["pid"]))


def processes_by_version(now: datetime | None = None) -> dict[str | None, list[dict[str, Any]]]:
    grouped: dict[str | None, list[dict[str, Any]]] = {}
    for entry in processes_list(now):
        grouped.setdefault(entry.get("version"), []).append(entry)
    return grouped


SHOWN = 5  # processes named in a refusal


def describe(entry: dict[str, Any]) -> str:
    functions = entry.get("functions")
    calls = f"functions {functions}" if functions else "a release before versioned names"
    return f"{entry.get('role')} on {entry.get('host')} (pid {entry.get('pid')}): {calls}"


def other_releases_refusal(what: str, consequence: str) -> str | None:
    """Why `what` is refused while processes of another release (a limiter library other than
    this release's) have reported recently; None when none have. `consequence`: what --force
    would risk."""
    running = [p for p in processes_list() if p.get("functions") != LIMITER_LIBRARY.version]
    if not running:
        return None
    named = "; ".join(describe(p) for p in running[:SHOWN])
    more = f"; and {len(running) - SHOWN} more" if len(running) > SHOWN else ""
    return (
        f"{what}: {count(len(running), 'process', 'processes')} of another release "
        f"reported in the last {stale_after():.0f} s ({named}{more}). Stop them first, or pass "
        f"--force ({consequence})."
    )
