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

A plain file larger than two parts is read by every free worker, a part each
(`send_job_part_run`), and taken in by the job's reading run in file order: its first part is
handed out as it is read, each later one once it and every part before it are read.

A run that dies midway leaves what it staged to the next run, which deletes the staged chunks of
the first part and reads it again from the start, making again (and not storing) the chunks
handed out before, and counts again the later parts it had taken in (the job's lease keeps two
runs from reading at once; a part's lease, two readers of one part). A job cancelled while it is
read stops at the next write; one paused has its chunks queued but not handed out until its
resume; one with a start ahead is staged to the end and waits for it.
"""

import enum
import gc
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from gatekeeper.lib.binding import large_rows_created
from gatekeeper.lib.files import remover
from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.leases import RowLease, lease_free
from gatekeeper.lib.words import count
from segments.store import NotFound, StoreError, store_from_settings
from worker import timings
from worker.chunks import lease_length, waiting_close
from worker.models import SendChunk, SendJob, SendJobPart
from worker.planned import UNSTAGED, recipients_packed, repacked
from worker.recipients import (
    FileError,
    FileRange,
    Line,
    RecipientRules,
    SeenUsers,
    file_cuts,
    file_header,
    line_words,
    recipient_lines,
)

logger = logging.getLogger(__name__)

STORE_PREFIX = "store:"  # a job's `source` when its file is an object in the store
INVALID_ROWS_KEPT = 100  # invalid rows kept on a job (with on_invalid: skip) to show why
REJECTED_ROWS_SHOWN = 20  # bad rows named when a job is refused (with on_invalid: reject)
STAGE_EVERY = 20  # chunks written to the database at a time at most (and progress noted)
NAMING_RENEW_LINES = 100_000  # after a bad line, the lease renewed every so many lines read
PART_WAIT_SECONDS = 0.2  # the reading run's wait for a part another worker reads
HEADER_BYTES = 1 << 16  # the first line of a file, read by a part's reader for its header
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
    invalid rows counted. `skip`: chunks an earlier run handed out, made again and not stored;
    `part`: the part of the file they come from; `every`: chunks in the first write."""

    def __init__(self, job: SendJob, skip: int, *, part: int = 0, every: int = 1) -> None:
        self.job, self.part = job, part
        # A job with a start waits for it staged (unless the start has passed once it is read):
        # its chunks carry what the forward plan reads (worker/planned.py).
        self.planned = job.start_at is not None
        self.size = int(settings.GATEKEEPER_SEND_CHUNK_SIZE)
        self.batch: list[dict[str, Any]] = []
        self.full: list[list[dict[str, Any]]] = []
        self.rows = self.repeats = self.invalid = 0
        self.skip, self.made, self.every = skip, 0, every
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
                    part=self.part,
                    recipients=recipients,
                    size=len(recipients),
                    status=SendChunk.Status.STAGED,
                    plan=recipients_packed(recipients) if self.planned else None,
                )
                for recipients in fresh
            ),
        )
        self.full = []
        self.every = min(STAGE_EVERY, 2 * self.every)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        timings.add("chunking", seconds)


