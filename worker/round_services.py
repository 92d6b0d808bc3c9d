"""Writes of rounds (worker.models.Round): made, edited while open, cancelled. What joins them
is a send job's business (worker.services: `round` and `value`, on the terms of `_job_fields`);
what decides them when they close is worker/rounds.py's.

Every write takes the round's row lock, as a job joining it and the decision taking it do, so a
round is edited, cancelled, joined or decided one at a time, and a job that joined before it
closed is never missed.
"""

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from gatekeeper.lib.accounts import Actor, account_acting
from gatekeeper.lib.conflicts import Conflict
from limits.channels import validate_scope
from worker import tasks
from worker.models import Round, SendJob
from worker.recipients import value_problem
from worker.services import instant_ahead_checked, round_open_problem, send_job_cancel

logger = logging.getLogger(__name__)

NAME_MAX = 200
# What an open round's edit may change: its channel cannot (its jobs were checked against it).
ROUND_EDITABLE = ("name", "closes_at", "send_at")
# What becomes of a cancelled round's jobs.
CANCEL_MODES = ("wait", "cancel")


def round_create(
    *,
    name: Any,
    channel: Any,
    closes_at: Any,
    send_at: Any = None,
    user: Actor = None,
    now: datetime | None = None,
) -> Round:
    """A round, open: jobs join it until `closes_at`, and start at `send_at` (default
    closes_at) once it is decided. Each field checked by `_round_fields`: a ValidationError
    naming the first bad one, and nothing made."""
    fields = _round_fields(
        name=name, channel=channel, closes_at=closes_at, send_at=send_at, now=now
    )
    made = Round.objects.create(**fields, created_by=account_acting(user))
    logger.info("Round %s (%s) made by %s", made.pk, made, _who(user))
    return made


def round_edit(
    *, round_: Round, changes: Mapping[str, Any], user: Actor = None, now: datetime | None = None
) -> Round:
    """Change an open round's name, closes_at or send_at (ROUND_EDITABLE), checked whole as at
    creation (a ValidationError naming the field, nothing changed). A send_at that followed
    closes_at (the default) follows it again unless given. A moved send_at moves every joined
    job's start_at with it, and their expiry by as much, in the same transaction. A Conflict
    naming `status` once the round is not open or has closed."""
    fixed = sorted(set(changes) - set(ROUND_EDITABLE))
    if fixed:
        raise ValidationError(
            {
                fixed[0]: f"Cannot change (only {', '.join(ROUND_EDITABLE)} can, while the round "
                "is open): its jobs were checked against it; cancel the round and make another."
            }
        )
    now = now or timezone.now()
    with transaction.atomic():
        locked = Round.objects.select_for_update().get(pk=round_.pk)
        problem = round_open_problem(locked, now=now)
        if problem is not None:
            raise Conflict(f"{problem} It can no longer be edited.", field="status")
        merged = {name: getattr(locked, name) for name in ROUND_EDITABLE}
        merged.update(changes)
        if "send_at" not in changes and locked.send_at == locked.closes_at:
            merged["send_at"] = None  # it followed closes_at: it follows it still
        fields = _round_fields(channel=locked.channel, now=now, **merged)
        before = {name: getattr(locked, name) for name in ROUND_EDITABLE}
        changed = [name for name in ROUND_EDITABLE if fields[name] != before[name]]
        for name in changed:
            setattr(locked, name, fields[name])
        if changed:
            locked.save(update_fields=[*changed, "updated_at"])
        moved = 0
        if "send_at" in changed:
            moved = _jobs_moved(locked, by=locked.send_at - before["send_at"], now=now)
    logger.info(
        "Round %s edited by %s: %s",
        locked.pk,
        _who(user),
        ", ".join(f"{name} {before[name]!s} -> {getattr(locked, name)!s}" for name in changed)
        + (f" ({moved} jobs moved)" if moved else "")
        or "nothing changed",
    )
    return locked


