"""Upkeep of the send log: moving logs of the earlier format into it (`manage.py convert_logs`),
and sweeping users whose log has aged out from buckets still alive (`send_logs_sweep`, a task
that beat queues every minute).

Both walk keys with SCAN on every primary: the one server, or each master of a cluster (a SCAN
sees only the keys of the node it is sent to). Each keeps its place per node in a hash of the
prefix, one field per node (`<prefix>convert:cursors`, `<prefix>sweep:cursors`), saved once a
page's keys are dealt with: the next run continues where the last one stopped, or was stopped,
and a page dealt with twice does no harm, since moving and sweeping are both idempotent. SCAN
returns every key that exists for a whole pass at least once (some twice).
"""

import logging
import math
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from gatekeeper.lib.instants import ms_checked, ms_or_now
from limits.engine import log
from limits.engine.legacy import LegacyLogs, OldLogs, parse_legacy_key
from limits.engine.limiter import Limiter

logger = logging.getLogger(__name__)

PAGE = 1000  # keys one SCAN call looks at
DONE = "done"  # a node's field once its part of a convert pass has ended


def primaries(client: Any) -> list[tuple[str, Any]]:
    """Each primary's name and a client of that node alone."""
    if isinstance(client, RedisCluster):
        return [(node.name, client.get_redis_connection(node)) for node in client.get_primaries()]
    return [("server", client)]


