"""User lists: stored from an upload, validated (here or, when large, in the background),
counted, and replacing the lists before them. The work; `segments.services.user_list_import`
is the way in, and queues the background validation (`segments.tasks.user_list_validate`).
"""

import logging
import tempfile
import time
from datetime import datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.core.files import File
from django.db import transaction
from django.utils import timezone

from gatekeeper.lib.files import remover, storage_name
from gatekeeper.lib.instants import instant_or_now
from segments.bitmaps import bitmap_from_chunks
from segments.models import Segment, UserList
from segments.parsing import ListSummary, ParseStopped, UserListError, iter_ids

logger = logging.getLogger(__name__)


def _list_limits() -> dict[str, int]:
    return {
        "max_bytes": int(settings.GATEKEEPER_USER_LIST_MAX_BYTES),
        "max_lines": int(settings.GATEKEEPER_USER_LIST_MAX_LINES),
    }


def user_list_store(
    *,
    segment: Segment,
    fileobj: Any,
    name: str,
    replace: bool = False,
    user: Any = None,
    inline_bytes: int | None = None,
) -> UserList:
    """Validate a user-list file and store it as one of the segment's lists.

    The file is streamed once: parsed chunk by chunk while a copy goes to a temporary file, so
    memory stays bounded whatever its size. A bad line raises UserListError (with its line
    number) and nothing is stored; so does a file beyond GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES
    as sent, or beyond GATEKEEPER_USER_LIST_MAX_BYTES or _MAX_LINES once decompressed.

    `inline_bytes` bounds the work done here: a list whose decompressed text is longer is
    stored whole as `validating`, for `user_list_validate` to finish (the caller queues it once
    the transaction commits); None validates everything here. `replace=True` makes it the
    segment's only list, atomically, once it is ready.
    """
    if segment.is_default:
        raise UserListError(
            "The default segment has no lists: it holds every user who is in no other list"
        )
    summary = ListSummary()
    width = settings.GATEKEEPER_ID_WIDTH
    with tempfile.NamedTemporaryFile(prefix="user-list-", suffix=".upload") as copy:
        tee = _Tee(fileobj, copy, limit=int(settings.GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES))
        ids = iter_ids(
            tee, width=width, summary=summary, stop_after_bytes=inline_bytes, **_list_limits()
        )
        try:
            bitmap = bitmap_from_chunks(ids, width=width)
        except ParseStopped:
            bitmap = None
            tee.drain()  # the rest of the upload, stored unread for the task
        copy.flush()
        copy.seek(0)
        with transaction.atomic():
            # The segment's row lock orders this against other imports and validations of the
            # segment's lists, so two replacing uploads cannot both stay.
            Segment.objects.select_for_update().filter(pk=segment.pk).first()
            user_list = UserList(
                segment=segment,
                original_name=name[:255],
                size_bytes=tee.size,
                uploaded_by=user if user is not None and user.is_authenticated else None,
                replaces_others=replace,
            )
            if bitmap is None:
                user_list.status = UserList.Status.VALIDATING
                user_list.checked_at = timezone.now()
            else:
                _count(user_list, summary, distinct=len(bitmap))
            user_list.file.save(storage_name(name, "user-list.txt"), File(copy), save=False)
            user_list.save()
            if bitmap is not None:
                _replace_older(user_list)
    return user_list


def _count(user_list: UserList, summary: ListSummary, *, distinct: int) -> None:
    user_list.status = UserList.Status.READY
    user_list.line_count = summary.lines
    user_list.header_lines = summary.header
    user_list.listed_ids = summary.ids
    user_list.id_count = distinct


def _replace_older(user_list: UserList) -> None:
    """Inside the transaction that made `user_list` ready: with `replaces_others`, the lists
    uploaded before it go (their files after the commit, so a rollback loses none)."""
    if not user_list.replaces_others:
        return
    for previous in UserList.objects.filter(segment=user_list.segment_id, pk__lt=user_list.pk):
        previous.delete()
        transaction.on_commit(remover(previous.file))