def _handed_out(
    job_id: int, lease: RowLease, rows: int, read_bytes: int, *, part: int = 0
) -> list[int] | None:
    """Note the progress and queue what is staged of `part` (a part after the first is marked
    taken in, in the same transaction): the ids of the chunks to hand to the broker now (none
    while the job is paused, queued for its resume, or waits for its start, staged). None when
    the job was cancelled or another run took it over."""
    now = timezone.now()
    with transaction.atomic():
        renewed = lease.renew(
            where=Q(cancelled_at__isnull=True), read_bytes=read_bytes, total=rows, updated_at=now
        )
        if not renewed:
            return None
        if part:
            SendJobPart.objects.filter(job_id=job_id, index=part).update(
                status=SendJobPart.Status.TAKEN
            )
        job = SendJob.objects.only("start_at", "paused_at", "started_at").get(pk=job_id)
        if job.started_at is None and job.start_at is not None and job.start_at > now:
            return []  # staged until its start (worker.scheduling)
        staged = SendChunk.objects.filter(job_id=job_id, part=part, status=SendChunk.Status.STAGED)
        if job.paused_at is not None:
            staged.update(**UNSTAGED)  # handed out on resume
            ids: list[int] = []
        else:
            ids = list(staged.order_by("pk").values_list("pk", flat=True))
            SendChunk.objects.filter(pk__in=ids).update(**UNSTAGED, queued_at=now)
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
    read_parts: Callable[[int, list[int]], None] | None = None,
) -> list[int]:
    """Read a preparing job's file and stage its recipients, handing each write of chunks to
    `hand_out` (their ids) as it goes; then queue the job (`running` or `queued`, `paused` when
    it was paused meanwhile, `scheduled` when its start is ahead) or fail it. Returns the ids of
    the chunks to hand to the broker now that were not given to `hand_out` (all of them without
    it; none when the job is paused, failed, cancelled, or another run reads it).
    `progress(read_bytes, source_bytes)` is called as it goes. `stream` (a binary stream and its
    size): the file, when the caller holds it (`send_campaign`) instead of the job's upload or
    store object.

    A plain file larger than two parts (GATEKEEPER_SEND_FILE_PART_BYTES) in a place every worker
    reads (the upload, a local store) is cut into parts: this run reads the first, handing it
    out as it goes, and `read_parts(job_id, indexes)` asks other workers to read the others
    (`send_job_part_run`); then it takes them in, in file order, reading itself any that no
    worker has started."""
    lease = _job_lease(job_id)
    if not _taken(lease):
        return []
    job = SendJob.objects.get(pk=job_id)
    # An earlier run that died left what it staged: this run reads the file from the start,
    # making again the chunks it handed out (they are the same: the file is read in order).
    # What other workers read of the later parts stays theirs.
    SendChunk.objects.filter(job_id=job_id, part=0, status=SendChunk.Status.STAGED).delete()
    handed = _send_chunks(job_id).filter(part=0).count()
    staging = _Staging(job, skip=handed)
    rules = RecipientRules.of_job(job)
    reject = job.on_invalid == SendJob.OnInvalid.REJECT
    kept: list[int] = []
    parts: list[SendJobPart] = []
    asked = False
    handle: Any = None

    def hand(ids: list[int]) -> None:
        if hand_out is None:
            kept.extend(ids)
        elif ids:
            hand_out(ids)

    def ask() -> None:
        """The later parts to other workers, once the first chunk is out."""
        nonlocal asked
        waiting = [p.index for p in parts if p.status == SendJobPart.Status.WAITING]
        if not asked and read_parts is not None and waiting:
            read_parts(job_id, waiting)
        asked = True

    def written() -> bool:
        if progress is not None:
            progress(counting.count, size)
        ids = _handed_out(job_id, lease, staging.rows, counting.count)
        if ids is None:
            return False  # cancelled (finished below), or taken over by another run
        hand(ids)
        ask()
        return True

    try:
        if stream is not None:
            handle, size = stream
        else:
            handle, size = _open(job)
            parts = _parts(job, handle, size)
        counting = _Counting(FileRange(handle, 0, parts[0].start) if parts else handle)
        _read(
            recipient_lines(counting, rules),
            staging,
            reject=reject,
            first_bad=lambda: _stopped(job_id),
            written=written,
            naming=lambda: lease.renew(read_bytes=counting.count),
        )
        if progress is not None:
            progress(counting.count, size)
    except FileError as exc:
        _stopped(job_id)
        return _fail(job_id, str(exc.message), staging)
    finally:
        if handle is not None:
            handle.close()
    if reject and staging.invalid:
        return _fail(job_id, _rejected_words(staging.invalid_rows), staging)
    ask()
    read_bytes = counting.count
    if parts:
        outcome, error = _Taken.STOPPED, ""
        if written():  # the first part's last chunks out, before the later parts' ones
            outcome, error = _parts_taken_in(job_id, lease, staging, parts, reject, hand, progress)
        if outcome == _Taken.UNREADABLE:
            _stopped(job_id)
            return _fail(job_id, error, staging)
        if outcome == _Taken.BAD_LINE:
            _stopped(job_id)
            return _fail(job_id, _rejected_words(staging.invalid_rows), staging)
        read_bytes = size if outcome == _Taken.ALL else read_bytes
    with timings.timed("chunking"):
        return kept + _finish(job_id, staging, lease, read_bytes)


