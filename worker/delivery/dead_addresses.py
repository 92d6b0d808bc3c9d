"""Dead addresses: the push tokens and mailboxes a provider said no longer exist.

A send whose provider answers that its address is dead (FCM's UNREGISTERED, APNs' 410
Unregistered or BadDeviceToken, an ESP's rejected or invalid recipient) fails for good
(`DispatchError(kind=PERMANENT, invalid=True)`); the chunk's run keeps it here, on its job,
for the campaign system to stop sending to it:

- `GET /api/v1/sends/<id>/` shows how many and the first 100 (`dead_addresses`);
- with GATEKEEPER_DEAD_ADDRESS_WEBHOOK set, every one is POSTed there as JSON, in batches of up
  to REPORT_BATCH, by a beat task every 30 s that marks a batch reported once the receiver
  answered 2xx and tries the rest again on its next run (each at least once: a receiver should
  expect an address twice after a lost answer). Kept in the database first, so neither a
  worker's death nor a receiver's outage loses one.

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

from worker.models import DeadAddress, SendJob

logger = logging.getLogger(__name__)

REPORT_BATCH = 1000
SHOWN = 100  # on the job's REST answer


def dead_addresses_record(job: SendJob, dead: Sequence[tuple[int, str, str]]) -> None:
    """Keep a run's dead addresses (user id, address, the provider's words) on its job, once
    each (a chunk run again after a crash finds them already kept), and have them reported."""
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


def dead_addresses_report_due() -> int:
    """Report every job's unreported dead addresses (the beat task, every 30 s): a job whose
    receiver refuses is tried again on the next run, the others go on. Returns how many went."""
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