def user_list_validate(*, user_list_id: int, progress_every: float = 5.0) -> UserList | None:
    """Validate a list stored as `validating` (the Celery task's work): it becomes `ready`, or
    `failed` with the reason (and the line), its file deleted. Safe to run again (a redelivered
    or re-queued task): a list no longer validating, or gone, is left alone. Notes the lines
    read so far on the row every `progress_every` seconds, for the pages that show it, and as
    the heartbeat `user_lists_stalled` looks at."""
    user_list = UserList.objects.filter(pk=user_list_id).first()
    if user_list is None or user_list.status != UserList.Status.VALIDATING:
        return user_list
    summary = ListSummary()
    width = settings.GATEKEEPER_ID_WIDTH
    noted = time.monotonic()

    def noting(chunks: Any) -> Any:
        nonlocal noted
        for chunk in chunks:
            if time.monotonic() - noted > progress_every:
                UserList.objects.filter(pk=user_list_id).update(
                    line_count=summary.lines, checked_at=timezone.now()
                )
                noted = time.monotonic()
            yield chunk

    try:
        with user_list.file.open("rb") as handle:
            chunks = iter_ids(handle, width=width, summary=summary, **_list_limits())
            bitmap = bitmap_from_chunks(noting(chunks), width=width)
    except UserListError as exc:
        return _validation_failed(user_list_id, exc.messages[0], exc.line, summary)
    except Exception as exc:  # the stored file is gone or unreadable: say so, never hang
        logger.exception("User list %s could not be validated", user_list_id)
        reason = (
            f"The stored upload could not be read ({type(exc).__name__}: {exc}); upload it again"
        )
        return _validation_failed(user_list_id, reason, None, summary)
    with transaction.atomic():
        locked = _lock_validating(user_list_id)
        if locked is not None:
            _count(locked, summary, distinct=len(bitmap))
            locked.save()
            _replace_older(locked)
    return UserList.objects.filter(pk=user_list_id).first()


def _lock_validating(user_list_id: int) -> UserList | None:
    """Inside a transaction: the list, its segment's row locked (as imports lock it), if it is
    still validating; None if another run finished it or a newer replacing list removed it."""
    user_list = UserList.objects.filter(pk=user_list_id).first()
    if user_list is None:
        return None
    Segment.objects.select_for_update().filter(pk=user_list.segment_id).first()
    user_list = UserList.objects.select_for_update().filter(pk=user_list_id).first()
    if user_list is None or user_list.status != UserList.Status.VALIDATING:
        return None
    return user_list


def _validation_failed(
    user_list_id: int, reason: str, line: int | None, summary: ListSummary
) -> UserList | None:
    with transaction.atomic():
        locked = _lock_validating(user_list_id)
        if locked is not None:
            locked.status = UserList.Status.FAILED
            locked.error = reason
            locked.error_line = line
            locked.line_count = summary.lines
            transaction.on_commit(remover(locked.file))
            locked.file = None
            locked.save()
    logger.info("User list %s refused: %s", user_list_id, reason)
    return UserList.objects.filter(pk=user_list_id).first()


def user_lists_stalled(
    *, now: datetime | None = None, after: timedelta = timedelta(minutes=10)
) -> list[int]:
    """The lists whose validation task was lost (a broker outage when it was queued, a worker
    killed mid-way): validating, and no sign of progress for `after`. Marked as seen now, so
    the caller (beat, every few minutes) queues each once."""
    now = instant_or_now(now)
    stale = UserList.objects.filter(status=UserList.Status.VALIDATING, checked_at__lt=now - after)
    ids = list(stale.values_list("pk", flat=True)[:100])
    UserList.objects.filter(pk__in=ids).update(checked_at=now)
    return ids


class _Tee:
    """A readable stream that copies what is read into `sink` (the stored copy), and refuses
    to read more than `limit` bytes of it."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], *, limit: int) -> None:
        self.source, self.sink, self.limit, self.size = source, sink, limit, 0

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self.size += len(data)
        if self.size > self.limit:
            raise UserListError(
                f"The upload is larger than {self.limit:,} bytes, the most a list may be as "
                "sent (GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES)"
            )
        self.sink.write(data)
        return data

    def drain(self) -> None:
        try:
            while self.read(1 << 20):
                pass
        except OSError as exc:  # the client went away before the end of the upload
            raise UserListError(f"The file could not be read to its end: {exc}") from exc

    def readable(self) -> bool:
        return True
