"""Builds, publishing, the segment index and rollback, against both stores."""

import io
import json
import logging

import pytest
from django.core.management import call_command

from segments.index import IndexHolder, get_index, index_status, load_version, refresh
from segments.models import Build, Segment, UserList
from segments.parsing import UserListError
from segments.publishing import (
    BuildBusy,
    BuildInProgress,
    build_run,
    snapshot_prune,
    snapshot_rollback,
)
from segments.selectors import snapshot_live_version, snapshot_versions
from segments.services import build_start, user_list_import
from segments.store import CURRENT, MANIFEST, SnapshotStore, StoreError, snapshot_key
from tests.support import broker

pytestmark = pytest.mark.django_db


def publish(store: SnapshotStore | None = None) -> Build:
    return build_run(build_id=build_start(queue=False).pk, store=store)


def test_a_build_publishes_exclusive_segments_and_the_index_resolves_them(store, make_segments):
    make_segments(vip=(10, [1, 2, 3]), active=(20, [3, 4, 5]), new=(30, [5, 6]))
    build = publish()
    assert build.status == Build.Status.SUCCEEDED
    assert build.stats["active"] == {
        "listed": 3,
        "cardinality": 2,
        "lost_to_higher_priority": 1,
        "bytes": build.stats["active"]["bytes"],
    }
    assert build.total_users == 6
    index = get_index()
    assert index is not None and index.version == build.version
    assert [index.resolve(u) for u in (1, 3, 4, 5, 6, 7)] == [
        "vip",
        "vip",
        "active",
        "active",
        "new",
        "default",
    ]
    assert index.resolve_many([7, 6, 1, 4, 1, 99]) == [
        "default",
        "new",
        "vip",
        "active",
        "vip",
        "default",
    ]
    # A 32-bit snapshot holds no id wider than 32 bits: those are in the default segment.
    assert index.id_width == 32
    assert index.resolve(2**40) == "default"
    assert index.resolve_many([2**32, 1, 2**40 + 4, 6]) == ["default", "vip", "default", "new"]
    assert index_status()["source"] == "store"


def test_publish_writes_bitmaps_then_manifest_then_current(store, make_segments):
    make_segments(vip=(10, [1]), active=(20, [2]))
    written: list[str] = []
    original = type(store).put

    class Recording(type(store)):
        def put(self, key: str, data: bytes) -> None:
            written.append(key.rsplit("/", 1)[-1])
            original(self, key, data)

    recording = Recording.__new__(Recording)
    recording.__dict__.update(store.__dict__)
    publish(recording)
    assert written == ["vip.roaring", "active.roaring", MANIFEST, CURRENT]


def test_a_reader_during_a_publish_sees_the_old_or_the_new_snapshot(store, make_segments):
    segments = make_segments(vip=(10, [1, 2]))
    old = publish().version
    user_list_import(segment=segments["vip"], fileobj=io.BytesIO(b"3\n4\n"), name="more.txt")
    seen: list[str] = []
    original = type(store).put

    class Watching(type(store)):
        def put(self, key: str, data: bytes) -> None:
            original(self, key, data)
            version = store.get(CURRENT).decode()
            index, _ = load_version(store, version)  # complete and verified, or it raises
            seen.append(f"{index.version}:{index.cardinalities['vip']}")

    watching = Watching.__new__(Watching)
    watching.__dict__.update(store.__dict__)
    new = publish(watching).version
    assert set(seen) == {f"{old}:2", f"{new}:4"}
    assert seen[-1] == f"{new}:4"


def test_a_failed_build_leaves_the_live_snapshot_untouched_and_a_retry_publishes(
    store, make_segments
):
    make_segments(vip=(10, [1, 2]))
    live = publish().version
    original = type(store).put

    class Dying(type(store)):
        def put(self, key: str, data: bytes) -> None:
            if key.endswith(MANIFEST):
                raise StoreError("the worker was killed")
            original(self, key, data)

    dying = Dying.__new__(Dying)
    dying.__dict__.update(store.__dict__)
    build = build_start(queue=False)
    with pytest.raises(StoreError):
        build_run(build_id=build.pk, store=dying)
    build.refresh_from_db()
    assert build.status == Build.Status.FAILED and "killed" in build.error
    assert snapshot_live_version() == live
    # The task is delivered again: the same build starts over and publishes.
    again = build_run(build_id=build.pk)
    assert again.status == Build.Status.SUCCEEDED and again.attempts == 2
    assert snapshot_live_version() == again.version != live
    # The half-written version of the first attempt is gone.
    assert [v["version"] for v in snapshot_versions()] == [again.version, live]
    assert len(store.list_versions()) == 2


