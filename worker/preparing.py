"""Preparing a send job handed over as a file: read it once (a stream, in bounded memory), stage
its recipients in chunks as they are read, and hand each write of chunks to the workers at once,
so that the first sends go out within seconds while the rest of the file is still read. The work
of `worker.tasks.send_job_prepare` (and of `manage.py send_campaign`, which does it in its own
process).

The file is read in order: a chunk is handed out only once every line before its last was read
and checked. So with `on_invalid: reject`, a bad line still stops the job before anything that
follows it is sent: the job fails with the line named, what had been handed out and not sent yet
is cancelled, and nothing after the line is staged (a file that cannot be read fails the same
way). The head of the file is checked before the job is stored (worker.services), so a file bad
from its start sends nothing.

A run that dies midway leaves what it staged to the next run, which deletes the staged chunks and
reads the file again from the start, making again (and not storing) the chunks handed out before
(the job's lease keeps two runs from reading at once). A job cancelled while it is read stops at
the next write; one paused has its chunks queued but not handed out until its resume; one with a
start ahead is staged to the end and waits for it.
"""

import gc
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from gatekeeper.lib.binding import large_rows_created
from gatekeeper.lib.files import remover
from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.leases import RowLease
from gatekeeper.lib.words import count
from segments.store import NotFound, StoreError, store_from_settings
from worker import timings
from worker.chunks import lease_length, waiting_close
from worker.models import SendChunk, SendJob
from worker.recipients import FileError, RecipientRules, SeenUsers, line_words, recipient_lines

logger = logging.getLogger(__name__)

STORE_PREFIX = "store:"  # a job's `source` when its file is an object in the store
INVALID_ROWS_KEPT = 100  # invalid rows kept on a job (with on_invalid: skip) to show why
REJECTED_ROWS_SHOWN = 20  # bad rows named when a job is refused (with on_invalid: reject)
STAGE_EVERY = 20  # chunks written to the database at a time at most (and progress noted)
# The first write holds one chunk and each next one twice as many, up to STAGE_EVERY: the first
# sends go out after one chunk was read, and the writes are few after that.


def _job_lease(job_id: int) -> RowLease:
    """A run's hold on a preparing job: one run reads its file at a time."""
    return RowLease(SendJob.objects.filter(pk=job_id), lease_length(), field="prepare_lease_until")


def _taken(lease: RowLease) -> bool:
    now = timezone.now()
    return lease.take(now, where=Q(status=SendJob.Status.PREPARING), updated_at=now)


class _Staging:
    """The recipients read so far: valid ones in chunks (written a few at a time), repeats and
    invalid rows counted. `skip`: chunks an earlier run handed out, made again and not stored."""

    def __init__(self, job: SendJob, skip: int) -> None:
        self.job = job
        self.size = int(settings.GATEKEEPER_SEND_CHUNK_SIZE)
        self.batch: list[dict[str, Any]] = []
        self.full: list[list[dict[str, Any]]] = []
        self.rows = self.repeats = self.invalid = 0
        self.skip, self.made, self.every = skip, 0, 1
        self.seconds = 0.0  # spent storing chunks
        self.invalid_rows: list[dict[str, Any]] = []
        self.seen = SeenUsers()

    def add(self, recipient: dict[str, Any]) -> None:
        self.rows += 1
        if not self.seen.first_time(recipient["user_id"]):
            self.repeats += 1
            return
        self.batch.append(recipient)
        if len(self.batch) == self.size:
            self.full.append(self.batch)
            self.batch = []

    def bad(self, number: int, field: str, message: str) -> None:
        if len(self.invalid_rows) < INVALID_ROWS_KEPT:
            self.invalid_rows.append(
                {"row": self.rows, "line": number, "field": field, "message": message}
            )
        self.rows += 1
        self.invalid += 1

    def due(self) -> bool:
        """Enough full chunks for a write."""
        return len(self.full) >= self.every

    def flush(self, *, last: bool = False) -> None:
        if last and self.batch:
            self.full.append(self.batch)
            self.batch = []
        if not self.full:
            return
        started = time.perf_counter()
        fresh = self.full[max(0, self.skip - self.made) :]
        self.made += len(self.full)
        large_rows_created(
            SendChunk,
            (
                SendChunk(
                    job_id=self.job.pk,
                    recipients=recipients,
                    size=len(recipients),
                    status=SendChunk.Status.STAGED,
                )
                for recipients in fresh
            ),
        )
        self.full = []
        self.every = min(STAGE_EVERY, 2 * self.every)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        timings.add("chunking", seconds)


