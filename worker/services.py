"""Send jobs: created from a campaign's recipients, run chunk by chunk by the worker.

Celery delivers a task at least once (acks_late, so a killed worker's chunk is delivered
again). The message id is the idempotency key that keeps that from becoming a double send:
before dispatching, the worker claims `<prefix>sent:{<message id>}` with SET NX; a redelivered
chunk finds the claims of what it already sent and skips them. The limiter answers `duplicate`
for those (their slot is held), so the quota is not charged twice either.
"""

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.template import TemplateDoesNotExist
from django.utils import timezone

from gatekeeper.redis_client import get_redis
from limits.channels import channels
from worker.dispatchers import (
    AMBIGUOUS,
    PERMANENT,
    Renderer,
    dispatcher_for,
    send_many,
    template_check,
)
from worker.gate import CATEGORIES, MARKETING, gate_check, gate_release
from worker.models import SendChunk, SendJob

logger = logging.getLogger(__name__)

TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
CLAIM_TTL = 8 * 86400  # longer than the weekly window the limiter remembers a message for
MAX_ATTEMPTS = 5  # transient failures and Redis outages: then the recipient fails visibly
REDIS_DOWN_DELAY = 30  # seconds before a chunk that met an unavailable Redis is tried again


def _claim_key(message_id: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}sent:{{{message_id}}}"


def send_job_create(
    *,
    channel: str,
    campaign: str,
    template: str,
    recipients: Iterable[Mapping[str, Any]],
    category: str = MARKETING,
    on_capped: str = SendJob.OnCapped.DROP,
    user: Any = None,
    queue: bool = True,
) -> SendJob:
    """Validate a campaign's recipients, store them in chunks and queue one task per chunk.

    Raises ValidationError naming the field, or the recipient row (`recipients[3].user_id`).
    """
    if channel not in channels():
        raise ValidationError(
            {"channel": f"Unknown channel '{channel}'. Choose one of: {', '.join(channels())}."}
        )
    if category not in CATEGORIES:
        raise ValidationError({"category": f"Choose one of: {', '.join(CATEGORIES)}."})
    if on_capped not in SendJob.OnCapped.values:
        raise ValidationError({"on_capped": "Choose drop or defer."})
    if not campaign:
        raise ValidationError({"campaign": "Name the campaign."})
    if not isinstance(template, str) or not TEMPLATE_NAME.fullmatch(template):
        raise ValidationError(
            {
                "template": "A template name is lower-case letters, digits, - and _ (templates/<channel>/<name>/)."
            }
        )
    try:
        template_check(channel=channel, template=template)
    except TemplateDoesNotExist as exc:
        raise ValidationError(
            {"template": f"No {channel} template '{template}' (missing {exc})."}
        ) from exc
    rows = [_recipient(i, row, campaign) for i, row in enumerate(recipients)]
    if not rows:
        raise ValidationError({"recipients": "There are no recipients."})
    size = settings.GATEKEEPER_SEND_CHUNK_SIZE
    with transaction.atomic():
        job = SendJob.objects.create(
            channel=channel,
            campaign=campaign,
            template=template,
            category=category,
            on_capped=on_capped,
            total=len(rows),
            created_by=user if user is not None and user.is_authenticated else None,
        )
        chunks = SendChunk.objects.bulk_create(
            SendChunk(job=job, recipients=rows[i : i + size]) for i in range(0, len(rows), size)
        )
        if queue:
            ids = [chunk.pk for chunk in chunks]
            transaction.on_commit(lambda: _queue(ids))
    return job


def _queue(chunk_ids: list[int], countdown: float = 0) -> None:
    from worker.tasks import send_chunk

    for chunk_id in chunk_ids:
        send_chunk.apply_async((chunk_id,), countdown=countdown)


def _recipient(i: int, row: Mapping[str, Any], campaign: str) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise ValidationError({f"recipients[{i}]": "Must be an object."})
    user_id = row.get("user_id")
    if (
        isinstance(user_id, bool)
        or not isinstance(user_id, int)
        or not 0 <= user_id < 2**settings.GATEKEEPER_ID_WIDTH
    ):
        raise ValidationError({f"recipients[{i}].user_id": f"Not a user id: {user_id!r}."})
    address = row.get("address")
    if not isinstance(address, str) or not address or "\x00" in address:
        raise ValidationError(
            {f"recipients[{i}].address": "An email address or push token is required."}
        )
    message_id = row.get("message_id") or f"{campaign}:{user_id}"
    if not isinstance(message_id, str) or len(message_id) > 200 or "\x00" in message_id:
        raise ValidationError(
            {f"recipients[{i}].message_id": "At most 200 characters, without NUL."}
        )
    context = row.get("context") or {}
    if not isinstance(context, dict):
        raise ValidationError({f"recipients[{i}].context": "Must be an object."})
    if _holds_nul(context):
        # PostgreSQL's JSON columns cannot store U+0000, and no template needs it.
        raise ValidationError({f"recipients[{i}].context": "Must not contain the NUL character."})
    return {"user_id": user_id, "address": address, "message_id": message_id, "context": context}


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