def round_cancel(*, round_: Round, jobs: str, user: Actor = None) -> Round:
    """Cancel an open round (a Conflict naming `status` otherwise). `jobs`: `wait`, its jobs
    leave the round (their value with it) and stay scheduled, starting at their start_at as
    plain scheduled jobs; `cancel`, each is cancelled as send_job_cancel cancels a scheduled job
    (nothing of it goes out), and stays listed on the round. One transaction."""
    if jobs not in CANCEL_MODES:
        raise ValidationError({"jobs": "Choose wait (the jobs stay scheduled) or cancel."})
    now = timezone.now()
    with transaction.atomic():
        locked = _locked_open(round_, "only an open round can be cancelled.")
        locked.status = Round.Status.CANCELLED
        locked.cancelled_at = now
        locked.save(update_fields=["status", "cancelled_at", "updated_at"])
        joined = SendJob.objects.filter(round=locked)
        if jobs == "wait":
            affected = joined.update(round=None, value=None, updated_at=now)
        else:
            live = joined.filter(cancelled_at__isnull=True).exclude(
                status__in=(SendJob.Status.DONE, SendJob.Status.FAILED)
            )
            affected = 0
            for job in live.order_by("pk"):
                send_job_cancel(job=job, user=user)
                affected += 1
    logger.info(
        "Round %s cancelled by %s: %d jobs %s",
        locked.pk,
        _who(user),
        affected,
        "left it, still scheduled" if jobs == "wait" else "cancelled",
    )
    return locked


def _round_fields(
    *, name: Any, channel: Any, closes_at: Any, send_at: Any, now: datetime | None
) -> dict[str, Any]:
    """A round's fields, each checked: a ValidationError naming the first bad one. `name` 1 to
    NAME_MAX characters, not blank; `channel` a scope (limits.channels); `closes_at` an instant
    ahead (worker.services.instant_ahead_checked, as a job's start); `send_at` the same, at or
    after closes_at (None: closes_at)."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise ValidationError({"name": f"Name the round in 1 to {NAME_MAX} characters."})
    if not isinstance(channel, str):
        raise ValidationError({"channel": "A channel, or all."})
    validate_scope(channel, field="channel")
    now = now or timezone.now()
    closes = instant_ahead_checked(closes_at, now=now, field="closes_at")
    if send_at is None:
        send = closes
    else:
        send = instant_ahead_checked(send_at, now=now, field="send_at")
        if send < closes:
            raise ValidationError(
                {
                    "send_at": f"At or after closes_at ({closes.isoformat()}): the jobs start "
                    f"once the round is decided; {send.isoformat()} is before."
                }
            )
    return {"name": name, "channel": channel, "closes_at": closes, "send_at": send}


def _jobs_moved(round_: Round, *, by: timedelta, now: datetime) -> int:
    """Every job that waits in the round starts at its new send_at, its expiry moved by as much
    (`by`); its `updated_at` tells the plan it changed. Returns how many moved."""
    return SendJob.objects.filter(
        round=round_, started_at__isnull=True, cancelled_at__isnull=True
    ).update(start_at=round_.send_at, expires_at=F("expires_at") + by, updated_at=now)


def _who(user: Actor) -> str:
    return getattr(user, "username", None) or "a command"


def round_projection_ask(*, round_: Round, values: Mapping[int, object] | None = None) -> Round:
    """Ask what an open round would choose if it closed now, with `values` (job id -> a value)
    tried instead of those jobs' own: computed in the background (worker.tasks.round_project_run,
    queued once this commits) and kept on the round as its projection. A Conflict naming
    `status` once it is not open; a ValidationError naming `values` for a job not in it or a
    value that is not one (recipients.value_problem)."""
    tried: dict[int, float] = {}
    for job, value in (values or {}).items():
        problem = value_problem(value)
        if problem is not None:
            raise ValidationError({"values": f"Job {job}: {problem}"})
        tried[int(job)] = float(value)  # type: ignore[arg-type]  # a number, as checked
    with transaction.atomic():
        locked = _locked_open(
            round_, "a projection is of an open round (a decided one has its report)."
        )
        joined = set(SendJob.objects.filter(round=locked).values_list("pk", flat=True))
        strangers = sorted(set(tried) - joined)
        if strangers:
            raise ValidationError(
                {"values": f"Not a job of round {locked.pk}: {', '.join(map(str, strangers))}."}
            )
        asked = {str(job): value for job, value in tried.items()}
        transaction.on_commit(lambda: tasks.round_project_run.delay(locked.pk, asked), robust=True)
    return locked


def _locked_open(round_: Round, why: str) -> Round:
    """The round, its row locked for the transaction the caller is in; a Conflict naming
    `status`, saying `why`, once it is not open (deciding, decided, cancelled)."""
    locked = Round.objects.select_for_update().get(pk=round_.pk)
    if locked.status != Round.Status.OPEN:
        raise Conflict(
            f"Round {locked.pk} ({locked.name}) is {locked.status}: {why}", field="status"
        )
    return locked