def _handed_out(job_id: int, lease: RowLease, rows: int, read_bytes: int) -> list[int] | None:
    """Note the progress and queue what is staged: the ids of the chunks to hand to the broker
    now (none while the job is paused, queued for its resume, or waits for its start, staged).
    None when the job was cancelled or another run took it over."""
    now = timezone.now()
    with transaction.atomic():
        renewed = lease.renew(
            where=Q(cancelled_at__isnull=True), read_bytes=read_bytes, total=rows, updated_at=now
        )
        if not renewed:
            return None
        job = SendJob.objects.only("start_at", "paused_at", "started_at").get(pk=job_id)
        if job.started_at is None and job.start_at is not None and job.start_at > now:
            return []  # staged until its start (worker.scheduling)
        staged = SendChunk.objects.filter(job_id=job_id, status=SendChunk.Status.STAGED)
        if job.paused_at is not None:
            staged.update(status=SendChunk.Status.QUEUED)  # handed out when it is resumed
            ids: list[int] = []
        else:
            ids = list(staged.order_by("pk").values_list("pk", flat=True))
            SendChunk.objects.filter(pk__in=ids).update(
                status=SendChunk.Status.QUEUED, queued_at=now
            )
        if job.started_at is None:
            SendJob.objects.filter(pk=job_id).update(started_at=now)
    return ids


def _open(job: SendJob) -> tuple[Any, int]:
    """(the job's file as a binary stream, its size). Raises FileError."""
    if job.source.startswith(STORE_PREFIX):
        key = job.source[len(STORE_PREFIX) :]
        try:
            return store_from_settings().open(key)
        except NotFound:
            raise FileError(f"There is no object '{key}' in the store (it was removed).") from None
        except StoreError as exc:
            raise FileError(f"The store could not be read: {exc}") from None
    if not job.file:
        raise FileError("The job's file is gone (it was read already, or deleted).")
    try:
        handle = job.file.open("rb")
        return handle, job.file.size
    except OSError as exc:
        raise FileError(f"The uploaded file could not be read: {exc}") from None


def send_job_prepare_run(
    *,
    job_id: int,
    progress: Callable[[int, int], None] | None = None,
    stream: tuple[Any, int] | None = None,
    hand_out: Callable[[list[int]], None] | None = None,
) -> list[int]:
    """Read a preparing job's file and stage its recipients, handing each write of chunks to
    `hand_out` (their ids) as it goes; then queue the job (`running` or `queued`, `paused` when
    it was paused meanwhile, `scheduled` when its start is ahead) or fail it. Returns the ids of
    the chunks to hand to the broker now that were not given to `hand_out` (all of them without
    it; none when the job is paused, failed, cancelled, or another run reads it).
    `progress(read_bytes, source_bytes)` is called as it goes. `stream` (a binary stream and its
    size): the file, when the caller holds it (`send_campaign`) instead of the job's upload or
    store object."""
    lease = _job_lease(job_id)
    if not _taken(lease):
        return []
    job = SendJob.objects.get(pk=job_id)
    # An earlier run that died left what it staged: this run reads the file from the start,
    # making again the chunks it handed out (they are the same: the file is read in order).
    SendChunk.objects.filter(job_id=job_id, status=SendChunk.Status.STAGED).delete()
    handed = _send_chunks(job_id).count()
    staging = _Staging(job, skip=handed)
    rules = RecipientRules(channel=job.channel, campaign=job.campaign)
    reject = job.on_invalid == SendJob.OnInvalid.REJECT
    kept: list[int] = []
    handle: Any = None
    collecting = gc.isenabled()
    try:
        if stream is not None:
            handle, size = stream
        else:
            handle, size = _open(job)
        counting = _Counting(handle)
        # Reading makes millions of short-lived objects, none in reference cycles, and each of
        # the collector's walks would also walk everything the process held before (Django,
        # the snapshot): without them reading a 1M-line file in `send_campaign` is a third
        # faster. The young generations are collected after each write of chunks, the rest
        # once reading ends.
        gc.disable()
        started = time.perf_counter()
        for line in recipient_lines(counting, rules):
            if line.error is not None:
                if reject and not staging.invalid:
                    _stopped(job_id)  # what was handed out and not sent yet goes no further
                staging.bad(line.number, line.error.field, line.error.message)
                if reject and staging.invalid >= REJECTED_ROWS_SHOWN:
                    break
            elif reject and staging.invalid:
                continue  # after a bad line nothing more is staged: only bad lines are named
            else:
                staging.add(line.recipient)  # type: ignore[arg-type]
            if staging.due() and not (reject and staging.invalid):
                staging.flush()  # timed as chunking: the rest of the loop is reading
                gc.collect(1)  # the young only: cycles the writes made, not the whole heap
                if progress is not None:
                    progress(counting.count, size)
                ids = _handed_out(job_id, lease, staging.rows, counting.count)
                if ids is None:
                    break  # cancelled (finished below), or taken over by another run
                if hand_out is None:
                    kept.extend(ids)
                elif ids:
                    hand_out(ids)
        if not (reject and staging.invalid):
            staging.flush(last=True)
        timings.add("reading", time.perf_counter() - started - staging.seconds)
        if progress is not None:
            progress(counting.count, size)
    except FileError as exc:
        _stopped(job_id)
        return _fail(job_id, str(exc.message), staging)
    finally:
        if collecting:
            gc.enable()
        if handle is not None:
            handle.close()
    if reject and staging.invalid:
        return _fail(job_id, _rejected_words(staging.invalid_rows), staging)
    with timings.timed("chunking"):
        return kept + _finish(job_id, staging, lease, counting.count)


