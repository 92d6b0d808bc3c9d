"""The segment index: one published snapshot, in memory, read-only.

`resolve` answers one user; `resolve_many` answers a batch with a few numpy operations over the
snapshot's bytes (`segments.packed`), never a Python loop over users. Every web and worker process
holds one through `get_index()`, which loads the live snapshot on first use, keeps the last good
one on local disk for a start while the store is unreachable, and swaps newer versions in
without a restart (`refresh()` is one polling step; `start_follower()` runs it in a thread).
"""

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings

from gatekeeper.lib.ids import max_user_id
from segments.bitmaps import AnyFrozen, deserialize, empty_bitmap, sha256
from segments.packed import PackedSegments, PortableFormatError
from segments.store import (
    CURRENT,
    MANIFEST,
    NotFound,
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


class SnapshotIncomplete(SnapshotError):
    """A published version lacking one of its objects (deleted from the store): it can never be
    loaded, however often it is tried; unlike a store that does not answer, which may later."""


class PackedBitmaps(Mapping[str, AnyFrozen]):
    """The segments' bitmaps, deserialised from the packed bytes when asked for. The index keeps
    only the packed form, so that a process holds each snapshot once (0.63 bytes per user, not
    twice that); the rare caller that needs a whole bitmap (the what-if audience) gets a copy."""

    def __init__(self, packed: PackedSegments, slugs: Sequence[str]) -> None:
        self._packed = packed
        self._position = {slug: i for i, slug in enumerate(slugs)}

    def __getitem__(self, slug: str) -> AnyFrozen:
        data = self._packed.portable_bytes(self._position[slug])
        return deserialize(data, width=self._packed.width)

    def __contains__(self, slug: object) -> bool:  # without deserialising (Mapping's would)
        return slug in self._position

    def __iter__(self) -> Iterator[str]:
        return iter(self._position)

    def __len__(self) -> int:
        return len(self._position)


@dataclass
class SegmentIndex:
    """`bitmaps` may be given as pyroaring bitmaps (tests, benchmarks); `index_from_objects`
    passes the snapshot's packed bytes instead, and `bitmaps` then deserialises on access."""

    version: str
    id_width: int
    segments: list[str]
    default_slug: str
    bitmaps: dict[str, AnyFrozen] | PackedBitmaps
    cardinalities: dict[str, int]
    manifest: dict[str, Any] = field(default_factory=dict)
    packed: PackedSegments | None = None

    def __post_init__(self) -> None:
        if self.packed is None:
            empty = empty_bitmap(self.id_width)
            blobs = [bytes(self.bitmaps.get(slug, empty).serialize()) for slug in self.segments]
            self.packed = PackedSegments(blobs, width=self.id_width)
        self._packed: PackedSegments = self.packed
        self._labels = np.array([*self.segments, self.default_slug], dtype=object)
        self._label_list = [*self.segments, self.default_slug]
        self._first_one = self._packed.first_containing_one
        self._max_id = 2**self.id_width - 1

    @property
    def total_users(self) -> int:
        return sum(self.cardinalities.values())

    def resolve(self, user_id: int) -> str:
        """The highest-priority segment holding the id, else the default one."""
        if not 0 <= user_id <= self._max_id:
            return self.default_slug  # no list of this snapshot can hold it
        return self._label_list[self._first_one(user_id)]

    def resolve_many(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """The segment of each id, in the order given: each id's container is looked up in
        every segment at once, with numpy (see `segments.packed`)."""
        dtype = np.uint64 if self.id_width == 64 else np.uint32
        # numpy would wrap a negative or too wide id silently: check before the cast
        if (
            isinstance(ids, np.ndarray)
            and ids.dtype != dtype
            and ids.size
            and not (ids.min() >= 0 and ids.max() <= self._max_id)
        ):
            return self._resolve_beyond_width(ids)
        try:
            values = np.asarray(ids, dtype=dtype)
        except OverflowError:
            return self._resolve_beyond_width(ids)
        if values.size == 0:
            return []
        return self._labels[self._packed.first_containing(values.ravel())].tolist()

    def resolve_codes(self, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """resolve_many's answers as positions in a list of segments (the second value): for
        many ids at once without a string each."""
        labels = self._labels.tolist()
        dtype = np.uint64 if self.id_width == 64 else np.uint32
        values = np.asarray(ids)
        if values.size and (values.min() < 0 or values.max() > self._max_id):
            found = self.resolve_many(values)
            where = {label: k for k, label in enumerate(labels)}
            return np.fromiter((where[s] for s in found), np.int64, len(found)), labels
        if values.size == 0:
            return np.empty(0, dtype=np.int64), labels
        codes = self._packed.first_containing(values.astype(dtype).ravel())
        return codes.astype(np.int64), labels

    def _resolve_beyond_width(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Ids the snapshot cannot hold (wider than its ids, or negative) are in no list."""
        inside = [0 <= int(i) <= self._max_id for i in ids]
        kept = [int(i) for i, ok in zip(ids, inside, strict=True) if ok]
        answers = iter(self.resolve_many(np.array(kept, dtype=np.uint64)))
        return [next(answers) if ok else self.default_slug for ok in inside]


def _verify(data: bytes, entry: dict[str, Any]) -> None:
    if len(data) != entry["bytes"]:
        raise SnapshotError(f"{entry['key']}: {len(data)} bytes, manifest says {entry['bytes']}")
    if sha256(data) != entry["sha256"]:
        raise SnapshotError(f"{entry['key']}: sha256 does not match the manifest")


def index_from_objects(manifest: dict[str, Any], read: Any) -> SegmentIndex:
    """Build an index from a manifest and a `read(key) -> bytes` function. Every object's size
    and sha256 are checked before it is read as a bitmap, and its cardinality after. pyroaring
    deserialises each one first, since it validates the format and every container (sorted,
    in bounds, cardinalities right); the index then keeps the bytes, packed, not the bitmap."""
    width = int(manifest.get("id_width", 32))
    blobs: list[bytes] = []
    seen: list[tuple[dict[str, int], int]] = []  # containers and users, as pyroaring read them
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
        stats = bitmap.get_statistics()
        containers = {
            "array": stats["n_array_containers"],
            "bitmap": stats["n_bitset_containers"],
            "run": stats["n_run_containers"],
        }
        seen.append((containers, stats["cardinality"]))
        del bitmap  # one segment's bitmap at a time, never the whole snapshot twice
        blobs.append(data)
        cardinalities[entry["slug"]] = entry["cardinality"]
    if default is None:
        raise SnapshotError("the manifest names no default segment")
    try:
        packed = PackedSegments(blobs, width=width)
    except PortableFormatError as exc:
        raise SnapshotError(f"not a portable Roaring bitmap this index can read ({exc})") from exc
    for slug, (containers, users), count, cardinality in zip(
        slugs, seen, packed.container_counts, packed.cardinalities, strict=True
    ):
        # The packed reader and pyroaring must have read the same containers.
        if containers != count or cardinality != users:
            raise SnapshotError(
                f"{slug}: read {count} containers and {cardinality} users; "
                f"pyroaring read {containers} and {users}"
            )
    return SegmentIndex(
        version=manifest["version"],
        id_width=width,
        segments=slugs,
        default_slug=default,
        bitmaps=PackedBitmaps(packed, slugs),
        cardinalities=cardinalities,
        manifest=manifest,
        packed=packed,
    )


def load_version(store: SnapshotStore, version: str) -> tuple[SegmentIndex, dict[str, bytes]]:
    """An index of one version from the store, and its raw objects (for the local cache).
    SnapshotIncomplete when one of its objects is not in the store, SnapshotError when one is
    corrupt, StoreError when the store cannot be read."""
    objects: dict[str, bytes] = {}

    def read(key: str) -> bytes:
        try:
            objects[key] = store.get(key)
        except NotFound as exc:
            raise SnapshotIncomplete(
                f"Snapshot version {version} is incomplete: its object {key} is missing from "
                f"the store ({store.url}), so it can never be loaded. Make another version "
                "live, or build and publish a new one."
            ) from exc
        return objects[key]

    try:
        manifest = json.loads(read(snapshot_key(version, MANIFEST)))
    except ValueError as exc:
        raise SnapshotError(f"manifest of {version} is not valid JSON") from exc
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
        # What the store said at the last poll: whether it answered, and the live version it
        # named (None: none published, or not asked yet). A process that cannot load that
        # version keeps its own and says so here.
        self.store_answered: bool | None = None
        self.store_version: str | None = None
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
            self.store_answered = "does not exist" in str(exc)
            if self.store_answered:
                self.store_version = None
                self.error = f"no snapshot has been published to {self.store.url} yet"
                return False
            raise
        self.store_answered = True
        if changed is None:
            return False
        data, etag = changed
        version = data.decode().strip()
        self.store_version = version
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
            # When its build published it (the manifest's time): how old its lists are.
            "published_at": self.index.manifest.get("created_at") if self.index else None,
            "store": self.store.url,
            "store_answered": self.store_answered,
            "store_version": self.store_version,
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