def _read(
    lines: Iterator[Line],
    staging: _Staging,
    *,
    reject: bool,
    first_bad: Callable[[], None],
    written: Callable[[], bool],
    naming: Callable[[], bool],
    before_write: Callable[[], bool] = lambda: True,
) -> None:
    """Stage every line of `lines` (a file, or a part of it) in `staging`. `first_bad()` on the
    first bad line with `reject` (after which nothing is staged: only more bad lines are named,
    up to REJECTED_ROWS_SHOWN, with `naming()` every NAMING_RENEW_LINES lines); before each write
    of chunks `before_write()`, after it `written()`: False from either stops the reading."""
    collecting = gc.isenabled()
    # Reading makes millions of short-lived objects, none in reference cycles, and each of the
    # collector's walks would also walk everything the process held before (Django, the
    # snapshot): without them reading a 1M-line file in `send_campaign` is a third faster. The
    # young generations are collected after each write of chunks, the rest once reading ends.
    gc.disable()
    started = time.perf_counter()
    seconds = staging.seconds
    try:
        for line in lines:
            if line.error is not None:
                if reject and not staging.invalid:
                    first_bad()  # what was handed out and not sent yet goes no further
                staging.bad(line.number, line.error.field, line.error.message)
                if reject and staging.invalid >= REJECTED_ROWS_SHOWN:
                    break
            elif reject and staging.invalid:
                # After a bad line nothing more is staged: only bad lines are named, the lease
                # kept meanwhile.
                if line.number % NAMING_RENEW_LINES == 0 and not naming():
                    break  # another run took it over
                continue
            else:
                staging.add(line.recipient)  # type: ignore[arg-type]
            if staging.due() and not (reject and staging.invalid):
                if not before_write():
                    break
                staging.flush()  # timed as chunking: the rest of the loop is reading
                gc.collect(1)  # the young only: cycles the writes made, not the whole heap
                if not written():
                    break
        else:
            if not (reject and staging.invalid) and before_write():
                staging.flush(last=True)
    finally:
        if collecting:
            gc.enable()
        timings.add("reading", time.perf_counter() - started - (staging.seconds - seconds))


def _parts(job: SendJob, handle: Any, size: int) -> list[SendJobPart]:
    """The parts of a job's file after the first (made when this is the job's first run), or
    none: a gzip file, one smaller than two parts, or one that cannot be read from the middle."""
    made = list(SendJobPart.objects.filter(job=job).order_by("index"))
    part_bytes = int(settings.GATEKEEPER_SEND_FILE_PART_BYTES)
    if made or size < 2 * part_bytes or not getattr(handle, "seekable", lambda: False)():
        return made
    try:
        gzip = bytes(handle.read(2)) == b"\x1f\x8b"
        handle.seek(0)
        cuts = [] if gzip else file_cuts(handle, size, part_bytes)
        handle.seek(0)
    except OSError:
        return []  # read as one: the reading names what is wrong
    if not cuts:
        return []
    ends = [start for start, _ in cuts[1:]] + [size]
    return SendJobPart.objects.bulk_create(
        SendJobPart(job=job, index=i, start=start, end=end, first_line=line)
        for i, ((start, line), end) in enumerate(zip(cuts, ends, strict=True), start=1)
    )


class _Taken(enum.Enum):
    """How taking in a file's parts ended."""

    ALL = enum.auto()
    STOPPED = enum.auto()
    BAD_LINE = enum.auto()
    UNREADABLE = enum.auto()


