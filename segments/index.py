"""The segment index: one published snapshot, in memory, read-only.

`resolve` answers one user; `resolve_many` answers a batch with bitmap and numpy operations
(one intersection per segment), never a Python loop over users. Every web and worker process
holds one through `get_index()`, which loads the live snapshot on first use, keeps the last good
one on local disk for a start while the store is unreachable, and swaps newer versions in
without a restart (`refresh()` is one polling step; `start_follower()` runs it in a thread).
"""

import array
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from pyroaring import BitMap, BitMap64

from gatekeeper.lib.ids import max_user_id
from segments.bitmaps import AnyFrozen, deserialize, sha256
from segments.store import (
    CURRENT,
    MANIFEST,
    SnapshotStore,
    StoreError,
    snapshot_key,
    store_from_url,
)

logger = logging.getLogger(__name__)


class SnapshotError(Exception):
    """A snapshot that cannot be used: missing, corrupt, or not matching its manifest."""


class SnapshotNotFound(SnapshotError):
    """No version of that name was ever published (or it was pruned)."""


@dataclass
class SegmentIndex:
    version: str
    id_width: int
    segments: list[str]
    default_slug: str
    bitmaps: dict[str, AnyFrozen]
    cardinalities: dict[str, int]
    manifest: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Segments with users, in priority order; they are disjoint, so order only matters for
        # speed, and the largest first answers most single lookups with one membership test.
        self._ordered = sorted(
            ((slug, bm) for slug, bm in self.bitmaps.items() if len(bm)), key=lambda p: -len(p[1])
        )
        self._labels = np.array([*self.segments, self.default_slug], dtype=object)
        self._position = {slug: i for i, slug in enumerate(self.segments)}

    @property
    def total_users(self) -> int:
        return sum(self.cardinalities.values())

    def resolve(self, user_id: int) -> str:
        if self.id_width == 32 and not 0 <= user_id <= _MAX_32:
            return self.default_slug  # no list of a 32-bit snapshot can hold it
        for slug, bitmap in self._ordered:
            if user_id in bitmap:
                return slug
        return self.default_slug

    def resolve_many(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """The segment of each id, in the order given: one bitmap intersection per segment,
        then each hit is placed back by a binary search in the sorted query."""
        wide = self.id_width == 64
        try:
            values = np.asarray(ids, dtype=np.uint64 if wide else np.uint32)
        except OverflowError:
            return self._resolve_beyond_width(ids)
        if values.size == 0:
            return []
        if wide:
            order = np.argsort(values, kind="stable")
            ordered = values[order]
        else:
            # Sorting (id << 32 | position) is twice as fast as argsort and gives both the
            # sorted ids and where each came from.
            keyed = np.sort(
                (values.astype(np.uint64) << np.uint64(32))
                | np.arange(values.size, dtype=np.uint64)
            )
            ordered = (keyed >> np.uint64(32)).astype(np.uint32)
            order = (keyed & np.uint64(0xFFFFFFFF)).astype(np.intp)
        # pyroaring builds fastest from a sorted array.array (a buffer it copies in one go).
        query = (BitMap64 if wide else BitMap)(
            array.array("Q" if wide else "I", ordered.tobytes()), optimize=False
        )
        found = np.full(values.size, len(self.segments), dtype=np.intp)
        repeated = bool((ordered[1:] == ordered[:-1]).any())
        for slug, bitmap in self._ordered:
            hits = bitmap & query  # type: ignore[operator]
            if not hits:
                continue
            members = np.frombuffer(hits.to_array(), dtype=ordered.dtype)
            start = np.searchsorted(ordered, members, side="left")
            if not repeated:
                found[start] = self._position[slug]
            else:  # an id asked for more than once: mark every copy
                counts = np.searchsorted(ordered, members, side="right") - start
                offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
                found[np.repeat(start, counts) + offsets] = self._position[slug]
        labels = np.empty_like(found)
        labels[order] = found
        return self._labels[labels].tolist()

    def _resolve_beyond_width(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Ids a 32-bit snapshot cannot hold (wider, or negative) are in no list: default."""
        wide = np.asarray([int(i) if 0 <= int(i) <= _MAX_32 else -1 for i in ids], dtype=np.int64)
        inside = wide >= 0
        labels = np.full(wide.size, self.default_slug, dtype=object)
        labels[inside] = self.resolve_many(wide[inside].astype(np.uint32))
        return labels.tolist()


_MAX_32 = 2**32 - 1


def _verify(data: bytes, entry: dict[str, Any]) -> None:
    if len(data) != entry["bytes"]:
        raise SnapshotError(f"{entry['key']}: {len(data)} bytes, manifest says {entry['bytes']}")
    if sha256(data) != entry["sha256"]:
        raise SnapshotError(f"{entry['key']}: sha256 does not match the manifest")


def index_from_objects(manifest: dict[str, Any], read: Any) -> SegmentIndex:
    """Build an index from a manifest and a `read(key) -> bytes` function. Every object's size
    and sha256 are checked before it is deserialised, and its cardinality after."""
    width = int(manifest.get("id_width", 32))
    bitmaps: dict[str, AnyFrozen] = {}
    cardinalities: dict[str, int] = {}
    default = None
    slugs = []
    for entry in manifest["segments"]:
        if entry.get("is_default"):
            default = entry["slug"]
            continue
        slugs.append(entry["slug"])
        data = read(entry["key"])
        _verify(data, entry)
        try:
            bitmap = deserialize(data, width=width)
        except Exception as exc:  # pyroaring raises ValueError or others on garbage
            raise SnapshotError(f"{entry['key']}: not a Roaring bitmap ({exc})") from exc
        if len(bitmap) != entry["cardinality"]:
            raise SnapshotError(
                f"{entry['key']}: {len(bitmap)} users, manifest says {entry['cardinality']}"
            )
        bitmaps[entry["slug"]] = bitmap
        cardinalities[entry["slug"]] = entry["cardinality"]
    if default is None:
        raise SnapshotError("the manifest names no default segment")
    return SegmentIndex(
        version=manifest["version"],
        id_width=width,
        segments=slugs,
        default_slug=default,
        bitmaps=bitmaps,
        cardinalities=cardinalities,
        manifest=manifest,
    )


def load_version(store: SnapshotStore, version: str) -> tuple[SegmentIndex, dict[str, bytes]]:
    """An index of one version from the store, and its raw objects (for the local cache)."""
    try:
        manifest_bytes = store.get(snapshot_key(version, MANIFEST))
        manifest = json.loads(manifest_bytes)
    except ValueError as exc:
        raise SnapshotError(f"manifest of {version} is not valid JSON") from exc
    objects = {snapshot_key(version, MANIFEST): manifest_bytes}

    def read(key: str) -> bytes:
        objects[key] = store.get(key)
        return objects[key]

    return index_from_objects(manifest, read), objects


class IndexHolder:
    """The index of one process for one store, with its disk cache and follower.

    The follower starts on first use in every process that serves (`get()`), however it was
    started: gunicorn with or without the project's config, `manage.py runserver`, uWSGI, a
    Celery child, a management command. A process that forks its servers (gunicorn's master,
    Celery's parent) loads without following (`follow_lazily = False`), and each child calls
    `after_fork()`, since threads and held locks do not survive a fork.
    """

    def __init__(self, store: SnapshotStore, cache_dir: Path) -> None:
        self.store = store
        self.cache_dir = Path(cache_dir)
        self.index: SegmentIndex | None = None
        self.source = ""
        self.loaded_at: datetime | None = None
        self.error = ""
        self.follow_lazily = True
        self.on_poll: Callable[[dict[str, Any]], None] | None = None
        self._etag: str | None = None
        self._lock = threading.Lock()
        self._follower: threading.Thread | None = None
        self._follower_pid = 0
        self._stop = threading.Event()
        self._tried = False

    def after_fork(self) -> None:
        """In a forked child: a lock the parent held at the fork would stay held, and the
        parent's follower thread is not here."""
        self._lock = threading.Lock()
        self._follower, self._follower_pid = None, 0
        self._stop = threading.Event()
        self.follow_lazily = True

    # --- loading ---------------------------------------------------------------------------

    def get(self) -> SegmentIndex | None:
        if self.index is None and not self._tried:
            with self._lock:
                if self.index is None and not self._tried:
                    self._load_initial()
                    self._tried = True
        if self.follow_lazily and self._follower_pid != os.getpid():
            self._follow_here()
        return self.index

    def _follow_here(self) -> None:
        interval = float(settings.GATEKEEPER_SNAPSHOT_POLL_SECONDS)
        with self._lock:
            if self._follower_pid == os.getpid():
                return
            self._follower_pid = os.getpid()  # also when following is off: decided once
        if interval > 0:
            self.start_follower(interval)

    def _load_initial(self) -> None:
        try:
            self._refresh_locked()
            if self.index is not None:
                return
        except (StoreError, SnapshotError) as exc:
            logger.warning("Segment snapshot could not be loaded from %s: %s", self.store.url, exc)
            self.error = f"store {self.store.url}: {exc}"
        cached = self._load_cache()
        if cached is not None:
            self._install(cached, source="cache")
            logger.warning(
                "Started from the cached snapshot %s (the store is unreachable)", cached.version
            )
        elif not self.error:
            self.error = f"no snapshot has been published to {self.store.url} yet"

    def refresh(self) -> bool:
        """One polling step: swap in the live version if it changed. True if it swapped."""
        with self._lock:
            self._tried = True
            try:
                return self._refresh_locked()
            except (StoreError, SnapshotError) as exc:
                self.error = str(exc)
                logger.warning("Keeping snapshot %s: %s", self.version or "none", exc)
                return False

    def _refresh_locked(self) -> bool:
        try:
            changed = self.store.get_if_changed(CURRENT, self._etag)
        except StoreError as exc:
            if "does not exist" in str(exc):
                self.error = f"no snapshot has been published to {self.store.url} yet"
                return False
            raise
        if changed is None:
            return False
        data, etag = changed
        version = data.decode().strip()
        if self.index is not None and version == self.index.version:
            self._etag = etag
            return False
        index, objects = load_version(self.store, version)
        self._save_cache(version, objects)
        self._install(index, source="store")
        self._etag = etag
        logger.info("Segment snapshot %s loaded (%d users in lists)", version, index.total_users)
        return True

    def _install(self, index: SegmentIndex, *, source: str) -> None:
        self.index = index
        self.source = source
        self.loaded_at = datetime.now(UTC)
        self.error = ""

    # --- the disk cache ----------------------------------------------------------------------

    def _save_cache(self, version: str, objects: dict[str, bytes]) -> None:
        try:
            target = self.cache_dir / version
            staging = self.cache_dir / f".{version}.{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            for key, data in objects.items():
                path = staging / Path(key).name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            current = self.cache_dir / f".CURRENT.{os.getpid()}"
            current.write_text(version)
            os.replace(current, self.cache_dir / CURRENT)
            for old in self.cache_dir.iterdir():
                if old.is_dir() and old.name != version and not old.name.startswith("."):
                    shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            logger.warning("Could not keep snapshot %s in %s: %s", version, self.cache_dir, exc)

    def _load_cache(self) -> SegmentIndex | None:
        try:
            version = (self.cache_dir / CURRENT).read_text().strip()
            directory = self.cache_dir / version
            manifest = json.loads((directory / MANIFEST).read_bytes())
            return index_from_objects(
                manifest, lambda key: (directory / Path(key).name).read_bytes()
            )
        except (OSError, ValueError, SnapshotError) as exc:
            if not isinstance(exc, FileNotFoundError):
                logger.warning("The cached snapshot in %s is not usable: %s", self.cache_dir, exc)
            return None

    # --- following -------------------------------------------------------------------------

    @property
    def version(self) -> str | None:
        return self.index.version if self.index else None

    def start_follower(self, interval: float) -> None:
        """Poll for new versions every `interval` seconds in a daemon thread; `on_poll`, when
        set, gets the status after each poll (processes report their version with it)."""
        if self._follower is not None and self._follower.is_alive():
            return
        self._follower_pid = os.getpid()
        self._stop.clear()

        def follow() -> None:
            while not self._stop.wait(interval):
                self.refresh()
                if self.on_poll is not None:
                    self.on_poll(self.status())

        self._follower = threading.Thread(target=follow, name="snapshot-follower", daemon=True)
        self._follower.start()

    def stop_follower(self) -> None:
        self._stop.set()

    def status(self) -> dict[str, Any]:
        return {
            "loaded": self.index is not None,
            "version": self.version,
            "source": self.source or None,
            "loaded_at": self.loaded_at.isoformat() if self.loaded_at else None,
            "store": self.store.url,
            "error": self.error or None,
        }


_holders: dict[tuple[str, str], IndexHolder] = {}
_holders_lock = threading.Lock()


def get_holder() -> IndexHolder:
    key = (settings.GATEKEEPER_STORE_URL, str(settings.GATEKEEPER_SNAPSHOT_CACHE_DIR))
    holder = _holders.get(key)
    if holder is None:
        with _holders_lock:
            holder = _holders.get(key)
            if holder is None:
                holder = IndexHolder(store_from_url(key[0]), Path(key[1]))
                _holders[key] = holder
    return holder


def get_index() -> SegmentIndex | None:
    """This process's index of the live snapshot; None when none could be loaded (not ready)."""
    return get_holder().get()


def max_answerable_user_id() -> int:
    """The largest user id a request may name: the configured width, narrowed to the loaded
    snapshot's, since a 32-bit snapshot cannot answer for a 64-bit id."""
    index = get_index()
    width = int(settings.GATEKEEPER_ID_WIDTH)
    return max_user_id(width if index is None else min(width, index.id_width))


def refresh() -> bool:
    return get_holder().refresh()


def index_status() -> dict[str, Any]:
    return get_holder().status()


def reset_index() -> None:
    """Forget every holder (tests; after fork the holder is kept but its thread is not)."""
    with _holders_lock:
        for holder in _holders.values():
            holder.stop_follower()
        _holders.clear()