def test_a_second_build_is_refused_while_one_is_running(store, make_segments):
    make_segments(vip=(10, [1]))
    first = build_start(queue=False)
    with pytest.raises(BuildInProgress, match=f"Build #{first.pk} is queued"):
        build_start(queue=False)


def test_a_build_waits_while_another_process_holds_the_publish_lock(
    store, make_segments, redis_client, settings
):
    from gatekeeper.lib.redis_client import get_redis

    make_segments(vip=(10, [1]))
    # Another process publishing holds the deployment's publish lock.
    held = get_redis().lock(f"{settings.GATEKEEPER_KEY_PREFIX}segments:build-lock", timeout=30)
    assert held.acquire(blocking=False)
    try:
        with pytest.raises(BuildBusy):
            publish()
    finally:
        held.release()


def test_a_corrupt_object_keeps_the_current_version(store, make_segments, caplog):
    segments = make_segments(vip=(10, [1, 2]))
    good = publish().version
    assert get_index().version == good
    user_list_import(segment=segments["vip"], fileobj=io.BytesIO(b"9\n"), name="b.txt")
    bad = publish().version
    store.put(snapshot_key(bad, "vip.roaring"), b"garbage")
    with caplog.at_level(logging.WARNING):
        assert refresh() is False
    assert get_index().version == good
    assert "does not match the manifest" in caplog.text or "bytes, manifest says" in caplog.text


def test_a_cardinality_that_does_not_match_the_manifest_is_refused(store, make_segments):
    make_segments(vip=(10, [1, 2]))
    version = publish().version
    key = snapshot_key(version, MANIFEST)
    manifest = json.loads(store.get(key))
    manifest["segments"][0]["cardinality"] = 3
    store.put(key, json.dumps(manifest).encode())
    assert get_index() is None
    assert "manifest says 3" in index_status()["error"]


def test_a_new_version_is_swapped_in_without_a_restart(store, make_segments):
    segments = make_segments(vip=(10, [1]))
    publish()
    assert get_index().resolve(2) == "default"
    assert refresh() is False  # nothing new
    user_list_import(segment=segments["vip"], fileobj=io.BytesIO(b"2\n"), name="more.txt")
    version = publish().version
    assert refresh() is True
    index = get_index()
    assert index is not None and index.version == version and index.resolve(2) == "vip"


def test_a_process_starts_from_its_cached_snapshot_when_the_store_is_unreachable(
    store, make_segments, settings, tmp_path
):
    make_segments(vip=(10, [1]))
    version = publish().version
    assert get_index().version == version  # fills the cache
    from segments.index import reset_index

    reset_index()
    settings.GATEKEEPER_STORE_URL = (
        str(tmp_path / "nowhere")
        if not settings.GATEKEEPER_STORE_URL.startswith("s3")
        else "s3://no-such-bucket/x"
    )
    if settings.GATEKEEPER_STORE_URL.startswith("s3"):
        settings.GATEKEEPER_S3_ENDPOINT_URL = "http://127.0.0.1:9"
    index = get_index()
    assert index is not None and index.version == version and index.resolve(1) == "vip"
    assert index_status()["source"] == "cache"


def test_with_neither_store_nor_cache_the_index_is_missing_and_says_why(settings, tmp_path, db):
    settings.GATEKEEPER_S3_ENDPOINT_URL = "http://127.0.0.1:9"
    settings.GATEKEEPER_STORE_URL = "s3://unreachable/x"
    assert get_index() is None
    assert "unreachable" in index_status()["error"]
    settings.GATEKEEPER_STORE_URL = str(tmp_path / "empty")
    assert get_index() is None
    assert "no snapshot has been published" in index_status()["error"]


def test_rollback_makes_an_earlier_version_live_again(store, make_segments):
    segments = make_segments(vip=(10, [1]))
    first = publish().version
    user_list_import(
        segment=segments["vip"], fileobj=io.BytesIO(b"2\n"), name="b.txt", replace=True
    )
    second = publish().version
    assert refresh() or get_index().version == second
    snapshot_rollback(version=first)
    assert snapshot_live_version() == first
    assert refresh() is True
    assert get_index().resolve(2) == "default"
    from segments.index import SnapshotError

    with pytest.raises(SnapshotError, match="no snapshot version 'nope'"):
        snapshot_rollback(version="nope")


def test_old_versions_beyond_the_retention_are_deleted_but_never_the_live_one(
    store, make_segments, settings
):
    settings.GATEKEEPER_SNAPSHOT_RETENTION = 2
    make_segments(vip=(10, [1]))
    versions = [publish().version for _ in range(4)]
    assert [v["version"] for v in snapshot_versions()] == versions[:1:-1]
    snapshot_rollback(version=versions[2])
    assert snapshot_prune(store=store, keep=1) == []  # the newest is kept, and so is the live one
    assert [v["version"] for v in snapshot_versions()] == [versions[3], versions[2]]


