"""Writes of the worker app: send jobs handed over (validated, stored in chunks, queued on
commit for `worker.tasks.send_chunk`, whose work is `worker.chunks`), a job joining a round
(`round`, `value`), a job's waiting sends cancelled, and quota resets. The rounds themselves
are written in worker/round_services.py, with the rules of this module.
"""

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import transaction
from django.db.models import Min, Sum
from django.template import TemplateDoesNotExist
from django.utils import timezone
from rest_framework.exceptions import ValidationError as DrfValidationError

from gatekeeper.lib.accounts import Actor, account_acting
from gatekeeper.lib.binding import large_rows_created
from gatekeeper.lib.bodies import DATETIME_WORDS
from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.files import storage_name
from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.channels import ALL, validate_channel
from limits.engine.limiter import get_limiter
from limits.engine.reservations import holds_without
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES
from limits.engine.topics import topic_problem
from limits.ledger.reports import first_day_kept
from limits.models.ledger import LedgerCount
from limits.policy.drafts import draft_applied
from limits.policy.quota import Unavailable
from limits.policy.rules import tags_problem
from limits.policy.selectors import topics_read
from limits.reasons import Category, validate_category
from segments.store import NotFound, StoreError, key_problem, store_from_settings
from worker import tasks
from worker.backtest import policy_mark
from worker.chunks import chunks_runnable, waiting_close
from worker.delivery.rendering import TEMPLATE_NAME_RE, TEMPLATE_NAME_WORDS, template_check
from worker.models import (
    EXPIRY_DEFAULT,
    EXPIRY_MAX,
    JOB_CAMPAIGN_MAX,
    ROUND_JOBS_MAX,
    START_MAX,
    Backtest,
    BacktestPart,
    Round,
    SendChunk,
    SendJob,
)
from worker.plan import plan_computing, plan_inputs, plan_latest
from worker.planned import recipients_packed
from worker.preparing import (
    INVALID_ROWS_KEPT,
    REJECTED_ROWS_SHOWN,
    STORE_PREFIX,
    file_removed_on_commit,
    handed_size,
)
from worker.recipients import (
    FileError,
    RecipientRules,
    RowError,
    line_words,
    recipient_lines,
    value_problem,
)
from worker.scheduling import job_started, staged_cancel

logger = logging.getLogger(__name__)


def send_job_create(  # type: ignore[explicit-any]  # rows and fields as the JSON body gives them
    *, recipients: Iterable[Mapping[str, Any]], queue: bool = True, **given: Any
) -> SendJob:
    """Validate a campaign's recipients, store them in chunks and queue one task per chunk.
    `given`: the job's fields, as `_job_fields` takes them (channel, campaign, template; category,
    on_capped, on_invalid, tags, priority, expires_at and user have defaults there).

    Every send of the job carries `tags` (tag rules count them), `priority` (a rule's
    reserve reads it) and its `topic` (a topic's slug, sent on the job's channel; the ledger
    keeps it); a recipient may name its `time_zone`, which decides its calendar days.
    `start_at` (aware, in the future, at most START_MAX ahead; default none): the job waits as
    `scheduled` until then (worker.scheduling starts it), and can be edited (send_job_edit),
    started early (send_job_start) or cancelled meanwhile. `reserve` (a scheduled job only):
    its predicted sends hold their slots until it starts (worker/plan.py,
    limits.engine.reservations). `expires_at` (aware, after the start, at most EXPIRY_MAX after it;
    default EXPIRY_DEFAULT after the start): sends the gate deferred that still wait then are
    dropped as expired. `round` (a Round or its id, open and not closed) and `value` (a
    number >= 0): the job competes in the round (_job_fields says on which terms), waiting as a
    scheduled job that starts at the round's send_at; a recipient's own `value` replaces the
    job's for them, and without a job value every recipient needs one. Raises ValidationError
    naming the field, or the recipient row (`recipients[3].address`). A bad row (not a user id,
    an address the channel cannot send to, a message id used twice, a context that cannot be
    stored, an unknown time zone, a value that is not a number >= 0) refuses the whole job with
    `on_invalid="reject"`; with "skip" it is counted as `invalid`, its reason kept on the job,
    and the rest goes out.
    """
    fields = _job_fields(**given)
    value_required = fields["round"] is not None and fields["value"] is None
    if value_required:
        recipients = list(recipients)
        for i, row in enumerate(recipients):
            if not isinstance(row, Mapping) or row.get("value") is None:
                raise ValidationError({"value": _value_missing(f"recipients[{i}] has none")})
    rows, invalid, repeats = _rows(
        recipients,
        campaign=fields["campaign"],
        channel=fields["channel"],
        value_required=value_required,
    )
    if not rows and not invalid:
        raise ValidationError({"recipients": "There are no recipients."})
    if invalid and fields["on_invalid"] == SendJob.OnInvalid.REJECT:
        raise ValidationError(
            {
                f"recipients[{bad['row']}].{bad['field']}": bad["message"]
                for bad in invalid[:REJECTED_ROWS_SHOWN]
            }
        )
    size = settings.GATEKEEPER_SEND_CHUNK_SIZE
    scheduled = fields["start_at"] is not None and bool(rows)
    if scheduled:
        status = SendJob.Status.SCHEDULED
    else:
        status = SendJob.Status.QUEUED if rows else SendJob.Status.DONE
    with transaction.atomic():
        _round_still_open(fields)
        job = SendJob.objects.create(
            **fields,
            total=len(rows) + len(invalid) + repeats,
            invalid=len(invalid),
            duplicate=repeats,
            invalid_rows=invalid[:INVALID_ROWS_KEPT],
            status=status,
            started_at=None if scheduled else timezone.now(),
        )
        chunk_status = SendChunk.Status.STAGED if scheduled else SendChunk.Status.QUEUED
        chunks = large_rows_created(
            SendChunk,
            (
                SendChunk(
                    job=job,
                    recipients=rows[i : i + size],
                    size=len(rows[i : i + size]),
                    status=chunk_status,
                    # What the forward plan reads of a job that waits for its start.
                    plan=recipients_packed(rows[i : i + size]) if scheduled else None,
                )
                for i in range(0, len(rows), size)
            ),
        )
        ids = [] if scheduled else [chunk.pk for chunk in chunks]
        # Handed over now (to the broker, or to the caller that runs them with queue=False):
        # send_chunks_due leaves them alone unless they are still waiting much later. A
        # scheduled job's wait, staged, for its start (worker.scheduling).
        SendChunk.objects.filter(pk__in=ids).update(queued_at=timezone.now())
        if queue and ids:
            # robust: a broker outage here leaves the chunks for beat's send_chunks_due, not
            # an error after the job was stored.
            transaction.on_commit(lambda: tasks.send_chunks(ids), robust=True)
    return job


