"""The upgrade from the earlier log format: two sorted sets per user and channel,
`<prefix>{u:<id>}:<channel>` (members: message ids) and `<prefix>{u:<id>}:all` (members:
`<channel>:<message id>`), scores the times in ms; kept a week and a day.

While `GATEKEEPER_LOG_UPGRADE` is on, the limiter moves a user's old logs into the new one
before it decides for them, so every decision counts the sends recorded before the upgrade; and
`manage.py convert_logs` (limits.engine.upkeep) moves everybody else's. Moving is idempotent: an
entry already in the new log (same channel and message) is not added again, so two processes moving
the same user, or a move interrupted and run again, count each send once. The old keys are
deleted only after their entries are in the new log.

Which old keys a user has: the configured channels' and `all`, and the log of every channel the
`all` log names. A channel no longer configured still has its user's sends in `all` (they
count against rules on every channel), and its own key is deleted with the others rather than
left for its TTL. `convert_logs` also passes the keys its SCAN found.

An old log and the user's new log sit in different cluster slots (`{u:<id>}` and
`{b:<id >> 8>}`), so a move is read, import, delete: three steps, each safe to repeat. A send
released between another process's read and its import comes back (counted once more, never
admitted beyond a cap). Processes of the earlier version must be stopped before the new ones
start deciding (docs/limiter.md, "Upgrading from the two-sorted-set logs"): one of them writing
an old log after its user was moved would write a send the new log never sees.
"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from limits.channels import ALL, scopes

# The old logs lived 8 days; imported entries are kept at least that long.
RETENTION_MS = 8 * 86_400_000


def legacy_key(prefix: str, user_id: int, scope: str) -> str:
    return f"{prefix}{{u:{user_id}}}:{scope}"


def parse_legacy_key(prefix: str, key: str | bytes) -> tuple[int, str] | None:
    """The user id and scope of an old log's key; None for a key that is not one."""
    found = re.fullmatch(rf"{re.escape(prefix)}\{{u:(\d+)\}}:(.+)", _text(key), flags=re.DOTALL)
    if found is None:
        return None
    return int(found[1]), found[2]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


ImportEntries = Callable[..., int]
"""The limiter's import_entries(user_id, entries, *, retention_ms, now_ms) -> entries added
(`now_ms`: epoch milliseconds, None for Redis's own clock)."""


@dataclass(frozen=True, slots=True)
class OldLogs:
    """A user's logs of the earlier format: the keys that exist, and their entries as
    (channel, time ms, message id), each send once (it is in its channel's log and in `all`)."""

    keys: tuple[str, ...]
    entries: tuple[tuple[str, int, str], ...]


class LegacyLogs:
    def __init__(self, client: Any, *, prefix: str, import_entries: ImportEntries) -> None:
        self.client = client
        self.prefix = prefix
        self.import_entries = import_entries

    def _read_scopes(self, wanted: Mapping[int, Iterable[str]]) -> dict[tuple[int, str], Any]:
        """(user, scope) -> the old log's (member, score) pairs; empty where there is none.
        One pipeline: one round trip per node."""
        pipe = self.client.pipeline(transaction=False)
        order = []
        for user_id, user_scopes in wanted.items():
            for scope in user_scopes:
                pipe.zrange(legacy_key(self.prefix, user_id, scope), 0, -1, withscores=True)
                order.append((user_id, scope))
        if not order:
            return {}
        return dict(zip(order, pipe.execute(), strict=True))

    def read(
        self, user_ids: Iterable[int], *, found: Mapping[int, Iterable[str]] | None = None
    ) -> dict[int, OldLogs]:
        """The old logs of these users, users without any left out. `found`: scopes known to
        exist (a SCAN's), read besides the configured ones."""
        found = found or {}
        configured = scopes()
        wanted = {
            user_id: list(dict.fromkeys([*configured, *found.get(user_id, ())]))
            for user_id in dict.fromkeys(user_ids)
        }
        replies = self._read_scopes(wanted)
        # Channels the `all` log names that were not read yet (no longer configured): a second
        # round trip, only when there are any.
        more: dict[int, list[str]] = {}
        for user_id, user_scopes in wanted.items():
            for member, _ in replies.get((user_id, ALL), ()):
                channel = _text(member).partition(":")[0]
                if channel not in user_scopes and channel not in more.get(user_id, ()):
                    more.setdefault(user_id, []).append(channel)
        replies.update(self._read_scopes(more))

        logs: dict[int, OldLogs] = {}
        for user_id in wanted:
            keys: list[str] = []
            entries: dict[tuple[str, str], int] = {}
            for scope in [*wanted[user_id], *more.get(user_id, ())]:
                pairs = replies[(user_id, scope)]
                if not pairs:
                    continue  # Redis keeps no empty sorted set: there is no such key
                keys.append(legacy_key(self.prefix, user_id, scope))
                for member, score in pairs:
                    text = _text(member)
                    if scope == ALL:
                        channel, _, message = text.partition(":")
                    else:
                        channel, message = scope, text
                    # The two copies of a send hold one time; were they apart, the later one
                    # keeps it in its windows longer: never fewer counted.
                    at = int(score)
                    entries[(channel, message)] = max(at, entries.get((channel, message), at))
            if keys:
                logs[user_id] = OldLogs(
                    keys=tuple(keys),
                    entries=tuple((c, at, m) for (c, m), at in entries.items()),
                )
        return logs

    def move(
        self,
        user_ids: Sequence[int],
        *,
        now_ms: int | None,
        retention_ms: int = RETENTION_MS,
        found: Mapping[int, Iterable[str]] | None = None,
    ) -> int:
        """Move these users' old logs into their new ones. Returns the entries added."""
        return self.move_logs(
            self.read(user_ids, found=found), now_ms=now_ms, retention_ms=retention_ms
        )

    def move_logs(
        self,
        logs: Mapping[int, OldLogs],
        *,
        now_ms: int | None,
        retention_ms: int = RETENTION_MS,
    ) -> int:
        """Add old logs (as `read` gave them) to the new log, then delete their keys. Returns the
        entries added. `retention_ms`: the new log's (an import trims the user's whole log to
        it), at least the old logs' 8 days."""
        retention = max(retention_ms, RETENTION_MS)
        added = 0
        for user_id, old in logs.items():
            if old.entries:
                added += self.import_entries(
                    user_id, list(old.entries), retention_ms=retention, now_ms=now_ms
                )
        self._delete(logs)
        return added

    def forget(self, user_id: int) -> bool:
        """Delete a user's old logs (a quota reset). True if there were any."""
        logs = self.read([user_id])
        self._delete(logs)
        return bool(logs)

    def _delete(self, logs: Mapping[int, OldLogs]) -> None:
        if not logs:
            return
        pipe = self.client.pipeline(transaction=False)
        for old in logs.values():
            for key in old.keys:
                pipe.delete(key)
        pipe.execute()
