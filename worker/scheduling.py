"""Scheduled send jobs: a job with a `start_at` waits as `scheduled`, its recipients stored in
staged chunks that nothing hands out, and is started by beat (`worker.tasks.send_jobs_start_due`,
every few seconds) once its time has come (a job in a round: and its round is decided), or at
once by `send_job_start`.

Starting is one transaction under the job's lock: its staged chunks become queued, the job
`queued` (`paused` when it was paused while it waited), `started_at` is set, and the chunks are
handed to the broker once it commits. A job started twice (two beats, a start now racing beat)
starts once: the second finds it no longer scheduled. A lost hand-over is found again by
`chunks_due`, as any lost chunk is.
"""

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gatekeeper.lib.conflicts import Conflict
from worker.chunks import chunks_update
from worker.models import Round, SendChunk, SendJob
from worker.planned import UNSTAGED

logger = logging.getLogger(__name__)

START_BATCH = 100  # jobs started per beat tick (the rest on the next)


def jobs_start_due(*, now: datetime | None = None) -> list[int]:
    """Start every scheduled job whose `start_at` has come; returns the chunk ids to queue (the
    caller hands them to the broker once this returns: they are committed then)."""
    now = now or timezone.now()
    # A job in a round starts once the round is decided (worker/rounds.py).
    due = SendJob.objects.filter(status=SendJob.Status.SCHEDULED, start_at__lte=now).filter(
        Q(round__isnull=True) | Q(round__status=Round.Status.DECIDED)
    )
    ids: list[int] = []
    for job_id in list(due.order_by("start_at", "pk").values_list("pk", flat=True)[:START_BATCH]):
        ids += _start(job_id, now=now, due_only=True)
    return ids


def job_started(job_id: int, *, now: datetime | None = None) -> list[int]:
    """Start a scheduled job now, before its `start_at`; returns the chunk ids to queue. A
    Conflict when it is not scheduled (started, cancelled, or its file still being read)."""
    now = now or timezone.now()
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=job_id)
        if job.status != SendJob.Status.SCHEDULED:
            what = (
                "still being read: it starts once read"
                if job.status == SendJob.Status.PREPARING
                else job.status
            )
            raise Conflict(
                f"The job is {what}; only a scheduled job can be started.", field="status"
            )
        return _start(job_id, now=now, due_only=False)


def _start(job_id: int, *, now: datetime, due_only: bool) -> list[int]:
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=job_id)
        if job.status != SendJob.Status.SCHEDULED:
            return []  # started, or cancelled, meanwhile
        if due_only and (job.start_at is None or job.start_at > now):
            return []  # rescheduled meanwhile
        if due_only and job.round is not None and job.round.status != Round.Status.DECIDED:
            return []  # joined a round meanwhile: it starts once the round is decided
        staged = SendChunk.objects.filter(job_id=job_id, status=SendChunk.Status.STAGED)
        ids = list(staged.order_by("pk").values_list("pk", flat=True))
        job.started_at = now
        # What the plan read of them (SendChunk.plan) goes: only a staged chunk is planned.
        if job.paused_at is not None:  # handed out when it is resumed
            chunks_update(ids, **UNSTAGED)
            job.status = SendJob.Status.PAUSED
            ids = []
        else:
            chunks_update(ids, **UNSTAGED, queued_at=now)
            job.status = SendJob.Status.QUEUED
        job.save(update_fields=["status", "started_at", "updated_at"])
    late = (now - job.start_at).total_seconds() if job.start_at else 0.0
    logger.info(
        "Job %s started (%.1f s after its start_at): %d chunks handed out", job_id, late, len(ids)
    )
    return ids


def staged_cancel(job: SendJob) -> int:
    """Cancel a scheduled job's staged recipients (the caller holds the job's lock and saves it):
    their chunks are deleted, every recipient in them counts as `cancelled`. Returns how many."""
    staged = SendChunk.objects.filter(job=job, status=SendChunk.Status.STAGED)
    cancelled = sum(staged.values_list("size", flat=True))
    staged.delete()
    job.cancelled += cancelled
    job.status = SendJob.Status.CANCELLED
    return cancelled