HEAD_LINES = 1000  # lines of a file checked while its caller waits (the rest in the background)


def send_job_from_file(  # type: ignore[explicit-any]  # an upload or a file; fields as the JSON body gives them
    *,
    fileobj: Any = None,
    name: str = "",
    key: str | None = None,
    queue: bool = True,
    keep_upload: bool = True,
    **job: Any,
) -> SendJob:
    """Hand over a campaign whose recipients are a file (worker/recipients.py says its format):
    an upload (`fileobj`, a binary stream such as an uploaded file, with its `name`), or `key`, an
    object in the configured store. `job` takes send_job_create's other arguments.

    The job's fields and the file's first HEAD_LINES lines are checked here (a ValidationError
    naming `recipients_file` or `recipients_key` with the line); the job is stored as
    `preparing` and, with `queue`, `send_job_prepare` is queued once the transaction commits.
    That reads the whole file in the background, staging it in chunks that it hands to the
    workers as it goes; a bad line found then fails the job with its line named (nothing after
    it is sent: worker/preparing.py).
    An upload is kept (in the media storage) until it is read; with `keep_upload=False` the
    caller reads it itself (`send_job_prepare_run(stream=...)`, as `send_campaign` does)."""
    fields = _job_fields(**job)
    if (fileobj is None) == (key is None):
        raise ValidationError({"recipients_file": "Give the recipients as a file or a store key."})
    field = "recipients_key" if key is not None else "recipients_file"
    if key is not None:
        problem = key_problem(key)
        if problem:
            raise ValidationError({field: problem})
        try:
            stream, size = store_from_settings().open(key)
        except NotFound:
            raise ValidationError({field: f"There is no object '{key}' in the store."}) from None
        except StoreError as exc:
            raise Unavailable(f"The store could not be read: {exc}") from exc
        try:
            _head_checked(stream, fields, field)
        finally:
            stream.close()
        source = f"{STORE_PREFIX}{key}"
    else:
        size = _size(fileobj)
        _head_checked(fileobj, fields, field)
        fileobj.seek(0)
        source = (name or "recipients.csv")[:1024]
    with transaction.atomic():
        _round_still_open(fields)
        job_row = SendJob(
            **fields, status=SendJob.Status.PREPARING, source=source, source_bytes=size
        )
        if fileobj is not None and keep_upload:
            job_row.file.save(storage_name(source, "recipients.csv"), File(fileobj), save=False)
        job_row.save()
        if queue:
            transaction.on_commit(lambda: tasks.send_job_prepare.delay(job_row.pk), robust=True)
    return job_row


def _size(fileobj: Any) -> int:  # type: ignore[explicit-any]  # an upload or a file
    size = getattr(fileobj, "size", None)
    if size is None:
        fileobj.seek(0, 2)
        size = fileobj.tell()
        fileobj.seek(0)
    return int(size)