def _parts_taken_in(
    job_id: int,
    lease: RowLease,
    staging: _Staging,
    parts: list[SendJobPart],
    reject: bool,
    hand: Callable[[list[int]], None],
    progress: Callable[[int, int], None] | None,
) -> tuple["_Taken", str]:
    """Take in the parts after the first, in file order, each once it is read (reading it here
    when no worker has started it): its users listed before counted as repeats and taken out of
    its chunks, its counts added, its chunks handed out. (ALL, "") when all were taken in;
    (STOPPED, "") when the job was cancelled or another run took it over; (BAD_LINE, "") on a
    bad line with `reject`; (UNREADABLE, why) when one could not be read."""
    size = parts[-1].end
    for index in range(1, len(parts) + 1):
        part = _part_ready(job_id, lease, index)
        if part is None:
            return _Taken.STOPPED, ""
        if part.status == SendJobPart.Status.FAILED:
            return _Taken.UNREADABLE, part.error
        users = type(staging.seen.ids).deserialize(bytes(part.users)) if part.users else None
        repeats = 0
        if users is not None:
            listed_before = users & staging.seen.ids
            repeats = len(listed_before)
            if listed_before and part.status == SendJobPart.Status.READ:
                _repeats_removed(job_id, index, listed_before)
            staging.seen.ids |= users
        staging.rows += part.rows
        staging.invalid += part.invalid
        staging.repeats += part.repeats + repeats
        room = INVALID_ROWS_KEPT - len(staging.invalid_rows)
        staging.invalid_rows.extend(part.invalid_rows[: max(0, room)])
        if reject and part.invalid:
            return _Taken.BAD_LINE, ""
        if progress is not None:
            progress(part.end, size)
        if part.status == SendJobPart.Status.TAKEN:
            continue  # by a run before this one, which died
        ids = _handed_out(job_id, lease, staging.rows, part.end, part=index)
        if ids is None:
            return _Taken.STOPPED, ""
        hand(ids)
    return _Taken.ALL, ""


def _part_ready(job_id: int, lease: RowLease, index: int) -> SendJobPart | None:
    """Part `index` once it is read (or could not be): read here if no worker has started it;
    while a worker reads it, a later part no worker has started is read here meanwhile. None
    when the job was cancelled or another run took it over."""

    def kept() -> bool:
        return lease.renew(where=Q(cancelled_at__isnull=True))

    while True:
        part = SendJobPart.objects.get(job_id=job_id, index=index)
        if part.status != SendJobPart.Status.WAITING:
            return part
        if send_job_part_run(job_id=job_id, index=index, keep=kept):
            continue
        later = SendJobPart.objects.filter(
            lease_free(timezone.now()),
            job_id=job_id,
            index__gt=index,
            status=SendJobPart.Status.WAITING,
        ).values_list("index", flat=True)
        if any(send_job_part_run(job_id=job_id, index=i, keep=kept) for i in later):
            continue
        if not kept():
            return None
        time.sleep(PART_WAIT_SECONDS)  # a worker reads it: a few lines' time


def _repeats_removed(job_id: int, index: int, users: Any) -> None:
    """Take out of a part's staged chunks the users an earlier part listed (each is there once:
    its reader kept the first of its own repeats)."""
    for chunk in SendChunk.objects.filter(
        job_id=job_id, part=index, status=SendChunk.Status.STAGED
    ):
        rest = [r for r in chunk.recipients if r["user_id"] not in users]
        if not rest:
            chunk.delete()
        elif len(rest) < len(chunk.recipients):
            chunk.recipients, chunk.size = rest, len(rest)
            chunk.plan = repacked(chunk)
            chunk.save(update_fields=["recipients", "size", "plan"])


