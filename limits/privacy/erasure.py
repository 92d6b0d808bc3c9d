"""Erasing people everywhere (GDPR article 17, CCPA's right to delete): the work of an
`Erasure`, place by place (limits.privacy.personal's registry, the same places a person's export
reads).

First the people are kept as erased (a keyed hash of each id, limits.people.suppression.erased_add),
in the transaction that makes the erasure (limits.privacy.services.erasure_start): from that commit
on the gate refuses them on every channel and keeps none of their decisions, so nothing new of them
is written while the places are emptied. Then each place's erase, all
the ids at once (a place batches as it needs); a place done is noted on the erasure, so that a
run that dies is taken up again (beat's `users_erase_due`) where it stopped, and every erase is
idempotent besides. A place that must wait (a send job's chunk being sent now keeps its records
by place) is tried again RETRY_IN later; the erasure is `waiting` until then. Every place is
erased twice, the second pass RETRY_IN after the first: other processes learn of an erasure
within their suppression list's TTL (2 s), and what they decided of these people meanwhile
(a chunk being sent) is gone after the second. Done, the ids are dropped: the erasure keeps who
asked, when, how many and what each place removed, never whom.
"""

import logging
from datetime import datetime, timedelta

import numpy as np
from django.db.models import Q
from django.utils import timezone

from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.leases import RowLease, lease_free
from limits.models.privacy import Erasure
from limits.privacy.personal import places

logger = logging.getLogger(__name__)

LEASE = timedelta(minutes=10)  # a run holds its erasure this long (renewed after each place)
RETRY_IN = timedelta(seconds=30)  # a place that waits is tried again this much later
PASSES = 2  # over every place: the second after the other processes' caches learned of it


def users_packed(user_ids: list[int]) -> bytes:
    return np.asarray(user_ids, dtype=">u8").tobytes()


def users_unpacked(blob: bytes | memoryview | None) -> list[int]:
    return [] if not blob else np.frombuffer(bytes(blob), dtype=">u8").tolist()


def erasures_due(*, now: datetime | None = None) -> list[int]:
    """The erasures not done whose time to (try again) has come and no live run holds."""
    now = instant_or_now(now)
    due = Q(next_at__isnull=True) | Q(next_at__lte=now)
    open_ = Erasure.objects.exclude(status=Erasure.Status.DONE)
    return list(open_.filter(due, lease_free(now)).order_by("pk").values_list("pk", flat=True))


def erasure_run(erasure_id: int, *, now: datetime | None = None) -> Erasure | None:
    """Take the erasure (None when a live run holds it, or it is done) and erase its people
    from every place not done yet. Raises what a place raises (Redis down: Unavailable); the
    erasure is then taken up again when its lease runs out. None too when this run outlasted
    its lease and another took the erasure over: what this one erased stays erased (every
    erase is idempotent), the other notes it."""
    now = instant_or_now(now)
    lease = RowLease(Erasure.objects.filter(pk=erasure_id), LEASE)
    if not lease.take(now, where=~Q(status=Erasure.Status.DONE), status=Erasure.Status.RUNNING):
        return None
    erasure = Erasure.objects.get(pk=erasure_id)
    ids = users_unpacked(erasure.users)  # kept as erased already, with the erasure itself
    waiting = 0
    for place in places():
        if place.erase is None or place.key in erasure.places_done:
            continue
        result = place.erase(ids)
        erasure.removed[place.key] = erasure.removed.get(place.key, 0) + result.removed
        if result.waiting:
            waiting += result.waiting
        else:
            erasure.places_done.append(place.key)
        if not lease.renew(removed=erasure.removed, places_done=erasure.places_done):
            _lost(erasure)
            return None
    erasure.waiting, erasure.lease_until = waiting, None
    if not waiting:
        erasure.passes += 1
    if waiting or erasure.passes < PASSES:
        if not waiting:
            erasure.places_done = []  # the next pass: every place again
        erasure.status, erasure.next_at = Erasure.Status.WAITING, now + RETRY_IN
    else:
        erasure.status, erasure.users = Erasure.Status.DONE, None
        erasure.finished_at, erasure.next_at = timezone.now(), None
    if not lease.give_back(**{field: getattr(erasure, field) for field in _SETTLED}):
        _lost(erasure)
        return None
    logger.info(
        "Erasure %d of %d people: %s (%s)",
        erasure.pk,
        erasure.count,
        erasure.status,
        ", ".join(f"{key} {n}" for key, n in erasure.removed.items()),
    )
    return erasure


# What a run writes of its erasure as it gives the lease back.
_SETTLED = (
    "status", "users", "places_done", "removed", "waiting", "passes", "next_at", "finished_at"
)  # fmt: skip


def _lost(erasure: Erasure) -> None:
    logger.warning(
        "Erasure %d: this run outlasted its lease and another took it over; this run stops",
        erasure.pk,
    )


def erasure_progress(erasure: Erasure) -> float:
    """Percent of the places that erase, done."""
    erasing = [place.key for place in places() if place.erase is not None]
    if erasure.status == Erasure.Status.DONE:
        return 100.0
    done = erasure.passes * len(erasing) + sum(1 for k in erasing if k in erasure.places_done)
    return 100.0 * done / max(PASSES * len(erasing), 1)