def _head_checked(stream: Any, fields: dict[str, Any], field: str) -> None:  # type: ignore[explicit-any]  # a stream of any kind; the fields _job_fields made
    """The first HEAD_LINES lines of a campaign file, as its reading will check them: a
    ValidationError naming `field` and the lines (bad rows only with on_invalid: reject), or
    naming `value` for a round job without a value whose file has no value column."""
    rules = RecipientRules(
        channel=fields["channel"],
        campaign=fields["campaign"],
        value_required=fields["round"] is not None and fields["value"] is None,
    )
    bad: list[str] = []
    try:
        for i, line in enumerate(recipient_lines(stream, rules)):
            if line.error is not None and fields["on_invalid"] == SendJob.OnInvalid.REJECT:
                bad.append(line_words(line.number, line.error.field, line.error.message))
            if i + 1 >= HEAD_LINES or len(bad) >= REJECTED_ROWS_SHOWN:
                break
    except FileError as exc:
        raise ValidationError({exc.field or field: exc.messages}) from None
    if bad:
        raise ValidationError({field: bad})


def send_job_pause(*, job: SendJob, user: Actor = None) -> SendJob:
    """Stop handing out the job's chunks until it is resumed: a chunk being gated or sent at
    this moment finishes; the others stay queued (a job still being read is read to the end and
    then waits). Waiting sends still expire at the job's expiry. Idempotent."""
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        _not_ended(locked, "paused")
        if locked.paused_at is None:
            locked.paused_at = timezone.now()
            if locked.status not in (SendJob.Status.PREPARING, SendJob.Status.SCHEDULED):
                locked.status = SendJob.Status.PAUSED
            locked.save(update_fields=["paused_at", "status", "updated_at"])
    logger.info("Job %s paused by %s", job.pk, _who(user))
    return locked


def send_job_resume(*, job: SendJob, user: Actor = None, queue: bool = True) -> SendJob:
    """Hand out a paused job's chunks again (those due now; deferred ones at their release)."""
    now = timezone.now()
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        _not_ended(locked, "resumed")
        ids: list[int] = []
        if locked.paused_at is not None:
            locked.paused_at = None
            if locked.status == SendJob.Status.PAUSED:
                locked.status = (
                    SendJob.Status.RUNNING if locked.processed else SendJob.Status.QUEUED
                )
            locked.save(update_fields=["paused_at", "status", "updated_at"])
            ids = chunks_runnable(job_id=locked.pk, now=now)
        if queue and ids:
            transaction.on_commit(lambda: tasks.send_chunks(ids), robust=True)
    logger.info("Job %s resumed by %s: %d chunks handed out", job.pk, _who(user), len(ids))
    return locked


def send_job_cancel(*, job: SendJob, user: Actor = None) -> SendJob:
    """Cancel the whole job: nothing of it goes out from now on. Its queued and waiting sends
    count as `cancelled` (a chunk a run took before is settled by its claims, as a given-up
    chunk is); a chunk being gated or sent at this moment finishes, and its deferrals are
    cancelled. A job still being read stops reading. Idempotent; the job is `cancelled` once
    every send has its outcome."""
    now = timezone.now()
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        if locked.status in (SendJob.Status.DONE, SendJob.Status.FAILED):
            raise Conflict(f"The job is {locked.status}: nothing to cancel.", field="status")
        if locked.cancelled_at is None:
            locked.cancelled_at = now
            locked.cancelled_by = account_acting(user)
            if locked.waiting_cancelled_at is None:
                locked.waiting_cancelled_at = now
                locked.waiting_cancelled_by = locked.cancelled_by
            locked.paused_at = None
            reading = locked.prepare_lease_until is not None and locked.prepare_lease_until > now
            if locked.status == SendJob.Status.PREPARING and not reading:
                # No run reads its file: cancelled here (a run would stop at its next write).
                # What a run that died had handed out ends as its chunks do (closed below).
                SendChunk.objects.filter(job=locked, status=SendChunk.Status.STAGED).delete()
                locked.total = handed_size(locked.pk)
                locked.status = SendJob.Status.RUNNING if locked.total else SendJob.Status.CANCELLED
                file_removed_on_commit(locked)
            elif locked.status == SendJob.Status.SCHEDULED:
                staged_cancel(locked)  # nothing of it was handed out
            if locked.reserve:
                _holds_dropped_on_commit(locked.pk)
            locked.save()
    if locked.status not in (SendJob.Status.PREPARING, SendJob.Status.CANCELLED):
        waiting_close(now=now, job_id=job.pk)
    logger.info("Job %s cancelled by %s", job.pk, _who(user))
    job.refresh_from_db()
    return job


