"""Rebuilding Redis's send logs from the send ledger (`manage.py rebuild_logs`), after Redis
lost its data: every send the ledger holds that a log would still count is put back.

Which sends: decisions of marketing sends that the gate admitted (reason `allowed`) inside the
longest window of the rules now in force (the logs' retention), less those whose quota was
given back (outcome `failed` or `released`). Sends the gate charged as duplicates, refusals and
exempt transactional sends were never in a log.

Users are taken in order of id, a few thousand at a time, each user whole; the limiter puts a
batch back with one function call per bucket, the calls of a node pipelined together (on a
cluster, node after node). Putting back is idempotent (a send already in its log, by channel
and message, is not added again), so a rebuild may run while the gate admits new sends, and may
be run again.

Resuming: after each batch the last user done is kept in Redis itself (`<prefix>rebuild`), the
place whose data it describes: a rebuild that stops (Ctrl-C, a crash) goes on from there, and if
Redis loses its data again the mark goes with the logs and the next rebuild starts over, as it
must.
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gatekeeper.lib.instants import instant_ms, instant_or_now
from limits.engine.limiter import Limiter, Restored, get_limiter
from limits.ledger.table import kinds_analyze, message_of
from limits.models.ledger import LedgerEntry, LedgerKind
from limits.policy.selectors import policy_read
from limits.reasons import GIVEN_BACK, Category, Reason

MARK = "rebuild"


def mark_key(prefix: str) -> str:
    return f"{prefix}{MARK}"


@dataclass
class Rebuilt:
    users: int = 0  # users with sends put back (or found there already)
    sends: int = 0  # sends read from the ledger
    added: int = 0  # sends the logs did not hold and now do
    last_user: int | None = None  # the last user done
    resumed_after: int | None = None  # where an earlier rebuild had stopped
    seconds: float = 0.0


def _sends(since: datetime, after: int | None, limit: int) -> list[tuple[Any, ...]]:
    """Up to `limit` countable sends of the users after `after`, ordered by user; every send of
    each user returned (a user cut off by the limit is left for the next batch), unless a single
    user has more than `limit`, who is returned whole. Each as (user id, channel, at, message
    id, campaign, priority, tags)."""
    admitted = LedgerKind.objects.filter(category=Category.MARKETING, reason=Reason.ALLOWED)
    countable = LedgerEntry.objects.filter(at__gt=since, kind__in=admitted.values("id")).exclude(
        outcome__in=GIVEN_BACK
    )
    if after is not None:
        countable = countable.filter(user_id__gt=after)
    fields = ("user_id", "kind_id", "at", "message_id")
    rows = list(countable.order_by("user_id").values_list(*fields)[:limit])
    if len(rows) == limit:
        last = rows[-1][0]
        rows = [row for row in rows if row[0] != last] or list(
            countable.filter(user_id=last).values_list(*fields)  # one user, whole
        )
    kinds = LedgerKind.objects.in_bulk({kind_id for _, kind_id, _, _ in rows})
    return [
        (user_id, kind.channel, at, message_of(kind.campaign, user_id, stored), kind.campaign,
         kind.priority, kind.tags)
        for user_id, kind_id, at, stored in rows
        for kind in (kinds[kind_id],)
    ]  # fmt: skip


def _batches(since: datetime, after: int | None, limit: int) -> Iterator[list[tuple[Any, ...]]]:
    while True:
        rows = _sends(since, after, limit)
        if not rows:
            return
        yield rows
        after = rows[-1][0]


def logs_rebuild(
    *,
    batch: int = 20_000,
    restart: bool = False,
    now: datetime | None = None,
    limiter: Limiter | None = None,
    progress: Callable[[Rebuilt], None] | None = None,
) -> Rebuilt:
    """Put the ledger's countable sends back into the users' logs (see the module's text).
    `restart`: from the first user, not where an earlier rebuild stopped. `now`: an aware
    datetime (tests); None: this process's clock picks the sends, Redis's judges their age."""
    limiter = limiter or get_limiter()
    client, key = limiter.client, mark_key(limiter.prefix)
    started = time.monotonic()
    clock = instant_or_now(now)
    now_ms = None if now is None else instant_ms(clock)
    retention_ms = policy_read().retention_ms
    kinds_analyze()
    since = clock - timedelta(milliseconds=retention_ms)
    report = Rebuilt()
    mark = None if restart else client.get(key)
    after = int(mark) if mark is not None else None
    report.resumed_after = after
    for rows in _batches(since, after, batch):
        entries = [
            Restored(
                user_id=user_id,
                channel=channel,
                at_ms=instant_ms(at),
                message_id=message_id,
                campaign=campaign,
                priority=priority,
                tags=tuple(tags or ()),
            )
            for user_id, channel, at, message_id, campaign, priority, tags in rows
        ]
        report.added += limiter.restore(entries, retention_ms=retention_ms, now_ms=now_ms)
        report.sends += len(entries)
        report.users += len({entry.user_id for entry in entries})
        report.last_user = entries[-1].user_id
        # Kept as long as the logs it describes could need it: a week past the retention.
        client.set(key, report.last_user, px=retention_ms + 7 * 86_400_000)
        report.seconds = time.monotonic() - started
        if progress is not None:
            progress(report)
    client.delete(key)  # done: the next rebuild starts over
    report.seconds = time.monotonic() - started
    return report
