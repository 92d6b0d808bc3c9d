"""Send jobs: created from a campaign's recipients, run chunk by chunk by the worker.

Celery delivers a task at least once (acks_late, so a killed worker's chunk is delivered
again). The message id is the idempotency key that keeps that from becoming a double send:
before dispatching, the worker claims `<prefix>sent:{<message id>}` with SET NX; a redelivered
chunk finds the claims of what it already sent and skips them. The limiter answers `duplicate`
for those (their slot is held), so the quota is not charged twice either.
"""

import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
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
        ids = [chunk.pk for chunk in chunks]
        # Handed over now (to the broker, or to the caller that runs them with queue=False):
        # send_chunks_due leaves them alone unless they are still waiting much later.
        SendChunk.objects.filter(pk__in=ids).update(queued_at=timezone.now())
        if queue:
            # robust: a broker outage here leaves the chunks for send_chunks_due, not an error
            # after the job was stored.
            transaction.on_commit(lambda: _queue(ids), robust=True)
    return job


def _queue(chunk_ids: list[int]) -> None:
    from worker.tasks import send_chunk

    for chunk_id in chunk_ids:
        send_chunk.delay(chunk_id)


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
    if not isinstance(address, str) or not address or any(c in address for c in "\x00\r\n"):
        raise ValidationError(
            {
                f"recipients[{i}].address": "An email address or push token is required (one line, no NUL)."
            }
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


class ChunkBusy(Exception):
    """Another delivery of this chunk's task holds its lease: try again after `retry_in` s."""

    def __init__(self, retry_in: float) -> None:
        super().__init__(f"chunk leased by another run for {retry_in:.0f} s more")
        self.retry_in = retry_in


def _lease_end(now: Any) -> Any:
    return now + timedelta(seconds=float(settings.GATEKEEPER_CHUNK_LEASE_SECONDS))


def _runnable(now: Any) -> Q:
    """Chunks that may run at `now`: queued, due, and not leased by a live run."""
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    return free & due & Q(status=SendChunk.Status.QUEUED)


def _lease(chunk_id: int, now: Any) -> bool:
    """Take the chunk's lease (one atomic UPDATE). Two deliveries of one task (a broker
    redelivery, the sweeper) never run at once."""
    runnable = SendChunk.objects.filter(_runnable(now), pk=chunk_id)
    return bool(runnable.update(lease_until=_lease_end(now)))


def send_chunk_run(*, chunk_id: int, dispatcher: Any = None, now: Any = None) -> dict[str, int]:
    """Gate one chunk, dispatch the admitted sends, and settle the rest. Returns outcome counts.

    Safe to run again for the same chunk (a redelivered task): a finished chunk does nothing, a
    chunk not due yet does nothing (`send_chunks_due` queues it when it is), one leased by a run
    still alive raises ChunkBusy, and an interrupted one sends only what it had not claimed.
    `now` (tests) is the time the chunk's lease and due date are judged at.
    """
    now = now or timezone.now()
    if not _lease(chunk_id, now):
        chunk = SendChunk.objects.filter(pk=chunk_id).first()
        if chunk is None or chunk.status != SendChunk.Status.QUEUED:
            return {}
        if chunk.not_before is not None and chunk.not_before > now:
            return {}
        until = chunk.lease_until or now
        raise ChunkBusy(max(1.0, (until - now).total_seconds() + 1))
    try:
        return _run_leased(chunk_id, dispatcher)
    except BaseException:
        # Give the lease back so the task's retry can take the chunk at once.
        SendChunk.objects.filter(pk=chunk_id, status=SendChunk.Status.QUEUED).update(
            lease_until=None
        )
        raise


def _run_leased(chunk_id: int, dispatcher: Any) -> dict[str, int]:
    chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
    job = chunk.job
    if job.status == SendJob.Status.QUEUED:
        SendJob.objects.filter(pk=job.pk, status=SendJob.Status.QUEUED).update(
            status=SendJob.Status.RUNNING
        )
    # Before gating: a missing template or a dispatcher that cannot start fails the chunk
    # without charging anybody's quota.
    renderer = Renderer(channel=job.channel, template=job.template, campaign=job.campaign)
    dispatcher = dispatcher or dispatcher_for(job.channel)
    recipients = chunk.recipients
    decisions = gate_check(
        channel=job.channel,
        requests=[(r["user_id"], r["message_id"]) for r in recipients],
        campaign=job.campaign,
        category=job.category,
    )
    outcomes: Counter[str] = Counter()
    retry: list[dict[str, Any]] = []
    to_send = [r for r, d in zip(recipients, decisions, strict=True) if d.allowed]
    released: list[tuple[int, str]] = []
    # Claims are taken one dispatcher batch at a time, right before its send: a dispatcher that
    # sends one message per provider call has batches of one, so a worker killed mid-chunk
    # leaves at most the one send it was doing in the "sending" state. Marking what went out
    # (and unclaiming what failed) rides on the next batch's claim: one Redis round trip each.
    size = max(1, int(getattr(dispatcher, "batch_size", 1)))
    settle: list[tuple[str, str]] = []
    renew_every = float(settings.GATEKEEPER_CHUNK_LEASE_SECONDS) / 3
    renewed = time.monotonic()
    for start in range(0, len(to_send), size):
        if time.monotonic() - renewed > renew_every:
            SendChunk.objects.filter(pk=chunk_id).update(lease_until=_lease_end(timezone.now()))
            renewed = time.monotonic()
        # Rendered before claiming: a message that cannot be rendered never went out.
        batch, messages = [], []
        for recipient in to_send[start : start + size]:
            try:
                messages.append(renderer(recipient))
                batch.append(recipient)
            except Exception as exc:
                logger.warning("Send %s cannot be rendered: %s", recipient["message_id"], exc)
                released.append((recipient["user_id"], recipient["message_id"]))
                outcomes["failed"] += 1
        previous = _claim_batch(settle, [r["message_id"] for r in batch])
        settle = []
        claimed, claimed_messages = [], []
        for recipient, message, before in zip(batch, messages, previous, strict=True):
            if before is None:
                claimed.append(recipient)
                claimed_messages.append(message)
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
        results = send_many(dispatcher, claimed_messages)
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
    capped: list[tuple[dict[str, Any], float]] = []
    unavailable: list[dict[str, Any]] = []
    for recipient, decision in zip(recipients, decisions, strict=True):
        if decision.allowed:
            continue
        if (
            decision.reason in ("daily_cap", "weekly_cap")
            and job.on_capped == SendJob.OnCapped.DEFER
        ):
            capped.append((recipient, decision.retry_after or 60.0))
        elif decision.reason == "unavailable" and chunk.attempts + 1 < MAX_ATTEMPTS:
            # Redis or the snapshot is missing: try again soon instead of dropping the send.
            unavailable.append(recipient)
        elif decision.reason == "unavailable":
            outcomes["failed"] += 1
        else:
            outcomes["dropped"] += 1
    follow_ups: list[tuple[list[dict[str, Any]], float, int]] = []
    if retry:  # transient failures: backoff, and an attempt spent
        follow_ups.append((retry, 5 * 2**chunk.attempts, chunk.attempts + 1))
    if unavailable:  # Redis or the snapshot missing: soon, and an attempt spent
        follow_ups.append((unavailable, float(REDIS_DOWN_DELAY), chunk.attempts + 1))
    if capped:  # waiting for a slot is not a failure: no attempt spent
        follow_ups.append(([r for r, _ in capped], max(d for _, d in capped), chunk.attempts))
    _settle(chunk, decisions, outcomes, follow_ups)
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
    return _claim_states(pipe.execute()[len(settle) :])


def _claim_states(replies: list[Any]) -> list[str | None]:
    """Claim values as text: None (no claim), "sending" or "sent"."""
    return [r.decode() if isinstance(r, bytes) else r for r in replies]


def _still_queued(chunk_id: int) -> bool:
    """Inside the job's lock: False when another delivery already settled or gave up the chunk."""
    return SendChunk.objects.filter(pk=chunk_id, status=SendChunk.Status.QUEUED).exists()


def _count_on_job(job: SendJob, outcomes: Counter[str]) -> None:
    """Add a chunk's outcomes to its (locked) job; the job is done once all have one."""
    job.sent += outcomes["sent"]
    job.failed += outcomes["failed"]
    job.processed += sum(outcomes.values())
    if job.processed >= job.total:
        job.status = SendJob.Status.DONE
    job.save()


def _settle(
    chunk: SendChunk,
    decisions: list[Any],
    outcomes: Counter[str],
    follow_ups: list[tuple[list[dict[str, Any]], float, int]],
) -> None:
    """Record the chunk's results on the job and store its follow-up chunks (recipients, delay,
    attempts), in one transaction. Follow-ups wait in the database, not in the broker:
    `send_chunks_due` queues each when its `not_before` comes."""
    now = timezone.now()
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if not _still_queued(chunk.pk):
            return  # another delivery of this chunk's task finished first and counted it
        reasons = Counter(job.reasons)
        reasons.update(d.reason for d in decisions)
        segments = Counter(job.segments)
        segments.update(d.segment or "unknown" for d in decisions)
        job.reasons, job.segments = dict(reasons), dict(segments)
        for recipients, delay, attempts in follow_ups:
            SendChunk.objects.create(
                job=job,
                recipients=recipients,
                attempts=attempts,
                not_before=now + timedelta(seconds=delay),
            )
        chunk.status = SendChunk.Status.DONE
        chunk.lease_until = None
        chunk.save(update_fields=["status", "lease_until"])
        _count_on_job(job, outcomes)


def send_chunks_due(*, now: Any = None) -> int:
    """Queue the chunks that should run now (run by beat every few seconds): follow-ups whose
    `not_before` has come, and chunks queued long ago whose task was lost (a broker or database
    failure at the wrong moment). A chunk run twice is harmless: the lease lets one run, and a
    finished chunk does nothing. Returns how many were queued."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.GATEKEEPER_CHUNK_REQUEUE_SECONDS)
    waiting = Q(queued_at__isnull=True) | Q(queued_at__lt=stale)
    ids = list(
        SendChunk.objects.filter(_runnable(now), waiting)
        .order_by("pk")
        .values_list("pk", flat=True)[:1000]
    )
    if not ids:
        return 0
    SendChunk.objects.filter(pk__in=ids).update(queued_at=now)
    _queue(ids)
    return len(ids)


def send_chunk_fail(*, chunk_id: int, error: str) -> None:
    """Give a chunk up after its task failed for good, so the job still finishes. What the
    claims say decides each recipient: `sent` counts as sent, `sending` as ambiguous (kept),
    and an unclaimed one as failed with its quota given back (the gate may have charged it).
    With Redis unreachable too, every recipient counts as failed and nothing is released."""
    chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
    if chunk.status != SendChunk.Status.QUEUED:
        return
    recipients = chunk.recipients
    outcomes: Counter[str] = Counter()
    unclaimed: list[tuple[int, str]] = []
    try:
        pipe = get_redis().pipeline(transaction=False)
        for r in recipients:
            pipe.get(_claim_key(r["message_id"]))
        claims: list[str | None] | None = _claim_states(pipe.execute())
    except redis.RedisError:
        claims = None
    if claims is None:
        outcomes["failed"] = len(recipients)
    else:
        for r, state in zip(recipients, claims, strict=True):
            if state == "sent":
                outcomes["sent"] += 1
            elif state == "sending":
                outcomes["ambiguous"] += 1
            else:
                outcomes["failed"] += 1
                unclaimed.append((r["user_id"], r["message_id"]))
        if unclaimed and chunk.job.category == MARKETING:
            try:
                gate_release(channel=chunk.job.channel, requests=unclaimed)
            except Exception:
                logger.warning("Could not give back the quota of %d sends", len(unclaimed))
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if not _still_queued(chunk_id):
            return
        _count_on_job(job, outcomes)
        SendChunk.objects.filter(pk=chunk_id).update(
            status=SendChunk.Status.FAILED, error=error[:2000], lease_until=None
        )


def quota_reset(*, user_id: int, reason: str, user: Any = None) -> Any:
    """Forget a user's send logs in every channel and `all` (an audited admin action): records
    who, when, why and what was used, in the same transaction as the reset, so a failed reset
    leaves no record and a record always means the reset happened. Raises Unavailable."""
    from limits.channels import scopes
    from limits.limiter import get_limiter
    from limits.models import QuotaReset
    from worker.selectors import Unavailable, user_quota

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
        try:
            get_limiter().reset(user_id, scopes())
        except redis.RedisError as exc:  # the audit row is rolled back with the transaction
            raise Unavailable(f"Redis is not answering ({exc}); nothing was reset.") from exc
    return record