# The fields of a job that can change until it starts: its recipients, channel and campaign
# (which the message ids are made of) cannot; cancel it and hand over another instead. Its
# round and value change only while the round is open (a job joins, leaves, changes its value).
EDITABLE = (
    "start_at",
    "reserve",
    "expires_at",
    "template",
    "tags",
    "priority",
    "topic",
    "on_capped",
    "round",
    "value",
)


def send_job_edit(*, job: SendJob, changes: Mapping[str, Any], user: Actor = None) -> SendJob:  # type: ignore[explicit-any]  # fields as the JSON body gives them
    """Change a job that has not started (scheduled, or its file still being read with a start
    ahead): any of EDITABLE, checked as at creation (a ValidationError naming the field); a new
    `start_at` reschedules it. A Conflict once it has started (or was cancelled), or for a field
    that cannot change. Returns the job as it is now.

    `round` (a round's id, or None to leave it) and `value`: a job joins an open round (its
    start moves to the round's send_at, its expiry by as much unless given), leaves it (it stays
    scheduled at its start, its value dropped) or changes its value, while the round it is in
    and the one it joins are open and not closed (a Conflict naming `round` otherwise; nothing
    of a job can change once its round closed). A job in a round starts at the round's send_at:
    another start_at is a ValidationError naming it."""
    fixed = sorted(set(changes) - set(EDITABLE))
    if fixed:
        raise ValidationError(
            {
                fixed[0]: f"Cannot change once handed over (only {', '.join(EDITABLE)} can, "
                "until the job starts); cancel the job and hand over another."
            }
        )
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        if not locked.waits_to_start or locked.cancelled_at is not None:
            raise Conflict(_started_words(locked, "edited"), field="status")
        now = timezone.now()
        if locked.round_id is not None:
            problem = round_open_problem(_round_locked(locked.round_id), now=now)
            if problem is not None:
                raise Conflict(
                    f"{problem} Send job {locked.pk} can no longer change.", field="round"
                )
        current = {name: getattr(locked, name) for name in EDITABLE}
        if "start_at" in changes and changes["start_at"] is None:
            raise ValidationError({"start_at": "Give the new start (to start it now, use start/)."})
        merged = {**current, **changes}
        joining = _round_id(changes.get("round")) not in (None, locked.round_id)
        if joining:
            joined = _round_of(changes["round"], lock=True)
            problem = round_open_problem(joined, now=now)
            if problem is not None:
                raise Conflict(problem, field="round")
            problem = round_full_problem(joined)
            if problem is not None:
                raise ValidationError({"round": problem})
            merged["round"] = joined
            if "start_at" not in changes:
                merged["start_at"] = None  # it follows the round's send_at
                if "expires_at" not in changes and locked.start_at:
                    merged["expires_at"] = locked.expires_at + (joined.send_at - locked.start_at)
        elif "round" in changes and changes["round"] is None and "value" not in changes:
            merged["value"] = None  # leaving: its value counted only in the round
        if "start_at" in changes and "expires_at" not in changes and locked.start_at:
            # The expiry keeps its distance from the start (as it was given or by default).
            start = _start_checked(changes["start_at"], now=now)
            assert start is not None
            merged["expires_at"] = locked.expires_at + (start - locked.start_at)
        fields = _job_fields(channel=locked.channel, campaign=locked.campaign, **merged)
        if fields["round"] is not None and fields["value"] is None:
            _rows_valued(locked)
        changed = [name for name in EDITABLE if fields[name] != current[name]]
        for name in changed:
            setattr(locked, name, fields[name])
        if changed:
            locked.save(update_fields=[*changed, "updated_at"])
            if current["reserve"] or locked.reserve:  # held before the edit, or now
                _holds_dropped_on_commit(locked.pk)
    logger.info(
        "Job %s edited by %s: %s",
        job.pk,
        _who(user),
        ", ".join(f"{name} {current[name]!s} -> {getattr(locked, name)!s}" for name in changed)
        or "nothing changed",
    )
    return locked


def send_job_start(*, job: SendJob, user: Actor = None, queue: bool = True) -> SendJob:
    """Start a scheduled job now, before its `start_at` (a Conflict when it is not scheduled, or
    is in a round: it starts at the round's send_at, once the round has chosen its sends)."""
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        if locked.round is not None:
            if locked.round.status == Round.Status.OPEN:
                why = "leave the round first (PATCH its round to null) to start it now"
            else:
                why = "the round chose its sends for that time"
            raise Conflict(
                f"Send job {locked.pk} is in round {locked.round.pk} ({locked.round.name}) and "
                f"starts at its send time; {why}.",
                field="round",
            )
        ids = job_started(job.pk)
        if job.reserve:
            _holds_dropped_on_commit(job.pk)
        if queue and ids:
            transaction.on_commit(lambda: tasks.send_chunks(ids), robust=True)
    logger.info("Job %s started early by %s", job.pk, _who(user))
    job.refresh_from_db()
    return job