def send_chunk_run(*, chunk_id: int, dispatcher: Any = None) -> dict[str, int]:
    """Gate one chunk, dispatch the admitted sends, and settle the rest. Returns outcome counts.

    Safe to run again for the same chunk (a redelivered task): a finished chunk does nothing,
    and an interrupted one sends only what it had not claimed yet.
    """
    chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
    if chunk.status != SendChunk.Status.QUEUED:
        return {}
    job = chunk.job
    if job.status == SendJob.Status.QUEUED:
        SendJob.objects.filter(pk=job.pk, status=SendJob.Status.QUEUED).update(
            status=SendJob.Status.RUNNING
        )
    recipients = chunk.recipients
    decisions = gate_check(
        channel=job.channel,
        requests=[(r["user_id"], r["message_id"]) for r in recipients],
        campaign=job.campaign,
        category=job.category,
    )
    outcomes: Counter[str] = Counter()
    retry: list[dict[str, Any]] = []
    deferred: list[tuple[dict[str, Any], float]] = []
    to_send = [(r, d) for r, d in zip(recipients, decisions, strict=True) if d.allowed]
    dispatcher = dispatcher or dispatcher_for(job.channel)
    renderer = Renderer(channel=job.channel, template=job.template, campaign=job.campaign)
    released: list[tuple[int, str]] = []
    # Claims are taken one dispatcher batch at a time, right before its send: a dispatcher that
    # sends one message per provider call has batches of one, so a worker killed mid-chunk
    # leaves at most the one send it was doing in the "sending" state. Marking what went out
    # (and unclaiming what failed) rides on the next batch's claim: one Redis round trip each.
    size = max(1, int(getattr(dispatcher, "batch_size", 1)))
    settle: list[tuple[str, str]] = []
    for start in range(0, len(to_send), size):
        batch = [recipient for recipient, _ in to_send[start : start + size]]
        previous = _claim_batch(settle, [r["message_id"] for r in batch])
        settle = []
        claimed = []
        for recipient, before in zip(batch, previous, strict=True):
            if before is None:
                claimed.append(recipient)
            elif before == "sent":
                outcomes["already_sent"] += 1  # a redelivery: it went out the first time
            else:
                # A worker died during this very send: it may have gone out. Not sending it
                # again keeps the promise that matters more for marketing (never twice).
                logger.warning(
                    "Send %s was cut off by a worker's death; not sent again",
                    recipient["message_id"],
                )
                outcomes["ambiguous"] += 1
        results = send_many(dispatcher, [renderer(r) for r in claimed])
        for recipient, error in zip(claimed, results, strict=True):
            message_id = recipient["message_id"]
            if error is None:
                settle.append(("sent", message_id))
                outcomes["sent"] += 1
            elif error.kind == AMBIGUOUS:
                logger.warning("Send %s may or may not have gone out: %s", message_id, error)
                outcomes["ambiguous"] += 1
            else:
                settle.append(("unclaim", message_id))
                if error.kind == PERMANENT or chunk.attempts + 1 >= MAX_ATTEMPTS:
                    released.append((recipient["user_id"], message_id))
                    outcomes["failed"] += 1
                else:
                    retry.append(recipient)
    if settle:
        _claim_batch(settle, [])
    if released and job.category == MARKETING:
        gate_release(channel=job.channel, requests=released)
    for recipient, decision in zip(recipients, decisions, strict=True):
        if decision.allowed:
            continue
        if (
            decision.reason in ("daily_cap", "weekly_cap")
            and job.on_capped == SendJob.OnCapped.DEFER
        ):
            deferred.append((recipient, decision.retry_after or 60.0))
        elif decision.reason == "unavailable" and chunk.attempts + 1 < MAX_ATTEMPTS:
            # Redis or the snapshot is missing: try again soon instead of dropping the send.
            deferred.append((recipient, float(REDIS_DOWN_DELAY)))
        elif decision.reason == "unavailable":
            outcomes["failed"] += 1
        else:
            outcomes["dropped"] += 1
    _settle(chunk, decisions, outcomes, retry, deferred)
    return dict(outcomes)