def test_an_upload_with_a_bad_line_stores_nothing(make_segments):
    segments = make_segments(vip=(10, [1, 2]))
    with pytest.raises(UserListError, match="line 3: 'x'"):
        user_list_import(
            segment=segments["vip"], fileobj=io.BytesIO(b"5\n6\nx\n"), name="bad.txt", replace=True
        )
    assert [ul.id_count for ul in UserList.objects.all()] == [2]


def test_replace_swaps_the_lists_of_a_segment(make_segments):
    segments = make_segments(vip=(10, [1, 2]))
    user_list_import(
        segment=segments["vip"], fileobj=io.BytesIO(b"7\n7\n8\n"), name="new.txt", replace=True
    )
    (only,) = UserList.objects.filter(segment=segments["vip"])
    assert (only.original_name, only.id_count, only.line_count) == ("new.txt", 2, 3)


def test_the_default_segment_takes_no_lists(db):
    with pytest.raises(UserListError, match="default segment has no lists"):
        user_list_import(
            segment=Segment.objects.get(is_default=True), fileobj=io.BytesIO(b"1\n"), name="x"
        )


def test_the_commands_import_and_build_with_clear_errors(store, make_segments, tmp_path):
    from django.core.management.base import CommandError

    make_segments(vip=(10, []))
    good = tmp_path / "vip.txt"
    good.write_text("user_id\n1\n2\n")
    out = io.StringIO()
    call_command("import_users", "vip", str(good), stdout=out)
    assert "Stored 2 users" in out.getvalue()
    bad = tmp_path / "bad.txt"
    bad.write_text("1\nfoo\n")
    with pytest.raises(CommandError, match=r"line 2: 'foo'.*Nothing was stored"):
        call_command("import_users", "vip", str(bad))
    with pytest.raises(CommandError, match="No segment 'nope'"):
        call_command("import_users", "nope", str(good))
    out = io.StringIO()
    call_command("build_segments", "--wait", stdout=out)
    assert "Published snapshot" in out.getvalue()
    assert get_index().resolve(2) == "vip"


def test_build_start_queues_the_task_on_commit(make_segments, django_capture_on_commit_callbacks):
    broker.clear("builds")
    with django_capture_on_commit_callbacks(execute=True):
        build = build_start()
    assert broker.queued("builds") == [("segments.tasks.build_snapshot", [build.pk])]


def test_the_index_of_another_store_holder_is_independent(store, make_segments, tmp_path):
    make_segments(vip=(10, [1]))
    publish()
    other = IndexHolder(store, tmp_path / "other-cache")
    assert other.get() is not None and other.get().resolve(1) == "vip"


def test_a_build_task_for_a_build_that_is_gone_ends_quietly_and_holds_no_lock(store, make_segments):
    from segments.tasks import build_snapshot

    make_segments(vip=(10, [1]))
    assert build_snapshot.apply(args=(10**9,)).state == "SUCCESS"  # a stale task: nothing to do
    assert publish().status == "succeeded"  # and the next build is not kept waiting


def test_a_version_missing_an_object_is_incomplete_and_is_not_made_live(store, make_segments):
    from segments.index import SnapshotIncomplete
    from tests.support.stores import delete_object

    segments = make_segments(vip=(10, [1]), active=(20, [2]))
    first = publish().version
    user_list_import(
        segment=segments["vip"], fileobj=io.BytesIO(b"3\n"), name="b.txt", replace=True
    )
    second = publish().version
    delete_object(store, snapshot_key(first, "active.roaring"))
    with pytest.raises(SnapshotIncomplete) as refused:
        snapshot_rollback(version=first)
    assert str(refused.value).startswith(
        f"Snapshot version {first} is incomplete: its object "
        f"snapshots/{first}/active.roaring is missing from the store ({store.url})"
    )
    assert snapshot_live_version() == second
    # Without its manifest, the same.
    delete_object(store, snapshot_key(first, MANIFEST))
    with pytest.raises(SnapshotIncomplete, match=f"snapshots/{first}/manifest.json is missing"):
        snapshot_rollback(version=first)
    assert snapshot_live_version() == second


def test_a_store_that_does_not_answer_is_not_an_incomplete_version(store, make_segments, settings):
    from segments.index import SnapshotError
    from tests.support.stores import unreadable

    make_segments(vip=(10, [1]))
    first = publish().version
    second = publish().version
    unreadable(store, snapshot_key(first, "vip.roaring"), settings)
    with pytest.raises(StoreError) as failed:
        snapshot_rollback(version=first)
    assert not isinstance(failed.value, SnapshotError)
    assert snapshot_live_version(store=store) == second  # (the fixture's store still answers)