def _started_words(job: SendJob, what: str) -> str:
    if job.cancelled_at is not None or job.status == SendJob.Status.CANCELLED:
        return f"The job was cancelled: it cannot be {what}."
    if job.started_at is not None:
        return (
            f"The job started at {job.started_at.isoformat()}: it can no longer be {what} "
            "(pause or cancel it instead)."
        )
    return f"The job is {job.status} and was not scheduled: it cannot be {what}."


def _holds_dropped_on_commit(job_id: int) -> None:
    """A reserved job that starts, is cancelled or changes gives up its holds at once (the next
    plan makes them again if they still stand); a failure to reach Redis leaves them to it."""

    def drop() -> None:
        limiter = get_limiter()
        try:
            holds_without(limiter.client, limiter.prefix, job_id)
        except REDIS_DOWN:
            logger.warning("Job %s's holds stay until the next plan: Redis is down", job_id)

    transaction.on_commit(drop)


def _not_ended(job: SendJob, what: str) -> None:
    if job.ended or job.cancelled_at is not None:
        state = "cancelled" if job.cancelled_at is not None else job.status
        raise Conflict(f"The job is {state}: it cannot be {what}.", field="status")


def _who(user: Actor) -> str:
    return getattr(user, "username", None) or "a command"


def _job_fields(  # type: ignore[explicit-any]  # the model fields, of their several types
    *,
    channel: str,
    campaign: str,
    template: str,
    category: str = Category.MARKETING,
    on_capped: str = SendJob.OnCapped.DROP,
    on_invalid: str = SendJob.OnInvalid.REJECT,
    tags: Iterable[str] = (),
    priority: int = DEFAULT_PRIORITY,
    expires_at: datetime | None = None,
    start_at: datetime | None = None,
    reserve: bool = False,
    user: Actor = None,
    topic: str = "",
    round: Round | int | None = None,
    value: float | None = None,
) -> dict[str, Any]:
    """A new job's fields (or a scheduled job's, edited), each checked: a ValidationError naming
    the first bad one.

    A job joins a round on its terms: the round open and not closed (`round`), on the round's
    channel or any for a round on `all` (`channel`), a marketing job (`category`: only
    marketing competes for the rules' room), not reserved (`reserve`: the round decides who gets
    the room), starting at the round's send_at (`start_at`: absent, or that instant). `value`
    (a number >= 0, value_problem) only with a round."""
    validate_channel(channel, field="channel")
    validate_category(category, field="category")
    joined = None if round is None else _round_of(round)
    if joined is not None:
        problem = round_open_problem(joined, now=timezone.now())
        if problem is not None:
            raise ValidationError({"round": problem})
    if value is not None:
        problem = value_problem(value)
        if problem is not None:
            raise ValidationError({"value": problem})
        if joined is None:
            raise ValidationError(
                {"value": "A value counts only in a round: give the job's `round` too."}
            )
    if joined is not None:
        start_at = _round_terms(
            joined, channel=channel, category=category, reserve=reserve, start_at=start_at
        )
    if topic:
        problem = topic_problem(topics_read(), topic, channel)
        if problem is not None:
            raise ValidationError({"topic": problem})
    if on_capped not in SendJob.OnCapped.values:
        raise ValidationError({"on_capped": "Choose drop or defer."})
    if on_invalid not in SendJob.OnInvalid.values:
        raise ValidationError({"on_invalid": "Choose reject or skip."})
    if not campaign or len(campaign) > JOB_CAMPAIGN_MAX:
        raise ValidationError(
            {
                "campaign": f"Name the campaign in at most {JOB_CAMPAIGN_MAX} characters (it starts "
                "the default message ids, <campaign>:<user_id>)."
            }
        )
    job_tags = _tags_checked(tags)
    now = timezone.now()
    start = _start_checked(start_at, now=now)
    if type(reserve) is not bool:
        raise ValidationError({"reserve": "true or false."})
    if reserve and start is None:
        raise ValidationError(
            {
                "reserve": "Only a scheduled job holds slots ahead: give its start_at too (a job "
                "that starts at once has nothing to hold them for)."
            }
        )
    expiry = _expiry_checked(expires_at, start=start, now=now)
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
    return {
        "channel": channel,
        "campaign": campaign,
        "template": template,
        "category": category,
        "tags": list(job_tags),
        "priority": priority,
        "topic": topic,
        "on_capped": on_capped,
        "on_invalid": on_invalid,
        "expires_at": expiry,
        "start_at": start,
        "reserve": reserve,
        "round": joined,
        "value": None if value is None else float(value),
        "created_by": account_acting(user),
    }


def _start_checked(start_at: object, *, now: datetime) -> datetime | None:
    """The job's start: None (as soon as it is handed over), or an instant ahead
    (instant_ahead_checked). A ValidationError naming `start_at` otherwise."""
    if start_at is None:
        return None
    return instant_ahead_checked(
        start_at, now=now, field="start_at", passed="leave it out to start at once"
    )