def _claim_batch(settle: list[tuple[str, str]], claim: list[str]) -> list[str | None]:
    """In one round trip: mark sends as `sent` or drop failed claims (`settle`), then claim
    `claim` for sending. Returns, per claimed id, None if claimed now, else what the claim
    already said ("sent", or "sending" when a worker died in the middle of that send)."""
    pipe = get_redis().pipeline(transaction=False)
    for action, message_id in settle:
        if action == "sent":
            pipe.set(_claim_key(message_id), "sent", ex=CLAIM_TTL)
        else:
            pipe.delete(_claim_key(message_id))
    for message_id in claim:
        pipe.set(_claim_key(message_id), "sending", nx=True, ex=CLAIM_TTL, get=True)
    replies = pipe.execute()[len(settle) :]
    return [r.decode() if isinstance(r, bytes) else r for r in replies]


def _settle(
    chunk: SendChunk,
    decisions: list[Any],
    outcomes: Counter[str],
    retry: list[dict[str, Any]],
    deferred: list[tuple[dict[str, Any], float]],
) -> None:
    """Record the chunk's results on the job and queue what goes on, in one transaction."""
    now = timezone.now()
    later: list[tuple[int, float]] = []
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if SendChunk.objects.filter(pk=chunk.pk, status=SendChunk.Status.DONE).exists():
            # Another delivery of this chunk's task finished first and counted it.
            return
        reasons = Counter(job.reasons)
        reasons.update(d.reason for d in decisions)
        segments = Counter(job.segments)
        segments.update(d.segment or "unknown" for d in decisions)
        job.reasons, job.segments = dict(reasons), dict(segments)
        job.sent += outcomes["sent"]
        job.failed += outcomes["failed"]
        job.processed += sum(outcomes.values())
        if retry:
            backoff = 5 * 2**chunk.attempts
            follow = SendChunk.objects.create(
                job=job,
                recipients=retry,
                attempts=chunk.attempts + 1,
                not_before=now + timedelta(seconds=backoff),
            )
            later.append((follow.pk, backoff))
        if deferred:
            wait = max(delay for _, delay in deferred)
            follow = SendChunk.objects.create(
                job=job,
                recipients=[r for r, _ in deferred],
                attempts=chunk.attempts + 1,
                not_before=now + timedelta(seconds=wait),
            )
            later.append((follow.pk, wait))
        chunk.status = SendChunk.Status.DONE
        chunk.save(update_fields=["status"])
        if job.processed >= job.total:
            job.status = SendJob.Status.DONE
        job.save()
        for chunk_id, countdown in later:
            transaction.on_commit(partial(_queue, [chunk_id], countdown=countdown))


def send_chunk_fail(*, chunk_id: int, error: str) -> None:
    """Give a chunk up after its task failed for good: the recipients it had not settled count
    as failed on the job (with the error on the chunk), so the job still finishes."""
    with transaction.atomic():
        chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if SendChunk.objects.filter(pk=chunk_id).exclude(status=SendChunk.Status.QUEUED).exists():
            return
        unsent = len(chunk.recipients)
        job.failed += unsent
        job.processed += unsent
        if job.processed >= job.total:
            job.status = SendJob.Status.DONE
        job.save()
        SendChunk.objects.filter(pk=chunk_id).update(
            status=SendChunk.Status.FAILED, error=error[:2000]
        )


def quota_reset(*, user_id: int, reason: str, user: Any = None) -> Any:
    """Forget a user's send logs in every channel and `all` (an audited admin action): records
    who, when, why and what was used, in the same transaction as the reset, so a failed reset
    leaves no record and a record always means the reset happened. Raises Unavailable."""
    from limits.channels import ALL
    from limits.limiter import get_limiter
    from limits.models import QuotaReset
    from worker.selectors import user_quota

    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": "Say why the quota is reset (kept in the audit log)."})
    quota = user_quota(user_id)
    usage = {
        scope: {"daily": values["daily"]["used"], "weekly": values["weekly"]["used"]}
        for scope, values in quota["scopes"].items()
    }
    with transaction.atomic():
        record = QuotaReset.objects.create(
            user_id=user_id,
            segment_slug=quota["segment"],
            usage=usage,
            reason=reason[:300],
            reset_by=user if user is not None and user.is_authenticated else None,
        )
        get_limiter().reset(user_id, [*channels(), ALL])
    return record
