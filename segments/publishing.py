"""Building and publishing snapshots, and rolling back: the work the `builds` queue does.

`segments.services.build_start` queues a build; `segments.tasks.build_snapshot` runs
`build_run` here. Publishing (and a rollback's switch) holds one Redis lock per deployment, so
a reader of the store never sees two writers.
"""

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from gatekeeper.lib.leases import LeaseLost, RedisLease
from gatekeeper.lib.redis_client import REDIS_DOWN
from segments.bitmaps import add_ids, empty_bitmap, resolve_overlaps, serialize, sha256
from segments.index import SnapshotNotFound, load_version
from segments.models import Build, Segment, UserList
from segments.parsing import ListSummary, iter_ids
from segments.selectors import build_active
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

LOCK_NAME = "segments:build-lock"


def _publish_lock() -> RedisLease:
    """The lock a build holds while it publishes and a rollback while it switches versions;
    under the key prefix, so deployments sharing a Redis do not block each other."""
    name = f"{settings.GATEKEEPER_KEY_PREFIX}{LOCK_NAME}"
    return RedisLease(name, int(Build.LEASE.total_seconds()))


def _released(lock: RedisLease, words: str) -> None:
    """Give the lock back; one that ran out meanwhile (another may hold it now, and keeps it)
    or a Redis that cannot answer is logged as `words`."""
    try:
        released = lock.release()
    except REDIS_DOWN:
        released = False
    if not released:
        logger.warning(words)


class BuildInProgress(Exception):
    def __init__(self, build: Build) -> None:
        super().__init__(
            f"Build #{build.pk} is {build.status} ({build.progress}% done): "
            "wait for it to finish before starting another."
        )
        self.build = build


class BuildBusy(Exception):
    """Another process holds the publish lock; the task tries again shortly."""


def build_give_up(build: Build, error: str) -> None:
    """Mark a build failed with `error` (a failed attempt, or a build found dead)."""
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
    if not lock.take():
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
            if not lock.renew():
                raise LeaseLost("the publish lock ran out; another build may be publishing")
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
        build_give_up(build, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        _released(lock, "Build lock had already expired")


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
    store = store or store_from_settings()
    if version not in store.list_versions():
        raise SnapshotNotFound(f"There is no snapshot version '{version}'.")
    # A running build would publish over the rollback and could prune the version made live:
    # refuse while one is queued or running, and hold the publish lock while switching.
    active = build_active()
    if active is not None:
        raise BuildInProgress(active)
    lock = _publish_lock()
    if not lock.take():
        raise BuildBusy("a build is publishing; try again when it has finished")
    try:
        load_version(store, version)  # raises SnapshotError if anything is missing or corrupt
        store.put(CURRENT, version.encode())
    finally:
        _released(lock, "Publish lock had already expired")
    logger.info("Snapshot %s is live again (rollback)", version)