def instant_ahead_checked(
    value: object, *, now: datetime, field: str, passed: str = ""
) -> datetime:
    """The one rule for an instant something waits for (a job's start, a round's close and send
    time): aware, in the future and at most START_MAX ahead. A ValidationError naming `field`
    otherwise (`passed`: what to do instead when it has passed, in words)."""
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise ValidationError({field: f"The UTC offset is missing. {DATETIME_WORDS}"})
    if value <= now:
        instead = f" ({passed})" if passed else ""
        raise ValidationError(
            {field: f"Must be in the future; {value.isoformat()} has passed{instead}."}
        )
    if value > now + START_MAX:
        raise ValidationError(
            {field: f"At most {START_MAX.days} days ahead; {value.isoformat()} is later."}
        )
    return value


# --- a job in a round ---------------------------------------------------------------------------


def round_open_problem(round_: Round, *, now: datetime) -> str | None:
    """The one rule for a round that jobs may still join, leave or change their value in (and
    that may still be edited): open, and its closes_at ahead. None then, else why not in words."""
    if round_.status != Round.Status.OPEN:
        return (
            f"Round {round_.pk} ({round_.name}) is {round_.status}: jobs join, leave or change "
            "their value only while it is open."
        )
    if round_.closes_at <= now:
        return (
            f"Round {round_.pk} ({round_.name}) closed at {round_.closes_at.isoformat()}: jobs "
            "join, leave or change their value only until it closes."
        )
    return None


def round_full_problem(round_: Round) -> str | None:
    """A round that holds ROUND_JOBS_MAX jobs takes no more (its choice is over sets of them):
    None while it has room, else why, in words. Asked under the round's lock."""
    joined = SendJob.objects.filter(round=round_, cancelled_at__isnull=True).count()
    if joined < ROUND_JOBS_MAX:
        return None
    return (
        f"Round {round_.pk} ({round_.name}) holds {joined} jobs, the most a round decides "
        f"({ROUND_JOBS_MAX}): make another round, or take a job out of this one."
    )


def _round_id(ref: object) -> int | None:
    return ref.pk if isinstance(ref, Round) else ref  # type: ignore[return-value]


def _round_of(ref: object, *, lock: bool = False) -> Round:
    """The round a job names (a Round, or its id): a ValidationError naming `round` when there is
    none. `lock`: read under its row lock (the caller is in a transaction)."""
    if isinstance(ref, Round) and not lock:
        return ref
    pk = _round_id(ref)
    if type(pk) is not int:
        raise ValidationError({"round": "A round's id (GET /api/v1/rounds/)."})
    rounds = Round.objects.select_for_update() if lock else Round.objects.all()
    found = rounds.filter(pk=pk).first()
    if found is None:
        raise ValidationError({"round": f"No round {pk}."})
    return found


def _round_locked(round_id: int) -> Round:
    return Round.objects.select_for_update().get(pk=round_id)


def _round_terms(
    joined: Round, *, channel: str, category: str, reserve: object, start_at: object
) -> datetime:
    """A job's fields against the round it joins (see _job_fields): its start, the round's
    send_at; a ValidationError naming the field that does not fit."""
    if joined.channel not in (ALL, channel):
        raise ValidationError(
            {
                "channel": f"Round {joined.pk} ({joined.name}) decides {joined.channel} sends; "
                f"this job sends {channel}."
            }
        )
    if category != Category.MARKETING:
        raise ValidationError(
            {"category": f"Only marketing sends compete in a round; this job is {category}."}
        )
    if reserve is True:
        raise ValidationError(
            {
                "reserve": "A job in a round holds no slots ahead: the round decides who gets "
                "the room."
            }
        )
    if start_at is not None and start_at != joined.send_at:
        raise ValidationError(
            {
                "start_at": f"A job in round {joined.pk} starts at its send_at "
                f"({joined.send_at.isoformat()}): leave start_at out, or leave the round."
            }
        )
    return joined.send_at


def _round_still_open(fields: Mapping[str, Any]) -> None:  # type: ignore[explicit-any]  # the fields _job_fields made
    """Inside the transaction that stores a new job joining a round (`fields`, as _job_fields
    made them): the round read again under its lock, still open and not closed, its send_at
    still the job's start (a ValidationError naming `round` otherwise). Editing the round and
    its decision take the same lock, so the decision never misses a job that joined before it
    closed, and a moved send_at never misses a job."""
    joined = fields["round"]
    if joined is None:
        return
    locked = _round_locked(joined.pk)
    problem = round_open_problem(locked, now=timezone.now()) or round_full_problem(locked)
    if problem is None and locked.send_at != fields["start_at"]:
        problem = (
            f"Round {locked.pk}'s send_at moved to {locked.send_at.isoformat()} meanwhile: "
            "hand the job over again."
        )
    if problem is not None:
        raise ValidationError({"round": problem})