def send_job_part_run(*, job_id: int, index: int, keep: Callable[[], bool] | None = None) -> bool:
    """Read part `index` of a preparing job's file into staged chunks (never handed out here:
    the job's reading run takes them in, in file order) and keep its counts, bad rows and user
    ids on the part. False when it is not to be read here: read already, read by another run
    (its lease), or its job ended. `keep()`, at each write: False stops the reading (the
    caller's own hold on the job is gone)."""
    rows = SendJobPart.objects.filter(job_id=job_id, index=index)
    lease = RowLease(rows, lease_length())
    live = Q(job__status=SendJob.Status.PREPARING, job__cancelled_at__isnull=True)
    if not lease.take(timezone.now(), where=Q(status=SendJobPart.Status.WAITING) & live):
        return False
    part = rows.select_related("job").get()
    job = part.job
    # A run before this one that died left what it staged: read again from the part's start.
    staged = SendChunk.objects.filter(job_id=job_id, part=index, status=SendChunk.Status.STAGED)
    staged.delete()
    staging = _Staging(job, skip=0, part=index, every=STAGE_EVERY)
    rules = RecipientRules.of_job(job)
    reject = job.on_invalid == SendJob.OnInvalid.REJECT
    stopped: list[bool] = []

    def held() -> bool:
        if lease.renew(where=live) and (keep is None or keep()):
            return True
        stopped.append(True)
        return False

    handle: Any = None
    try:
        handle, _ = _open(job)
        header = file_header(bytes(handle.readline(HEADER_BYTES)))
        _read(
            recipient_lines(
                FileRange(handle, part.start, part.end),
                rules,
                first_line=part.first_line,
                header=header,
            ),
            staging,
            reject=reject,
            first_bad=lambda: None,
            written=lambda: True,
            naming=held,
            before_write=held,
        )
    except FileError as exc:
        result: dict[str, Any] = {"status": SendJobPart.Status.FAILED, "error": str(exc.message)}
    else:
        result = {
            "status": SendJobPart.Status.READ,
            "rows": staging.rows,
            "invalid": staging.invalid,
            "repeats": staging.repeats,
            "invalid_rows": staging.invalid_rows,
            "users": staging.seen.ids.serialize(),
        }
    finally:
        if handle is not None:
            handle.close()
    if stopped or not lease.give_back(where=live, **result):
        staged.delete()  # the job ended meanwhile (or another run read it): what this staged goes
    return True


def _send_chunks(job_id: int) -> Any:
    """The chunks of a job's file handed out (queued, or ended since): not staged, not the
    follow-ups its runs made."""
    return SendChunk.objects.filter(job_id=job_id, kind=SendChunk.Kind.SEND).exclude(
        status=SendChunk.Status.STAGED
    )


def handed_size(job_id: int) -> int:
    """Recipients in the chunks of a job's file handed out."""
    return int(_send_chunks(job_id).aggregate(n=Sum("size"))["n"] or 0)


def _counted(job: SendJob, staging: _Staging, *, handed: int | None = None) -> None:
    """What was read, on the (locked) job: its rows, bad ones and repeats. With `handed` (the
    recipients handed out), the valid rows read and never handed out count as cancelled."""
    job.total = staging.rows
    job.invalid = staging.invalid
    job.duplicate += staging.repeats
    job.invalid_rows = staging.invalid_rows[:INVALID_ROWS_KEPT]
    if handed is not None:
        job.cancelled += staging.rows - staging.invalid - staging.repeats - handed


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
        handed = handed_size(job_id)
        if handed:
            # Read up to where it was refused: what was handed out settles as it runs (what had
            # not gone out as cancelled), the rest read before the line is cancelled.
            _counted(job, staging, handed=handed)
        job.invalid_rows = staging.invalid_rows[:INVALID_ROWS_KEPT]
        error = _failed_words(error, handed)
        job.status = SendJob.Status.FAILED
        job.error = error[:4000]
        job.prepare_lease_until = None
        job.save()
        file_removed_on_commit(job)
        _parts_read(job_id)
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
        # Read up to where it was cancelled: what was valid and not handed out is cancelled,
        # never queued; what was handed out ends as it runs.
        cancelled = job.cancelled_at is not None
        _counted(job, staging, handed=handed_size(job_id) if cancelled else None)
        job.read_bytes = read_bytes
        job.prepare_lease_until = None
        ids: list[int] = []
        started = job.started_at is not None
        if cancelled:
            staged.delete()
        elif not started and job.start_at is not None and job.start_at > now:
            job.status = SendJob.Status.SCHEDULED  # staged until its start (worker.scheduling)
        elif job.paused_at is not None:  # queued when it is resumed
            staged.update(**UNSTAGED)
            job.status = SendJob.Status.PAUSED
            job.started_at = job.started_at or now
        else:
            ids = list(staged.order_by("pk").values_list("pk", flat=True))
            staged.update(**UNSTAGED, queued_at=now)
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
        _parts_read(job_id)
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


def _parts_read(job_id: int) -> None:
    """Its file read (or refused): the user ids its parts listed are of no more use."""
    SendJobPart.objects.filter(job_id=job_id).exclude(users=b"").update(users=b"")


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