def _send_chunks(job_id: int) -> Any:
    """The chunks of a job's file handed out (queued, or ended since): not staged, not the
    follow-ups its runs made."""
    return SendChunk.objects.filter(job_id=job_id, kind=SendChunk.Kind.SEND).exclude(
        status=SendChunk.Status.STAGED
    )


def _not_handed_out(job_id: int, staging: _Staging) -> int:
    """Valid recipients read but never handed out (staged, or not written yet)."""
    handed = _send_chunks(job_id).aggregate(n=Sum("size"))["n"] or 0
    return staging.rows - staging.invalid - staging.repeats - handed


def _stopped(job_id: int) -> None:
    """A file refused after some of it was handed out: its sends not gone out yet never will
    (counted as cancelled, as a cancel does)."""
    now = timezone.now()
    if _send_chunks(job_id).exists():
        SendJob.objects.filter(pk=job_id, cancelled_at__isnull=True).update(
            cancelled_at=now, paused_at=None
        )
        SendJob.objects.filter(pk=job_id, waiting_cancelled_at__isnull=True).update(
            waiting_cancelled_at=now
        )


def _rejected_words(rows: list[dict[str, Any]]) -> str:
    shown = "; ".join(line_words(r["line"], r["field"], r["message"]) for r in rows[:5])
    more = f"; and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"The file was refused (on_invalid: reject): {shown}{more}."


def _failed_words(error: str, handed: int) -> str:
    """Why a job failed, and what of it went out."""
    if not handed:
        return f"{error} Nothing was sent."
    return (
        f"{error} Before it was found, {count(handed, 'recipient')} had been handed out: those "
        "not sent yet were cancelled, and nothing after it was sent."
    )


def _fail(job_id: int, error: str, staging: _Staging) -> list[int]:
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=job_id)
        SendChunk.objects.filter(job_id=job_id, status=SendChunk.Status.STAGED).delete()
        handed = _send_chunks(job_id).aggregate(n=Sum("size"))["n"] or 0
        if handed:
            # Read up to where it was refused: what was handed out settles as it runs (what had
            # not gone out as cancelled), the rest read before the line is cancelled.
            job.total = staging.rows
            job.invalid = staging.invalid
            job.duplicate += staging.repeats
            job.cancelled += _not_handed_out(job_id, staging)
        error = _failed_words(error, handed)
        job.status = SendJob.Status.FAILED
        job.error = error[:4000]
        job.invalid_rows = staging.invalid_rows[:INVALID_ROWS_KEPT]
        job.prepare_lease_until = None
        job.save()
        file_removed_on_commit(job)
    if handed:
        waiting_close(job_id=job_id)  # its queued chunks, and any deferred sends
    logger.info("Job %s refused: %s", job_id, error)
    return []


