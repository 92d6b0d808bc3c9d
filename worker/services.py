"""Writes of the worker app: send jobs handed over (validated, stored in chunks, queued on
commit for `worker.tasks.send_chunk`, whose work is `worker.chunks`), a job's waiting sends
cancelled, and quota resets.
"""

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.template import TemplateDoesNotExist
from django.utils import timezone

from gatekeeper.lib.bodies import DATETIME_WORDS, json_value_problem
from gatekeeper.lib.ids import max_user_id, user_id_from_json
from gatekeeper.lib.zones import UnknownTimeZone, zone
from limits.channels import validate_channel
from limits.limiter import get_limiter
from limits.models import QuotaReset
from limits.policy import DEFAULT_PRIORITY, PRIORITIES
from limits.rules import tags_problem
from worker import tasks
from worker.chunks import waiting_close
from worker.dispatchers import (
    TEMPLATE_NAME_RE,
    TEMPLATE_NAME_WORDS,
    dispatcher_class,
    template_check,
)
from worker.gate import MARKETING, validate_category
from worker.models import (
    CAMPAIGN_MAX,
    EXPIRY_MAX,
    MESSAGE_ID_MAX,
    SendChunk,
    SendJob,
    expiry_default,
)
from worker.selectors import Unavailable, user_quota

logger = logging.getLogger(__name__)

CONTEXT_DEPTH = 16  # levels of arrays and objects a recipient's template context may nest
INVALID_ROWS_KEPT = 100  # invalid rows kept on a job (with on_invalid: skip) to show why
REJECTED_ROWS_SHOWN = 20  # bad rows named in a 400 (with on_invalid: reject)


def send_job_create(
    *,
    channel: str,
    campaign: str,
    template: str,
    recipients: Iterable[Mapping[str, Any]],
    category: str = MARKETING,
    on_capped: str = SendJob.OnCapped.DROP,
    on_invalid: str = SendJob.OnInvalid.REJECT,
    tags: Iterable[str] = (),
    priority: int = DEFAULT_PRIORITY,
    expires_at: datetime | None = None,
    user: Any = None,
    queue: bool = True,
) -> SendJob:
    """Validate a campaign's recipients, store them in chunks and queue one task per chunk.

    Every send of the job carries `tags` (tag rules count them) and `priority` (a rule's
    reserve reads it); a recipient may name its `time_zone`, which decides its calendar days.
    `expires_at` (aware, in the future, at most EXPIRY_MAX ahead; default EXPIRY_DEFAULT after
    now): sends the gate deferred that still wait then are dropped as expired.
    Raises ValidationError naming the field, or the recipient row (`recipients[3].address`).
    A bad row (not a user id, an address the channel cannot send to, a message id used twice,
    a context that cannot be stored, an unknown time zone) refuses the whole job with
    `on_invalid="reject"`; with "skip" it is counted as `invalid`, its reason kept on the job,
    and the rest goes out.
    """
    try:
        validate_channel(channel)
    except ValidationError as exc:
        raise ValidationError({"channel": exc.messages}) from None
    try:
        validate_category(category)
    except ValidationError as exc:
        raise ValidationError({"category": exc.messages}) from None
    if on_capped not in SendJob.OnCapped.values:
        raise ValidationError({"on_capped": "Choose drop or defer."})
    if on_invalid not in SendJob.OnInvalid.values:
        raise ValidationError({"on_invalid": "Choose reject or skip."})
    if not campaign or len(campaign) > CAMPAIGN_MAX:
        raise ValidationError(
            {
                "campaign": f"Name the campaign in at most {CAMPAIGN_MAX} characters (it starts "
                "the default message ids, <campaign>:<user_id>)."
            }
        )
    job_tags = _tags_checked(tags)
    expiry = _expiry_checked(expires_at)
    low, high = PRIORITIES
    if type(priority) is not int or not low <= priority <= high:  # a bool is no priority
        raise ValidationError(
            {
                "priority": f"From {low} to {high}, higher is more important (default "
                f"{DEFAULT_PRIORITY}); {str(priority)[:20]!r} is not."
            }
        )
    if not isinstance(template, str) or not TEMPLATE_NAME_RE.fullmatch(template):
        raise ValidationError({"template": TEMPLATE_NAME_WORDS})
    try:
        template_check(channel=channel, template=template)
    except TemplateDoesNotExist as exc:
        raise ValidationError(
            {"template": f"No {channel} template '{template}' (missing {exc})."}
        ) from exc
    rows, invalid, repeats = _rows(recipients, campaign=campaign, channel=channel)
    if not rows and not invalid:
        raise ValidationError({"recipients": "There are no recipients."})
    if invalid and on_invalid == SendJob.OnInvalid.REJECT:
        raise ValidationError(
            {
                f"recipients[{bad['row']}].{bad['field']}": bad["message"]
                for bad in invalid[:REJECTED_ROWS_SHOWN]
            }
        )
    size = settings.GATEKEEPER_SEND_CHUNK_SIZE
    with transaction.atomic():
        job = SendJob.objects.create(
            channel=channel,
            campaign=campaign,
            template=template,
            category=category,
            tags=list(job_tags),
            priority=priority,
            on_capped=on_capped,
            on_invalid=on_invalid,
            expires_at=expiry,
            total=len(rows) + len(invalid) + repeats,
            invalid=len(invalid),
            duplicate=repeats,
            invalid_rows=invalid[:INVALID_ROWS_KEPT],
            status=SendJob.Status.QUEUED if rows else SendJob.Status.DONE,
            created_by=user if user is not None and user.is_authenticated else None,
        )
        chunks = SendChunk.objects.bulk_create(
            SendChunk(job=job, recipients=rows[i : i + size], size=len(rows[i : i + size]))
            for i in range(0, len(rows), size)
        )
        ids = [chunk.pk for chunk in chunks]
        # Handed over now (to the broker, or to the caller that runs them with queue=False):
        # send_chunks_due leaves them alone unless they are still waiting much later.
        SendChunk.objects.filter(pk__in=ids).update(queued_at=timezone.now())
        if queue and ids:
            # robust: a broker outage here leaves the chunks for beat's send_chunks_due, not
            # an error after the job was stored.
            transaction.on_commit(lambda: tasks.send_chunks(ids), robust=True)
    return job


