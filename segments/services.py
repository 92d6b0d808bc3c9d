"""Writes of the segments app: user-list imports, snapshot builds, rollback.

Admin actions, REST views, management commands and the Celery task all call these.
"""

import json
import logging
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.db import IntegrityError, transaction
from django.utils import timezone

from segments.bitmaps import (
    add_ids,
    bitmap_from_chunks,
    empty_bitmap,
    resolve_overlaps,
    serialize,
    sha256,
)
from segments.models import Build, Segment, UserList
from segments.parsing import ListSummary, ParseStopped, UserListError, iter_ids
from segments.store import (
    CURRENT,
    MANIFEST,
    NotFound,
    SnapshotStore,
    bitmap_name,
    snapshot_key,
    store_from_settings,
)

logger = logging.getLogger(__name__)

# A build whose worker has not reported for this long is taken for dead (killed, lost).
BUILD_LEASE = timedelta(minutes=10)
LOCK_NAME = "segments:build-lock"


def _publish_lock() -> Any:
    """The lock a build holds while it publishes and a rollback while it switches versions;
    under the key prefix, so deployments sharing a Redis do not block each other."""
    from gatekeeper.redis_client import get_redis

    name = f"{settings.GATEKEEPER_KEY_PREFIX}{LOCK_NAME}"
    return get_redis().lock(name, timeout=int(BUILD_LEASE.total_seconds()), blocking=False)


class BuildInProgress(Exception):
    def __init__(self, build: Build) -> None:
        super().__init__(
            f"Build #{build.pk} is {build.status} ({build.progress}% done): "
            "wait for it to finish before starting another."
        )
        self.build = build


class BuildBusy(Exception):
    """Another process holds the publish lock; the task tries again shortly."""


# --- segments ---------------------------------------------------------------------------------


class SegmentConflict(Exception):
    """Another request created a segment with the same slug or priority at the same moment."""


def segment_create(*, slug: str, name: str, priority: int, description: str = "") -> Segment:
    """A new segment. Raises ValidationError naming the field (a slug or priority in use), or
    SegmentConflict when a concurrent request took it between the check and the insert."""
    segment = Segment(slug=slug, name=name, priority=priority, description=description)
    segment.full_clean()
    try:
        with transaction.atomic():
            segment.save()
    except IntegrityError as exc:
        raise SegmentConflict(
            f"A segment with the slug '{slug}' or the priority {priority} was created at the "
            "same moment; look at the segments and try again."
        ) from exc
    return segment


def segment_change(*, segment: Segment, **changes: Any) -> Segment:
    """Change a segment's name, priority or description. Its slug never changes: it names the
    segment in published snapshots, and caps are matched to users by it, so a renamed segment
    would lose its caps until the next build."""
    if changes.pop("slug", segment.slug) != segment.slug:
        raise ValidationError(
            {
                "slug": "A segment's slug cannot change: snapshots and caps know the segment by "
                "it. Create a new segment instead."
            }
        )
    unknown = set(changes) - {"name", "priority", "description"}
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))}")
    if not changes:
        return segment
    for field, value in changes.items():
        setattr(segment, field, value)
    segment.full_clean()
    segment.save(update_fields=[*changes, "updated_at"])
    return segment


# --- user lists -------------------------------------------------------------------------------


def _list_limits() -> dict[str, int]:
    return {
        "max_bytes": int(settings.GATEKEEPER_USER_LIST_MAX_BYTES),
        "max_lines": int(settings.GATEKEEPER_USER_LIST_MAX_LINES),
    }


def user_list_import(
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

    `inline_bytes` bounds the work done here (the web process passes
    GATEKEEPER_USER_LIST_INLINE_BYTES): a list whose decompressed text is longer is stored
    whole as `validating`, and `segments.tasks.user_list_validate` finishes the job; None
    validates everything here (management commands). `replace=True` makes it the segment's
    only list, atomically, once it is ready.
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
            user_list.file.save(_storage_name(name), File(copy), save=False)
            user_list.save()
            if bitmap is None:
                # robust: a broker outage leaves the list for `user_lists_stalled`, not a 500
                # after it was stored.
                transaction.on_commit(lambda: _queue_validation(user_list.pk), robust=True)
            else:
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
        transaction.on_commit(_file_remover(previous.file))


def _queue_validation(user_list_id: int) -> None:
    from segments.tasks import user_list_validate

    user_list_validate.delay(user_list_id)


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
            transaction.on_commit(_file_remover(locked.file))
            locked.file = None
            locked.save()
    logger.info("User list %s refused: %s", user_list_id, reason)
    return UserList.objects.filter(pk=user_list_id).first()


def user_lists_stalled(*, now: Any = None, after: timedelta = timedelta(minutes=10)) -> int:
    """Queue again the validation of lists whose task was lost (a broker outage when it was
    queued, a worker killed mid-way): validating, and no sign of progress for `after` (beat
    runs this every few minutes). Returns how many were queued."""
    now = now or timezone.now()
    stale = UserList.objects.filter(status=UserList.Status.VALIDATING, checked_at__lt=now - after)
    ids = list(stale.values_list("pk", flat=True)[:100])
    UserList.objects.filter(pk__in=ids).update(checked_at=now)
    for user_list_id in ids:
        _queue_validation(user_list_id)
    return len(ids)


def _file_remover(field_file: Any) -> Callable[[], None]:
    # After commit: a rolled-back replace must not lose the file of a list that stays.
    storage, name = field_file.storage, field_file.name
    return lambda: storage.delete(name) if name else None


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


def _storage_name(name: str) -> str:
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in name.rsplit("/", 1)[-1])
    return base or "user-list.txt"