def _glob(prefix: str) -> str:
    """The prefix as a SCAN pattern that matches it literally."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", prefix)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- convert_logs ------------------------------------------------------------------------------


def convert_cursors_key(prefix: str) -> str:
    return f"{prefix}convert:cursors"


@dataclass(frozen=True, slots=True)
class ConvertPage:
    """What one SCAN page of a conversion found and moved."""

    node: str
    keys: int  # old logs found
    users: int  # users whose old logs were moved (a dry run: would be)
    entries: int  # entries added to the new log (a dry run: in the old logs, within retention)
    ignored: int  # keys the pattern matched that are not old logs; left alone
    finished: bool  # the node's part of the pass has ended


def logs_convert_unfinished(limiter: Limiter) -> bool:
    """Whether an earlier run stopped in the middle of a pass (the next run continues it)."""
    return bool(limiter.client.exists(convert_cursors_key(limiter.prefix)))


def logs_convert_restart(limiter: Limiter) -> None:
    """Forget where an unfinished pass stopped: the next run starts at the beginning."""
    limiter.client.delete(convert_cursors_key(limiter.prefix))


def logs_convert(
    limiter: Limiter,
    *,
    retention_ms: int,
    page: int = PAGE,
    dry_run: bool = False,
    now_ms: int | None = None,
) -> Generator[ConvertPage, None, None]:
    """Move every old log into the new one, a SCAN page at a time, one primary after another.
    Continues the pass an earlier run left unfinished. The caller may stop between pages: each
    page's place is saved before it is handed over. A dry run moves nothing, saves no place and
    starts at the beginning.

    `retention_ms`: the new log's (limits.engine.table), so an import trims nothing the rules need.
    `now_ms`: the clock, epoch milliseconds (None: Redis's own; a dry run's, this process's).
    """
    now_ms = ms_checked(now_ms)
    client, prefix = limiter.client, limiter.prefix
    old = LegacyLogs(client, prefix=prefix, import_entries=limiter.import_entries)
    key = convert_cursors_key(prefix)
    nodes = primaries(client)
    saved: dict[str, str] = {}
    if not dry_run:
        saved = {_text(n): _text(c) for n, c in client.hgetall(key).items()}
        if all(saved.get(name) == DONE for name, _ in nodes):
            # The last pass ended on every node (its last step may not have cleared it).
            client.delete(key)
            saved = {}
    pattern = f"{_glob(prefix)}{{u:*}}:*"
    for name, conn in nodes:
        place = saved.get(name, "0")
        if place == DONE:
            continue
        cursor = int(place)
        while True:
            cursor, keys = conn.scan(cursor, match=pattern, count=page)
            found: dict[int, list[str]] = {}
            ignored = 0
            for raw in keys:
                parsed = parse_legacy_key(prefix, raw)
                if parsed is None:
                    ignored += 1
                else:
                    found.setdefault(parsed[0], []).append(parsed[1])
            logs = old.read(found, found=found) if found else {}
            if dry_run:
                entries = _within(logs, retention_ms=retention_ms, now_ms=now_ms)
            else:
                entries = old.move_logs(logs, now_ms=now_ms, retention_ms=retention_ms)
                client.hset(key, name, DONE if cursor == 0 else str(cursor))
            yield ConvertPage(
                node=name,
                keys=len(keys) - ignored,
                users=len(logs),
                entries=entries,
                ignored=ignored,
                finished=cursor == 0,
            )
            if cursor == 0:
                break
    if not dry_run:
        client.delete(key)


def _within(logs: dict[int, OldLogs], *, retention_ms: int, now_ms: int | None) -> int:
    """The old entries an import would keep (the rest have aged out)."""
    since = ms_or_now(now_ms) - retention_ms
    return sum(1 for old in logs.values() for _, at, _ in old.entries if at > since)


# --- the sweep ---------------------------------------------------------------------------------


def sweep_cursors_key(prefix: str) -> str:
    return f"{prefix}sweep:cursors"


@dataclass(frozen=True, slots=True)
class SweepReport:
    buckets: int  # buckets looked at
    dropped: int  # users dropped: their newest entry had left the retention
    emptied: int  # buckets deleted: nobody was left in them
    passes: int  # nodes whose walk came to its end in this run (the next run starts it over)


def logs_sweep(
    limiter: Limiter,
    *,
    buckets: int,
    retention_ms: int,
    now_ms: int | None = None,
    page: int = PAGE,
) -> SweepReport:
    """Sweep about `buckets` buckets, shared among the primaries, each continuing its walk
    where the last run stopped. A node that does not answer is left for the next run.
    `now_ms`: the clock, epoch milliseconds (None: Redis's own)."""
    now_ms = ms_checked(now_ms)
    client, prefix = limiter.client, limiter.prefix
    key = sweep_cursors_key(prefix)
    saved = {_text(n): int(c) for n, c in client.hgetall(key).items()}
    nodes = primaries(client)
    share = max(1, math.ceil(buckets / len(nodes)))
    pattern = f"{_glob(prefix)}{{b:*}}*"  # buckets and their groups
    looked = dropped = emptied = passes = 0
    for name, conn in nodes:
        cursor, seen = saved.get(name, 0), 0
        try:
            while True:
                # SCAN's COUNT is how many keys it looks at: no more than this run has left.
                cursor, keys = conn.scan(cursor, match=pattern, count=min(page, share - seen))
                gone, deleted = limiter.sweep(keys, retention_ms=retention_ms, now_ms=now_ms)
                dropped += gone
                emptied += deleted
                seen += len(keys)
                client.hset(key, name, cursor)
                if cursor == 0:
                    passes += 1
                    break
                if seen >= share:
                    break
        except (redis.RedisError, OSError) as exc:
            logger.warning("Sweep of the send logs on %s stopped: %s", name, exc)
        looked += seen
    return SweepReport(buckets=looked, dropped=dropped, emptied=emptied, passes=passes)


@dataclass(frozen=True)
class GroupPage:
    buckets: int  # buckets looked at
    moved: int  # logs moved into their groups


def logs_group(
    limiter: Limiter, *, retention_ms: int, now_ms: int | None = None, page: int = PAGE
) -> Iterator[GroupPage]:
    """Move every bucket's users into their groups, one SCAN page at a time on each primary
    (docs/limiter.md, "Buckets and groups"); once every node's walk has ended, say so in
    Redis (log.grouped_key), and the limiters read buckets no more. Raises when a node does
    not answer: nothing is said, and a run again moves what is left."""
    client, prefix = limiter.client, limiter.prefix
    pattern = f"{_glob(prefix)}{{b:*}}"  # buckets: a group's key goes on after the '}'
    for _, conn in primaries(client):
        cursor = 0
        while True:
            cursor, keys = conn.scan(cursor, match=pattern, count=page)
            moved = limiter.group_buckets(keys, retention_ms=retention_ms, now_ms=now_ms)
            yield GroupPage(buckets=len(keys), moved=moved)
            if cursor == 0:
                break
    client.set(log.grouped_key(prefix), ms_or_now(now_ms))