def _expiry_checked(expires_at: Any) -> Any:
    """The job's expiry: given, an aware instant in the future and at most EXPIRY_MAX ahead;
    not given, EXPIRY_DEFAULT from now. A ValidationError naming `expires_at` otherwise."""
    if expires_at is None:
        return expiry_default()
    days = EXPIRY_MAX.days
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        raise ValidationError({"expires_at": f"The UTC offset is missing. {DATETIME_WORDS}"})
    now = timezone.now()
    if expires_at <= now:
        raise ValidationError(
            {"expires_at": f"Must be in the future; {expires_at.isoformat()} has passed."}
        )
    if expires_at > now + EXPIRY_MAX:
        raise ValidationError(
            {"expires_at": f"At most {days} days ahead; {expires_at.isoformat()} is later."}
        )
    return expires_at


def _tags_checked(tags: Iterable[str]) -> tuple[str, ...]:
    """The job's tags by limits.rules.tags_problem; a ValidationError naming `tags` otherwise."""
    if isinstance(tags, str):
        raise ValidationError({"tags": "A list of tags, not one string."})
    given = tuple(tags)
    problem = tags_problem(given)
    if problem is not None:
        raise ValidationError({"tags": problem[1]})
    return given


def _rows(
    recipients: Iterable[Mapping[str, Any]], *, campaign: str, channel: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(valid rows as stored, invalid rows as {row, field, message}, repeats), in order.

    A row repeating an earlier row's message id for the same user is a repeat: the user gets
    one send, and the repeat counts as a duplicate. The same message id for another user is
    invalid: one of the two sends would be lost."""
    address_problem = dispatcher_class(channel).address_problem
    maximum = max_user_id()
    first_use: dict[str, tuple[int, int]] = {}  # message id -> (row, user id)
    rows: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    repeats = 0
    for i, row in enumerate(recipients):
        try:
            recipient = _recipient(row, campaign, address_problem, maximum)
            message_id, user_id = recipient["message_id"], recipient["user_id"]
            if message_id in first_use:
                first, first_user = first_use[message_id]
                if first_user == user_id:
                    repeats += 1
                    continue
                raise _RowError(
                    "message_id",
                    f"'{message_id}' is the message id of recipients[{first}], another user; "
                    "each send needs its own.",
                )
            first_use[message_id] = (i, user_id)
            rows.append(recipient)
        except _RowError as exc:
            invalid.append({"row": i, "field": exc.field, "message": exc.message})
    return rows, invalid, repeats


class _RowError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _recipient(
    row: Mapping[str, Any], campaign: str, address_problem: Any, maximum: int
) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise _RowError("user_id", "A recipient is an object with user_id and address.")
    try:
        user_id = user_id_from_json(row.get("user_id"), maximum=maximum)
    except ValueError as exc:
        raise _RowError("user_id", str(exc)) from None
    address = row.get("address")
    if not isinstance(address, str) or not address:
        raise _RowError("address", "An email address or push token is required.")
    problem = address_problem(address)
    if problem:
        raise _RowError("address", problem)
    message_id = row.get("message_id") or f"{campaign}:{user_id}"
    if not isinstance(message_id, str) or len(message_id) > MESSAGE_ID_MAX:
        raise _RowError(
            "message_id", f"A message id is a string of at most {MESSAGE_ID_MAX} characters."
        )
    if "\x00" in message_id:
        raise _RowError("message_id", "Must not contain the NUL character (\\u0000).")
    context = row.get("context") or {}
    if not isinstance(context, dict):
        raise _RowError("context", "Must be an object (the template's variables).")
    # Most sends of a campaign carry no variables of their own: nothing to walk.
    problem = json_value_problem(context, max_depth=CONTEXT_DEPTH) if context else None
    if problem:
        raise _RowError("context", problem)
    recipient = {
        "user_id": user_id,
        "address": address,
        "message_id": message_id,
        "context": context,
    }
    time_zone = row.get("time_zone")
    if time_zone is not None:
        # Kept only when given: most rows have none, and chunks stay small without it.
        if not isinstance(time_zone, str):
            raise _RowError("time_zone", "An IANA time zone name, such as Europe/Paris.")
        try:
            zone(time_zone)
        except UnknownTimeZone as exc:
            raise _RowError("time_zone", str(exc)) from None
        recipient["time_zone"] = time_zone
    return recipient


def send_job_cancel_waiting(*, job: SendJob, user: Any = None, now: Any = None) -> SendJob:
    """Cancel a job's waiting sends (deferred by the gate, not yet gone out): each counts as
    `cancelled`, and so does every send the job defers from now on. Sends being gated or sent
    at this moment (a run holds their chunk) are not waiting and go on. Idempotent: a second
    call cancels what was deferred since (nothing, unless a run settled meanwhile).

    Who and when are kept on the job. Chunks that a run took before (it died or raised) are
    closed by their claims, which needs Redis; without it they are left to beat's
    `send_chunks_due`, which ends them within seconds of Redis answering. Returns the job, as
    it is now."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        if locked.waiting_cancelled_at is None:
            locked.waiting_cancelled_at = now
            locked.waiting_cancelled_by = (
                user if user is not None and user.is_authenticated else None
            )
            locked.save(update_fields=["waiting_cancelled_at", "waiting_cancelled_by"])
    ended = waiting_close(now=now, job_id=job.pk)
    logger.info(
        "Job %s: waiting sends cancelled by %s (%s)",
        job.pk,
        getattr(user, "username", None) or "a command",
        ", ".join(f"{n} {how}" for how, n in ended.items()) or "none were waiting",
    )
    job.refresh_from_db()
    return job


def quota_reset(*, user_id: int, reason: str, user: Any = None) -> Any:
    """Forget a user's send log, every channel (an audited admin action): records
    who, when, why and what was used, in the same transaction as the reset, so a failed reset
    leaves no record and a record always means the reset happened. Raises Unavailable."""
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
            get_limiter().reset(user_id)
        except redis.RedisError as exc:  # the audit row is rolled back with the transaction
            raise Unavailable(f"Redis is not answering ({exc}); nothing was reset.") from exc
    return record