# --- builds -----------------------------------------------------------------------------------


def build_start(*, user: Any = None, queue: bool = True) -> Build:
    """Queue a build. Refused (BuildInProgress) while another build is queued or running.

    `queue=False` only creates the row, for a caller that runs `build_run` itself."""
    from segments.tasks import build_snapshot

    with transaction.atomic():
        active = Build.objects.select_for_update().filter(
            status__in=[Build.Status.QUEUED, Build.Status.RUNNING]
        )
        for build in active:
            last_sign = build.heartbeat_at or build.created_at
            if timezone.now() - last_sign < BUILD_LEASE:
                raise BuildInProgress(build)
            _fail(build, "The worker running this build stopped reporting; it was given up.")
        build = Build.objects.create(
            requested_by=user if user is not None and user.is_authenticated else None
        )
        if queue:
            transaction.on_commit(lambda: build_snapshot.delay(build.pk))
    return build


def _fail(build: Build, error: str) -> None:
    build.status = Build.Status.FAILED
    build.error = error
    build.finished_at = timezone.now()
    build.save(update_fields=["status", "error", "finished_at"])


def build_run(
    *,
    build_id: int,
    store: SnapshotStore | None = None,
    on_progress: Callable[[Build], None] | None = None,
) -> Build:
    """Build and publish a snapshot. Safe to run again for the same build (a redelivered task):
    each attempt starts over and publishes a new version; the live one is untouched until the
    last step. Raises BuildBusy if another process holds the publish lock."""

    store = store or store_from_settings()
    build = Build.objects.get(pk=build_id)  # before the lock: a missing build holds nothing
    lock = _publish_lock()
    if not lock.acquire():
        raise BuildBusy("another build is publishing")
    try:
        if build.status == Build.Status.SUCCEEDED:
            return build
        build.status = Build.Status.RUNNING
        build.attempts += 1
        build.started_at = timezone.now()
        build.error = ""
        build.progress = 0
        build.save()

        def progress(percent: float, stage: str) -> None:
            build.progress = min(int(percent), 99)
            build.stage = stage
            build.heartbeat_at = timezone.now()
            build.save(update_fields=["progress", "stage", "heartbeat_at"])
            lock.reacquire()
            if on_progress:
                on_progress(build)

        _build_and_publish(build, store, progress)
        build.status = Build.Status.SUCCEEDED
        build.progress = 100
        build.stage = "published"
        build.finished_at = timezone.now()
        build.save()
        if on_progress:
            on_progress(build)
        return build
    except BuildBusy:
        raise
    except Exception as exc:
        logger.exception("Build #%s failed", build_id)
        build.stage = "failed"
        build.save(update_fields=["stage"])
        _fail(build, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        try:
            lock.release()
        except Exception:
            logger.warning("Build lock had already expired")


def _build_and_publish(
    build: Build, store: SnapshotStore, progress: Callable[[float, str], None]
) -> None:
    width = settings.GATEKEEPER_ID_WIDTH
    segments = list(Segment.objects.order_by("priority"))
    if not any(segment.is_default for segment in segments):
        raise ValueError(
            "There is no default segment (run `manage.py migrate`): nothing to publish."
        )
    lists = list(
        UserList.objects.filter(segment__in=segments, status=UserList.Status.READY).order_by("pk")
    )
    total_bytes = sum(max(user_list.size_bytes, 1) for user_list in lists) or 1
    done = 0
    listed = []
    for segment in segments:
        if segment.is_default:
            continue
        own = [user_list for user_list in lists if user_list.segment_id == segment.pk]
        bitmap = empty_bitmap(width)
        for user_list in own:
            stage = f"reading {segment.slug}: {user_list.original_name}"
            summary = ListSummary()
            with user_list.file.open("rb") as handle:
                for ids in iter_ids(handle, width=width, summary=summary):
                    add_ids(bitmap, ids)
                    # Bytes read are decompressed bytes for a .gz list: clamp to its share.
                    share = min(summary.bytes, user_list.size_bytes)
                    progress(80 * (done + share) / total_bytes, stage)
            done += max(user_list.size_bytes, 1)
        listed.append((segment.slug, bitmap))
    progress(82, "resolving overlaps by priority")
    resolved = {r.slug: r for r in resolve_overlaps(listed, width=width)}

    # Sortable by time, then build and attempt: a redelivered build never reuses a version.
    version = f"{datetime.now(UTC):%Y%m%dT%H%M%S}Z-b{build.pk:07d}-{build.attempts}"
    entries = []
    stats: dict[str, dict[str, Any]] = {}
    for i, segment in enumerate(segments):
        entry: dict[str, Any] = {
            "slug": segment.slug,
            "priority": segment.priority,
            "is_default": segment.is_default,
        }
        if segment.is_default:
            # Not stored: the default segment is everyone the other bitmaps do not hold.
            entry.update(cardinality=None, bytes=0, sha256=None, key=None)
            stats[segment.slug] = {
                "listed": 0,
                "cardinality": None,
                "lost_to_higher_priority": 0,
                "bytes": 0,
            }
        else:
            r = resolved[segment.slug]
            data = serialize(r.bitmap)
            key = snapshot_key(version, bitmap_name(segment.slug))
            progress(85 + 10 * i / len(segments), f"uploading {segment.slug}")
            store.put(key, data)
            entry.update(cardinality=len(r.bitmap), bytes=len(data), sha256=sha256(data), key=key)
            stats[segment.slug] = {
                "listed": r.listed,
                "cardinality": len(r.bitmap),
                "lost_to_higher_priority": r.lost_to_higher_priority,
                "bytes": len(data),
            }
        entries.append(entry)
    manifest = {
        "version": version,
        "id_width": width,
        "build_id": build.pk,
        "created_at": datetime.now(UTC).isoformat(),
        "segments": entries,
    }
    progress(96, "writing the manifest")
    store.put(snapshot_key(version, MANIFEST), json.dumps(manifest, indent=2).encode())
    # Last: until CURRENT names it, no reader sees the new version.
    store.put(CURRENT, version.encode())
    build.version = version
    build.stats = stats
    build.total_users = sum(e["cardinality"] or 0 for e in entries)
    build.snapshot_bytes = sum(e["bytes"] for e in entries)
    progress(98, "removing old versions")
    snapshot_prune(store=store, keep=settings.GATEKEEPER_SNAPSHOT_RETENTION)


def snapshot_prune(*, store: SnapshotStore, keep: int) -> list[str]:
    """Delete all but the newest `keep` complete versions (never the live one) and any
    incomplete leftovers of failed builds. Only called while holding the build lock."""
    live = _live_version(store)
    complete, incomplete = [], []
    for version in store.list_versions():
        try:
            store.get(snapshot_key(version, MANIFEST))
            complete.append(version)
        except NotFound:
            incomplete.append(version)
    doomed = [v for v in complete[: max(len(complete) - keep, 0)] if v != live] + incomplete
    for version in doomed:
        store.delete_version(version)
    return doomed


def _live_version(store: SnapshotStore) -> str | None:
    try:
        return store.get(CURRENT).decode().strip()
    except NotFound:
        return None


def snapshot_rollback(*, version: str, store: SnapshotStore | None = None) -> None:
    """Make an earlier version live again, after checking every object of it."""
    from segments.index import SnapshotNotFound, load_version

    store = store or store_from_settings()
    if version not in store.list_versions():
        raise SnapshotNotFound(f"There is no snapshot version '{version}'.")
    # A running build would publish over the rollback and could prune the version made live:
    # refuse while one is queued or running, and hold the publish lock while switching.
    active = _active_build()
    if active is not None:
        raise BuildInProgress(active)
    lock = _publish_lock()
    if not lock.acquire():
        raise BuildBusy("a build is publishing; try again when it has finished")
    try:
        load_version(store, version)  # raises SnapshotError if anything is missing or corrupt
        store.put(CURRENT, version.encode())
    finally:
        try:
            lock.release()
        except Exception:
            logger.warning("Publish lock had already expired")
    logger.info("Snapshot %s is live again (rollback)", version)


def _active_build() -> Build | None:
    """A build queued or running within its lease (a dead worker's build does not count)."""
    for build in Build.objects.filter(status__in=[Build.Status.QUEUED, Build.Status.RUNNING]):
        if timezone.now() - (build.heartbeat_at or build.created_at) < BUILD_LEASE:
            return build
    return None
