"""The upgrade from the earlier log format: two sorted sets per user and channel,
`<prefix>{u:<id>}:<channel>` (members: message ids) and `<prefix>{u:<id>}:all` (members:
`<channel>:<message id>`), scores the times in ms; kept a week and a day.

While `GATEKEEPER_LOG_UPGRADE` is on, the limiter moves a user's old logs into the new one
before it decides for them, so every decision counts the sends recorded before the upgrade; and
`manage.py convert_logs` moves everybody else's. Moving is idempotent: an entry already in the
new log (same channel and message) is not added again, so two processes moving the same user,
or a move interrupted and run again, count each send once. The old keys are deleted only after
their entries are in the new log.

An old log and the user's new log sit in different cluster slots (`{u:<id>}` and
`{b:<id >> 8>}`), so a move is read, import, delete: three steps, each safe to repeat.
Processes of the earlier version must be stopped before the new ones start deciding
(docs/limiter.md, "Upgrading"): one of them writing an old log after its user was moved would
write a send the new log never sees.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from limits.channels import ALL, scopes

# The old logs lived 8 days; imported entries are kept at least that long.
RETENTION_MS = 8 * 86_400_000


def legacy_key(prefix: str, user_id: int, scope: str) -> str:
    return f"{prefix}{{u:{user_id}}}:{scope}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


ImportEntries = Callable[..., int]
"""The limiter's import_entries(user_id, entries, *, retention_ms, now) -> entries added."""


class LegacyLogs:
    def __init__(self, client: Any, *, prefix: str, import_entries: ImportEntries) -> None:
        self.client = client
        self.prefix = prefix
        self.import_entries = import_entries

    def _keys(self, user_id: int) -> list[str]:
        return [legacy_key(self.prefix, user_id, scope) for scope in scopes()]

    def read(self, user_ids: Sequence[int]) -> dict[int, list[tuple[str, int, str]]]:
        """Each user's old entries as (channel, time ms, message id), users without any left out.
        One pipeline: one round trip per node."""
        pipe = self.client.pipeline(transaction=False)
        for user_id in user_ids:
            for key in self._keys(user_id):
                pipe.zrange(key, 0, -1, withscores=True)
        replies = iter(pipe.execute())
        found: dict[int, list[tuple[str, int, str]]] = {}
        for user_id in user_ids:
            entries: dict[tuple[str, str], int] = {}
            for scope in scopes():
                for member, score in next(replies):
                    text = _text(member)
                    if scope == ALL:
                        channel, _, message = text.partition(":")
                    else:
                        channel, message = scope, text
                    entries[(channel, message)] = int(score)
            if entries:
                found[user_id] = [(c, at, m) for (c, m), at in entries.items()]
        return found

    def move(self, user_ids: Iterable[int], *, now: float | None) -> int:
        """Move these users' old logs into their new ones. Returns the entries added."""
        unique = list(dict.fromkeys(user_ids))
        found = self.read(unique)
        added = 0
        for user_id, entries in found.items():
            added += self.import_entries(user_id, entries, retention_ms=RETENTION_MS, now=now)
        if found:
            pipe = self.client.pipeline(transaction=False)
            for user_id in found:
                for key in self._keys(user_id):
                    pipe.delete(key)
            pipe.execute()
        return added

    def forget(self, user_id: int) -> bool:
        """Delete a user's old logs (a quota reset). True if there were any."""
        pipe = self.client.pipeline(transaction=False)
        for key in self._keys(user_id):
            pipe.delete(key)
        return any(pipe.execute())