def _value_missing(which: str) -> str:
    return (
        "A job in a round needs a value: give the job's `value`, or each recipient its own "
        f"({which})."
    )


def _rows_valued(job: SendJob) -> None:
    """A job staying or joining a round without a value of its own: every recipient stored
    carries one (a ValidationError naming `value` otherwise; a file still being read cannot
    say yet)."""
    if job.status == SendJob.Status.PREPARING:
        raise ValidationError(
            {"value": _value_missing("its file is still being read: give the job a value")}
        )
    for recipients in SendChunk.objects.filter(job=job).values_list("recipients", flat=True):
        for row in recipients:
            if row.get("value") is None:
                raise ValidationError({"value": _value_missing(f"user {row['user_id']} has none")})


def _expiry_checked(expires_at: object, *, start: datetime | None, now: datetime) -> datetime:
    """The job's expiry: given, an aware instant after its start (`start`, its start_at; None:
    now) and at most EXPIRY_MAX after it; not given, EXPIRY_DEFAULT after its start. A
    ValidationError naming `expires_at` otherwise."""
    if expires_at is None:
        return (start or now) + EXPIRY_DEFAULT
    days = EXPIRY_MAX.days
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        raise ValidationError({"expires_at": f"The UTC offset is missing. {DATETIME_WORDS}"})
    if start is None:
        early = f"Must be in the future; {expires_at.isoformat()} has passed."
        late = f"At most {days} days ahead; {expires_at.isoformat()} is later."
    else:
        early = f"Must be after the job's start_at ({start.isoformat()}); {expires_at.isoformat()} is not."
        late = (
            f"At most {days} days after the job's start_at ({start.isoformat()}); "
            f"{expires_at.isoformat()} is later."
        )
    if expires_at <= (start or now):
        raise ValidationError({"expires_at": early})
    if expires_at > (start or now) + EXPIRY_MAX:
        raise ValidationError({"expires_at": late})
    return expires_at


def _tags_checked(tags: Iterable[str]) -> tuple[str, ...]:
    """The job's tags by limits.policy.rules.tags_problem; a ValidationError naming `tags`
    otherwise."""
    if isinstance(tags, str):
        raise ValidationError({"tags": "A list of tags, not one string."})
    given = tuple(tags)
    problem = tags_problem(given)
    if problem is not None:
        raise ValidationError({"tags": problem[1]})
    return given


