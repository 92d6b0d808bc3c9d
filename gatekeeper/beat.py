"""Celery beat without a single point of failure: any number of beat processes run, and the one
holding a lease in Redis (the leader) sends the periodic tasks; the others wait for the lease.

Why a lease and not celery-redbeat: the schedule lives in the database (django-celery-beat, so
that an operator sees and edits it in the admin), and redbeat would move it into Redis; what
beat lacked was only "one at a time". The lease is one Redis key holding the leader's token
(a RedisLease, gatekeeper/lib/leases.py), set with NX and a TTL (GATEKEEPER_BEAT_LOCK_SECONDS,
15 s by default) and renewed by the leader on every tick (at least once a second here: the
webhooks' dispatch is due every second). When the leader dies, its lease ends within the TTL
and a waiting process, which tries every third of it, takes the lead: within TTL + TTL / 3
(20 s by default; the target is 30 s).

A leader that stalls longer than the TTL (a frozen VM) may, when it wakes, tick once more
beside the new leader before it finds the lease gone; and a new leader runs at once each task
whose last run it did not see. So every periodic task must be safe to run twice, and each is:
the drain, the webhook runs, the plan and the erasures take a lock or a lease of their own;
a scheduled job is started under its row's lock; the others queue only what is due by the
database (a chunk queued twice is run once: its lease, docs/worker.md) or make changes that a
second run finds made (the sweep, the prunes); the dead addresses' report, at least once by
design, may post a batch twice, as it does when a receiver's answer is lost.
"""

import logging
import os
import socket
import uuid
from typing import Any

from django.conf import settings
from django_celery_beat.schedulers import DatabaseScheduler

from gatekeeper.lib.leases import RedisLease
from gatekeeper.lib.redis_client import REDIS_DOWN

logger = logging.getLogger(__name__)


def lease_key() -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}beat:leader"


class Lease:
    """The beat leader's lease (a RedisLease whose token names the process): `hold()` takes
    or renews it."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = float(seconds or settings.GATEKEEPER_BEAT_LOCK_SECONDS)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = RedisLease(lease_key(), self.seconds, token=self.token)
        self.held = False

    def hold(self) -> bool:
        """Whether this process leads now. Redis unreachable: nobody can be told to lead, so
        no process does (a task sent twice is harmless; one sent by a process that cannot
        see the others is not what the lease is for)."""
        try:
            held = self.lease.hold()
        except REDIS_DOWN as exc:
            logger.warning("Beat cannot reach Redis for its lease: %s", exc)
            held = False
        if held != self.held:
            logger.warning("Beat %s %s the lead", self.token, "takes" if held else "has lost")
        self.held = held
        return held

    def release(self) -> None:
        if not self.held:
            return
        try:
            self.lease.release()
        except REDIS_DOWN as exc:
            logger.warning("Beat could not hand its lease back (it ends on its own): %s", exc)
        self.held = False


class LeaderScheduler(DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler, ticking only while this process leads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lease = Lease()
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        led = self.lease.held
        if not self.lease.hold():
            return self.lease.seconds / 3
        if not led:
            # Taking the lead: the schedule read again, with the last runs the previous leader
            # wrote (what it ran since, up to its last sync, runs once more: safe).
            self._initial_read = True
        return min(super().tick(*args, **kwargs), self.lease.seconds / 3)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.lease.release()
