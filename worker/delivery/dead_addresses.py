"""Dead addresses: the push tokens and mailboxes a provider said no longer exist.

A send whose provider answers that its address is dead (FCM's UNREGISTERED, APNs' 410
Unregistered or BadDeviceToken, an ESP's rejected or invalid recipient) fails for good
(`DispatchError(kind=PERMANENT, invalid=True)`); the chunk's run keeps it here, on its job,
for the campaign system to stop sending to it:

- `GET /api/v1/sends/<id>/` shows how many and the first 100 (`dead_addresses`);
- each is an event of the event stream (type `dead_address`, id `a<row>`: `GET /api/v1/stream/`
  and the webhook endpoints that take the type, signed, retried and filtered as every event).
  The table is a journal the stream reads by ranges of ids (limits.stream.events), registered
  in the app's `ready()` (`journal_register(JOURNAL)`: the stream imports nothing of the
  worker); its writers take DeadAddressLock first, so that its ids commit in order and a range
  the stream took misses no row committed later;
- deprecated, for this version only: with GATEKEEPER_DEAD_ADDRESS_WEBHOOK set, every one is
  also POSTed there as JSON (unsigned), in batches of up to REPORT_BATCH, by a beat task every
  30 s that marks a batch reported once the receiver answered 2xx and tries the rest again on
  its next run (each at least once). Check worker.W004 warns at start-up while it is set: make
  a webhook endpoint of type `dead_address` instead (docs/deploy.md says why both run for now).

Kept in the database first, so neither a worker's death nor a receiver's outage loses one.

A dead push token says nothing about the user (they may have a new phone), so it does not put
them on the suppression list; a mailbox that bounced for good does, through the email
provider's tracking webhook (worker/delivery/tracking.py).
"""

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning, register
from django.db import transaction

from gatekeeper.lib.instants import instant_text
from gatekeeper.lib.leases import writers_locked
from limits.models.stream import StreamBatch
from limits.stream.events import Journal, JournalEvents
from worker.models import DeadAddress, DeadAddressLock, SendJob

logger = logging.getLogger(__name__)

REPORT_BATCH = 1000
SHOWN = 100  # on the job's REST answer


def dead_addresses_record(job: SendJob, dead: Sequence[tuple[int, str, str]]) -> None:
    """Keep a run's dead addresses (user id, address, the provider's words) on its job, once
    each (a chunk run again after a crash finds them already kept), under the writers' lock:
    they commit in the order of their ids, as the event stream takes them."""
    with transaction.atomic():
        writers_locked(DeadAddressLock)
        known = set(
            DeadAddress.objects.filter(job=job, user_id__in={u for u, _, _ in dead}).values_list(
                "user_id", "address"
            )
        )
        rows = [
            DeadAddress(job=job, user_id=user_id, address=address, reason=reason[:300])
            for user_id, address, reason in dict.fromkeys(dead)
            if (user_id, address) not in known
        ]
        DeadAddress.objects.bulk_create(rows)


def dead_address_events(after: int, upto: int) -> JournalEvents:
    """The stream's events of the dead addresses of ids after `after` and up to `upto`: each
    (its id, channel, campaign, the event), with the old POST's fields."""
    rows = (
        DeadAddress.objects.filter(id__gt=after, id__lte=upto)
        .select_related("job")
        .only("id", "user_id", "address", "reason", "at", "job__campaign", "job__channel")
        .order_by("id")
    )
    return [
        (
            row.pk,
            row.job.channel,
            row.job.campaign,
            {
                "id": f"a{row.pk}",
                "type": EVENT_TYPE,
                "at": instant_text(row.at),
                "user_id": row.user_id,
                "channel": row.job.channel,
                "campaign": row.job.campaign,
                "job": row.job_id,
                "address": row.address,
                "reason": row.reason,
            },
        )
        for row in rows
    ]


EVENT_TYPE = "dead_address"
# What the app's ready() registers with the event stream.
JOURNAL = Journal(
    source=StreamBatch.Source.DEAD_ADDRESSES,
    event_type=EVENT_TYPE,
    model=DeadAddress,
    read=dead_address_events,
)


@register()
def dead_address_webhook_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """worker.W004 while the deprecated GATEKEEPER_DEAD_ADDRESS_WEBHOOK is set."""
    if not settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK:
        return []
    return [
        Warning(
            "GATEKEEPER_DEAD_ADDRESS_WEBHOOK is deprecated: dead addresses are events of the "
            f"event stream (type `{EVENT_TYPE}`), posted signed and retried to its webhook "
            "endpoints. This version still POSTs them to it too; the next one will not.",
            hint=f"Make a webhook endpoint of type {EVENT_TYPE} (POST /api/v1/webhooks/ "
            f'{{"url": ..., "types": ["{EVENT_TYPE}"]}}, or the admin), then unset '
            "GATEKEEPER_DEAD_ADDRESS_WEBHOOK (docs/deploy.md).",
            id="worker.W004",
        )
    ]


def dead_addresses_report_due() -> int:
    """Report every job's unreported dead addresses to the deprecated webhook (the beat task,
    every 30 s): a job whose receiver refuses is tried again on the next run, the others go
    on. Returns how many went."""
    if not settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK:
        return 0
    jobs = DeadAddress.objects.filter(reported=False).values_list("job_id", flat=True).distinct()
    reported = 0
    for job_id in sorted(set(jobs)):
        try:
            reported += dead_addresses_report(job_id)
        except ReportFailed as exc:
            logger.warning("%s; trying again in a while", exc)
    return reported


def dead_addresses_shown(job: SendJob) -> dict[str, Any]:
    """How many dead addresses the job met, and the first SHOWN of them."""
    rows = job.dead_addresses.order_by("id")
    first = [
        {"user_id": r.user_id, "address": r.address, "reason": r.reason, "at": r.at}
        for r in rows[:SHOWN]
    ]
    return {"count": rows.count() if len(first) == SHOWN else len(first), "first": first}


class ReportFailed(Exception):
    """The webhook did not take a batch; the task tries again later."""


def dead_addresses_report(job_id: int, *, url: str | None = None, timeout: float = 10.0) -> int:
    """POST the job's unreported dead addresses to the webhook, a batch at a time, marking each
    batch reported once the receiver answered 2xx. Returns how many were reported; raises
    ReportFailed when the receiver refused or could not be reached (the rest stay unreported)."""
    url = url or settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK
    if not url:
        return 0
    job = SendJob.objects.get(pk=job_id)
    reported = 0
    while True:
        batch = list(job.dead_addresses.filter(reported=False).order_by("id")[:REPORT_BATCH])
        if not batch:
            return reported
        body = json.dumps(
            {
                "job": job.pk,
                "campaign": job.campaign,
                "channel": job.channel,
                "dead_addresses": [
                    {
                        "user_id": row.user_id,
                        "address": row.address,
                        "reason": row.reason,
                        "at": row.at.isoformat(),
                    }
                    for row in batch
                ],
            }
        ).encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ReportFailed(f"dead-address webhook {url}: {exc}") from exc
        DeadAddress.objects.filter(pk__in=[row.pk for row in batch]).update(reported=True)
        reported += len(batch)