def _rows(  # type: ignore[explicit-any]  # rows as the JSON body gives them
    recipients: Iterable[Mapping[str, Any]],
    *,
    campaign: str,
    channel: str,
    value_required: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(valid rows as stored, invalid rows as {row, field, message}, repeats), in order.

    A row repeating an earlier row's message id for the same user is a repeat: the user gets
    one send, and the repeat counts as a duplicate. The same message id for another user is
    invalid: one of the two sends would be lost."""
    rules = RecipientRules(channel=channel, campaign=campaign, value_required=value_required)
    first_use: dict[str, tuple[int, int]] = {}  # message id -> (row, user id)
    rows: list[dict[str, Any]] = []  # type: ignore[explicit-any]  # rows as stored (JSON)
    invalid: list[dict[str, Any]] = []  # type: ignore[explicit-any]  # rows as answered (JSON)
    repeats = 0
    for i, row in enumerate(recipients):
        try:
            if not isinstance(row, Mapping):
                raise RowError("user_id", "A recipient is an object with user_id and address.")
            recipient = rules.recipient(
                row.get("user_id"),
                row.get("address"),
                message_id=row.get("message_id"),
                context=row.get("context"),
                time_zone=row.get("time_zone"),
                value=row.get("value"),
            )
            message_id, user_id = recipient["message_id"], recipient["user_id"]
            if message_id in first_use:
                first, first_user = first_use[message_id]
                if first_user == user_id:
                    repeats += 1
                    continue
                raise RowError(
                    "message_id",
                    f"'{message_id}' is the message id of recipients[{first}], another user; "
                    "each send needs its own.",
                )
            first_use[message_id] = (i, user_id)
            rows.append(recipient)
        except RowError as exc:
            invalid.append({"row": i, "field": exc.field, "message": exc.message})
    return rows, invalid, repeats


def send_job_cancel_waiting(
    *, job: SendJob, user: Actor = None, now: datetime | None = None
) -> SendJob:
    """Cancel a job's waiting sends (deferred by the gate, not yet gone out): each counts as
    `cancelled`, and so does every send the job defers from now on. Sends being gated or sent
    at this moment (a run holds their chunk) are not waiting and go on. Idempotent: a second
    call cancels what was deferred since (nothing, unless a run settled meanwhile).

    Who and when are kept on the job. Chunks that a run took before (it died or raised) are
    closed by their claims, which needs Redis; without it they are left to beat's
    `send_chunks_due`, which ends them within seconds of Redis answering. Returns the job, as
    it is now."""
    now = instant_or_now(now)
    with transaction.atomic():
        locked = SendJob.objects.select_for_update().get(pk=job.pk)
        if locked.waiting_cancelled_at is None:
            locked.waiting_cancelled_at = now
            locked.waiting_cancelled_by = account_acting(user)
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


def plan_current(jobs: Sequence[SendJob] | None = None) -> dict[str, Any]:  # type: ignore[explicit-any]  # the plan as the pages and the API show it (JSON)
    """The latest plan (worker.plan) and whether it is `stale` (a job, a rule or the snapshot
    changed since it was made: `jobs`, the scheduled jobs if the caller read them); a stale or
    missing plan is queued to be made again (worker.tasks.plan_refresh_due), and `computing`
    says one is on its way."""
    latest = plan_latest()
    stale = latest is None or latest["inputs"] != plan_inputs(jobs)
    computing = plan_computing()
    if stale and not computing:
        tasks.plan_refresh_due.delay()
        computing = True
    return {
        "computed_at": latest["computed_at"] if latest else None,
        "seconds": latest["seconds"] if latest else None,
        "stale": stale,
        "computing": computing,
        "remade_users": latest.get("remade_users") if latest else None,
        "whole_at": latest.get("whole_at", latest["computed_at"]) if latest else None,
        "jobs": latest["jobs"] if latest else [],
        "overlaps": latest.get("overlaps", []) if latest else [],
    }


# --- backtests --------------------------------------------------------------------------------


def backtest_create(  # type: ignore[explicit-any]  # the draft as the JSON body gives it
    *, start: date, end: date, changes: Any, user: Actor = None, now: datetime | None = None
) -> Backtest:
    """A backtest of the draft `changes` (a DraftBody) on the UTC days `start` to `end`, its
    parts queued once it is committed. rest_framework's ValidationError naming the field for a
    period outside the ledger's days or a draft that saving would refuse; nothing is made
    then."""
    now = instant_or_now(now)
    today = now.astimezone(UTC).date()
    first = first_day_kept(now=now)
    if end < start:
        raise DrfValidationError({"to": [f"{end} is before from ({start})."]})
    if start < first:
        raise DrfValidationError(
            {
                "from": [
                    f"The ledger keeps {settings.GATEKEEPER_LEDGER_DAYS} days: from {first} to "
                    f"today ({today}); {start} is before them."
                ]
            }
        )
    if end > today:
        raise DrfValidationError({"to": [f"{end} is after today ({today}): nothing to replay."]})
    draft = draft_applied(changes)
    partial = backtest_partial(start=start, end=end, keep=draft.keep, first=first, today=today)
    expected = LedgerCount.objects.filter(
        hour__gte=datetime(start.year, start.month, start.day, tzinfo=UTC),
        hour__lt=datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1),
    ).aggregate(n=Sum("count"))["n"]
    parts = max(1, int(settings.GATEKEEPER_BACKTEST_PARTS))
    with transaction.atomic():
        backtest = Backtest.objects.create(
            start=start,
            end=end,
            changes=msgspec.to_builtins(changes),
            parts=parts,
            expected=expected or 0,
            policy_mark=policy_mark(),
            partial=partial,
            created_by=account_acting(user),
        )
        BacktestPart.objects.bulk_create(
            BacktestPart(backtest=backtest, index=k) for k in range(parts)
        )
        pk = backtest.pk
        transaction.on_commit(
            lambda: [tasks.backtest_part.delay(pk, k) for k in range(parts)], robust=True
        )
    return backtest


def backtest_partial(*, start: date, end: date, keep: timedelta, first: date, today: date) -> str:
    """What the ledger does not hold of what a replay of `start` to `end` needs, in words ("":
    nothing): the days before its first decision, the sends before `start` that the logs of
    the longer policy (`keep`) would still count, and the rest of today."""
    held = LedgerCount.objects.aggregate(first=Min("hour"))["first"]
    held_from = max(first, held.astimezone(UTC).date()) if held is not None else today
    needed = (datetime(start.year, start.month, start.day, tzinfo=UTC) - keep).date()
    words = []
    if held_from > start:
        words.append(
            f"The ledger holds decisions from {held_from} on: the days before are empty in it."
        )
    elif needed < held_from:
        words.append(
            f"The users' logs on {start} count sends from {needed} on, and the ledger holds "
            f"them from {held_from}: in the first days the replay may admit sends the gate "
            "refused."
        )
    if end >= today:
        words.append(f"Today ({today}) is not over: only its decisions so far are replayed.")
    return " ".join(words)
