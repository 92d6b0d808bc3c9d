"""Leases: "one at a time" for work that more than one process may start (a task delivered
twice, beat's ticks, several beats), written once for the whole project.

A lease is held for a length of time and ends on its own when its holder dies; the holder
renews it while it works and gives it back when done. Renewing and giving back succeed only for
the holder: one whose lease ran out, and which another took since, changes nothing of the new
holder's (it learns so from the False answered, and stops).

Two kinds:
- `RowLease`, a row of the database held by a time in one of its fields (`lease_until`): a send
  job's chunk, a job whose file is read, an erasure, a webhook endpoint. Taken, renewed and given
  back by one conditional UPDATE each, which may set the row's other fields in the same write
  (a run counted, progress noted) and narrow the row by a condition of its own (a status).
- `RedisLease`, a Redis key holding its holder's random token, with a TTL: beat's leader, the
  ledger's drainer, the snapshots' publishing, the plan. Taken by SET NX PX; renewed and
  released by gatekeeper/lib/lua/lease.lua, which compares the token first. Each call names one
  key, so it works on Redis Cluster as on one node.
"""

import secrets
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import models
from django.db.models import Q, QuerySet
from django.utils import timezone

from gatekeeper.lib.redis_client import RedisClient, get_redis

# Its header says what it takes and answers; loaded with register_script (EVALSHA, EVAL when
# Redis lost it).
LEASE_LUA = (Path(__file__).parent / "lua" / "lease.lua").read_text()
POLL_SECONDS = 0.1  # how often RedisLease.take(wait=...) tries again


class LeaseLost(Exception):
    """The lease ran out and another holder may have it now: the work under it stops."""


def lease_free(now: datetime, field: str = "lease_until") -> Q:
    """Rows no live holder has at `now` (a lookup): never leased, or the lease ran out."""
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": now})


class RowLease:
    """A hold on one row: `rows` is a queryset of that row (`Model.objects.filter(pk=...)`),
    `field` the row's time the lease runs until (None: nobody holds it), `length` how long a
    lease taken or renewed lasts. `until` is the time this holder wrote last (None when it holds
    nothing): the row still showing it is what makes this holder the holder.

    Each of take, renew and give_back is one UPDATE: `where` (a Q) narrows the row further (a
    status it must have), and the keyword arguments are other fields written with the lease.
    Each answers whether it changed the row."""

    def __init__(self, rows: QuerySet[Any], length: timedelta, *, field: str = "lease_until"):
        if length <= timedelta(0):
            raise ValueError(f"A lease's length must be more than 0; got {length}.")
        self.rows, self.length, self.field = rows, length, field
        self.until: datetime | None = None

    def free(self, now: datetime) -> Q:
        return lease_free(now, self.field)

    def take(self, now: datetime, *, where: Q | None = None, **changes: Any) -> bool:
        """Take the row at `now` if no live holder has it (and it is as `where` says), for
        `length` from `now`."""
        until = now + self.length
        rows = self.rows.filter(self.free(now))
        if where is not None:
            rows = rows.filter(where)
        if not rows.update(**{self.field: until}, **changes):
            return False
        self.until = until
        return True

    def renew(self, now: datetime | None = None, *, where: Q | None = None, **changes: Any) -> bool:
        """Hold the row `length` from `now` (the current time by default), if this holder still
        holds it. False: it ran out and another took it, or `where` no longer holds."""
        until = (now or timezone.now()) + self.length
        if not self._held(where).update(**{self.field: until}, **changes):
            return False
        self.until = until
        return True

    def give_back(self, *, where: Q | None = None, **changes: Any) -> bool:
        """Free the row at once (the next holder need not wait for the lease to run out), if
        this holder still holds it; nothing of another holder's is touched."""
        if not self._held(where).update(**{self.field: None}, **changes):
            return False
        self.until = None
        return True

    def _held(self, where: Q | None) -> QuerySet[Any]:
        if self.until is None:
            raise RuntimeError("This lease is not held: take it first.")
        rows = self.rows.filter(**{self.field: self.until})
        return rows if where is None else rows.filter(where)


class RedisLease:
    """A hold on a Redis key: its value this holder's `token` (random unless given), its TTL
    the lease's `seconds`. `client` by default is the process's (read at each call, so that a
    client made again after a fork is the one used). Raises what redis-py raises when Redis
    cannot be reached."""

    def __init__(
        self,
        key: str,
        seconds: float,
        *,
        client: RedisClient | None = None,
        token: str | None = None,
    ) -> None:
        if not seconds > 0:
            raise ValueError(f"A lease's length must be more than 0 seconds; got {seconds}.")
        self.key, self.seconds, self.client = key, float(seconds), client
        self.token = token or secrets.token_hex(16)
        self._script: Any = None

    @property
    def ms(self) -> int:
        return max(1, round(self.seconds * 1000))

    def take(self, *, wait: float = 0) -> bool:
        """Take the key if nobody holds it; held by another, try again every POLL_SECONDS for
        `wait` seconds at most."""
        client = self._client()
        deadline = time.monotonic() + wait
        while True:
            if client.set(self.key, self.token, nx=True, px=self.ms):
                return True
            if time.monotonic() + POLL_SECONDS > deadline:
                return False
            time.sleep(POLL_SECONDS)

    def renew(self) -> bool:
        """Its full length again from now, if this holder still holds it."""
        return self._call("renew")

    def hold(self) -> bool:
        """Renew it if this holder holds it, take it if nobody does: whether it is held now."""
        return self._call("hold")

    def release(self) -> bool:
        """Delete the key if this holder still holds it; another's is left as it is."""
        return self._call("release")

    def _client(self) -> RedisClient:
        return self.client if self.client is not None else get_redis()

    def _call(self, op: str) -> bool:
        client = self._client()
        if self._script is None or self._script.registered_client is not client:
            self._script = client.register_script(LEASE_LUA)
        return bool(self._script(keys=[self.key], args=[op, self.token, self.ms]))


def writers_locked(model: type[models.Model]) -> None:
    """Take a table's writers' lock, `model`'s one row (pk 1, made the first time), for the rest
    of the caller's transaction: its writers commit one after another (a journal's ids then
    commit in order)."""
    manager = model._default_manager
    if not manager.select_for_update().filter(pk=1).exists():
        manager.get_or_create(pk=1)
        manager.select_for_update().filter(pk=1).exists()