def _finish(job_id: int, staging: _Staging, lease: RowLease, read_bytes: int) -> list[int]:
    now = timezone.now()
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=job_id)
        if job.status != SendJob.Status.PREPARING:
            return []  # cancelled while no run held it (this one was too slow to renew)
        if job.prepare_lease_until != lease.until and job.cancelled_at is None:
            return []  # another run took it over (this one was too slow to renew)
        staged = SendChunk.objects.filter(job_id=job_id, status=SendChunk.Status.STAGED)
        job.total = staging.rows
        job.invalid = staging.invalid
        job.duplicate += staging.repeats
        job.invalid_rows = staging.invalid_rows
        job.read_bytes = read_bytes
        job.prepare_lease_until = None
        ids: list[int] = []
        started = job.started_at is not None
        if job.cancelled_at is not None:
            # Read up to where it was cancelled: what was valid and not handed out is
            # cancelled, never queued; what was handed out ends as it runs.
            job.cancelled += _not_handed_out(job_id, staging)
            staged.delete()
        elif not started and job.start_at is not None and job.start_at > now:
            job.status = SendJob.Status.SCHEDULED  # staged until its start (worker.scheduling)
        elif job.paused_at is not None:  # queued when it is resumed
            staged.update(status=SendChunk.Status.QUEUED)
            job.status = SendJob.Status.PAUSED
            job.started_at = job.started_at or now
        else:
            ids = list(staged.order_by("pk").values_list("pk", flat=True))
            staged.update(status=SendChunk.Status.QUEUED, queued_at=now)
            ran = _send_chunks(job_id).filter(runs__gt=0).exists()
            job.status = SendJob.Status.RUNNING if ran else SendJob.Status.QUEUED
            job.started_at = job.started_at or now
        if job.status != SendJob.Status.SCHEDULED and job.processed >= job.total:
            # Every recipient has its outcome already (settled while the file was read).
            job.status = SendJob.Status.CANCELLED if job.cancelled_at else SendJob.Status.DONE
        elif job.cancelled_at is not None:
            job.status = SendJob.Status.RUNNING  # its handed-out chunks end as cancelled
        job.save()
        file_removed_on_commit(job)
    if job.cancelled_at is not None and job.status == SendJob.Status.RUNNING:
        waiting_close(job_id=job_id)
    logger.info(
        "Job %s read: %d recipients (%d invalid, %d repeated), %s",
        job_id,
        staging.rows,
        staging.invalid,
        staging.repeats,
        job.status,
    )
    return ids


def file_removed_on_commit(job: SendJob) -> None:
    """An uploaded file is removed once it is read (its recipients are in chunks now, or the job
    was refused); an object in the store is the caller's and stays."""
    if not job.file:
        return
    transaction.on_commit(remover(job.file))
    job.file = ""  # a later save of `job` keeps it gone
    SendJob.objects.filter(pk=job.pk).update(file="")


def jobs_preparing_stalled(*, now: datetime | None = None) -> list[int]:
    """Preparing jobs that no run reads (their task was lost, or its worker died and the broker
    has not handed it out again): their lease ran out, or none was taken long after they were
    queued. Marked as handed out now; `send_chunks_due` queues them again."""
    now = instant_or_now(now)
    stale = now - timedelta(seconds=settings.GATEKEEPER_CHUNK_REQUEUE_SECONDS)
    lapsed = Q(prepare_lease_until__lt=now) | Q(
        prepare_lease_until__isnull=True, updated_at__lt=stale
    )
    jobs = SendJob.objects.filter(lapsed, status=SendJob.Status.PREPARING)
    ids = list(jobs.values_list("pk", flat=True)[:100])
    SendJob.objects.filter(pk__in=ids).update(updated_at=now)
    return ids


class _Counting:
    """A binary stream that counts the bytes read from it (as handed over: compressed, when it
    is gzip), for the progress of reading against the file's size."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.count = raw, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return bytes(data)
