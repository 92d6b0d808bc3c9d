"""User-list uploads that are large, inflating or bad: bounded memory, settable limits, big lists
validated in the background, and nothing stored (or published) from a list that fails."""

import gzip
import io
import json
import os
import tracemalloc

import pytest
import redis
from django.utils import timezone

from segments.models import Segment, UserList
from segments.parsing import ListSummary, UserListError, iter_ids
from segments.publishing import build_run
from segments.services import build_start, user_list_import
from segments.user_lists import user_list_validate, user_lists_stalled
from tests.support.files import inflating_gzip

pytestmark = pytest.mark.django_db


def ids_text(first: int, count: int) -> bytes:
    return b"".join(b"%d\n" % i for i in range(first, first + count))


@pytest.fixture
def vip(db) -> Segment:
    return Segment.objects.create(slug="vip", name="VIP", priority=10)


def test_parsing_memory_is_bounded_by_the_chunk_not_by_what_a_gzip_inflates_to():
    bomb = inflating_gzip(b"1\n", 128 * 2**20)
    assert len(bomb) < 2**20  # under a megabyte on the wire
    summary = ListSummary()
    tracemalloc.start()
    try:
        for _ in iter_ids(io.BytesIO(bomb), summary=summary):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.lines == 64 * 2**20
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MiB"  # docs/segments.md states ~26 MiB


def test_the_decompressed_size_and_the_lines_have_settable_limits():
    bomb = inflating_gzip(b"1\n", 16 * 2**20)
    with pytest.raises(UserListError, match="larger than 4,194,304 bytes once decompressed"):
        for _ in iter_ids(io.BytesIO(bomb), max_bytes=4 * 2**20):
            pass
    with pytest.raises(UserListError, match="more than 1,000 lines") as caught:
        for _ in iter_ids(io.BytesIO(ids_text(0, 1001)), max_lines=1000):
            pass
    assert caught.value.line == 1001


def test_a_list_beyond_the_limits_is_refused_and_nothing_is_stored(vip, settings):
    settings.GATEKEEPER_USER_LIST_MAX_BYTES = 2**20
    with pytest.raises(UserListError, match="GATEKEEPER_USER_LIST_MAX_BYTES"):
        user_list_import(
            segment=vip, fileobj=io.BytesIO(inflating_gzip(b"7\n", 4 * 2**20)), name="bomb.gz"
        )
    settings.GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES = 1000
    with pytest.raises(UserListError, match="GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES"):
        user_list_import(segment=vip, fileobj=io.BytesIO(ids_text(0, 500)), name="big.txt")
    assert not UserList.objects.exists()


def builds_queue(settings) -> list[dict]:
    """The tasks waiting on the broker's `builds` queue (the tests' own broker database)."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [json.loads(message)["headers"] for message in broker.lrange("builds", 0, -1)]


@pytest.mark.postgres
def test_a_large_list_is_stored_unchecked_then_validated_in_the_background(
    vip, settings, django_capture_on_commit_callbacks
):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("builds")
    old = user_list_import(segment=vip, fileobj=io.BytesIO(b"1\n2\n"), name="old.txt")
    body = gzip.compress(b"user_id\n" + ids_text(100, 200_000) + b"\n" + ids_text(100, 10))
    with django_capture_on_commit_callbacks(execute=True):
        stored = user_list_import(
            segment=vip, fileobj=io.BytesIO(body), name="big.gz", replace=True, inline_bytes=2**16
        )
    assert stored.status == "validating"
    (queued,) = builds_queue(settings)  # its validation, queued once the import committed
    assert queued["task"] == "segments.tasks.user_list_validate"
    assert queued["argsrepr"] == f"({stored.pk},)"
    # Until it is ready, builds keep using the list it replaces.
    assert UserList.objects.filter(segment=vip).count() == 2
    build_run(build_id=build_start(queue=False).pk)
    ready = user_list_validate(user_list_id=stored.pk)
    assert ready is not None and ready.status == "ready"
    assert (ready.id_count, ready.listed_ids, ready.header_lines) == (200_000, 200_010, 1)
    assert (ready.line_count, ready.blank_lines, ready.repeated_ids) == (200_012, 1, 10)
    assert ready.lines_explained == "200,012 lines: a header, 1 blank line, 10 repeated ids"
    assert list(UserList.objects.filter(segment=vip)) == [ready]  # it replaced the old one
    assert not UserList.objects.filter(pk=old.pk).exists()
    assert user_list_validate(user_list_id=stored.pk).status == "ready"  # a redelivery: no-op


@pytest.mark.postgres
def test_a_large_list_that_fails_in_the_background_says_why_and_is_never_built(
    vip, settings, django_capture_on_commit_callbacks
):
    good = user_list_import(segment=vip, fileobj=io.BytesIO(b"1\n2\n"), name="good.txt")
    body = ids_text(0, 100_000) + b"12x\n" + ids_text(0, 10)
    stored = user_list_import(
        segment=vip, fileobj=io.BytesIO(body), name="bad.txt", replace=True, inline_bytes=2**16
    )
    assert stored.status == "validating"
    path = stored.file.path
    with django_capture_on_commit_callbacks(execute=True):
        failed = user_list_validate(user_list_id=stored.pk)
    assert failed is not None and failed.status == "failed" and not failed.file
    assert failed.error_line == 100_001 and "'12x' is not a user id" in failed.error
    assert UserList.objects.get(pk=good.pk).status == "ready"  # the list it would replace stays
    assert not os.path.exists(path)  # nothing of the bad list is kept but the reason
    build = build_run(build_id=build_start(queue=False).pk)
    assert build.stats["vip"]["listed"] == 2


def test_a_lost_validation_is_queued_again_and_a_vanished_file_fails_it(vip, settings):
    from datetime import timedelta

    from segments.tasks import user_lists_stalled as stalled_task

    stored = user_list_import(
        segment=vip, fileobj=io.BytesIO(ids_text(0, 50_000)), name="big.txt", inline_bytes=2**12
    )
    assert stored.status == "validating" and stored.checked_at is not None
    assert user_lists_stalled(now=stored.checked_at + timedelta(minutes=5)) == []
    assert user_lists_stalled(now=stored.checked_at + timedelta(minutes=11)) == [stored.pk]
    # Beat's task queues the validation of each list found stalled.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("builds")
    UserList.objects.filter(pk=stored.pk).update(checked_at=timezone.now() - timedelta(hours=1))
    assert stalled_task.apply().result == 1
    assert [q["argsrepr"] for q in builds_queue(settings)] == [f"({stored.pk},)"]
    # The stored upload is gone (removed from the bucket, say): the list fails and says why.
    stored.file.storage.delete(str(stored.file.name))
    failed = user_list_validate(user_list_id=stored.pk)
    assert failed is not None and failed.status == "failed"
    assert "could not be read" in failed.error
    assert user_list_validate(user_list_id=10**9) is None  # a list that is gone: nothing to do
