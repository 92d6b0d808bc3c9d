"""Segment fixtures: both snapshot stores, the S3 one a real S3 API over HTTP (moto's server,
tests/conftest.py)."""

import io
from collections.abc import Callable

import pytest

from segments.models import Segment
from segments.services import user_list_import
from segments.store import LocalStore, S3Store, SnapshotStore


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, settings, tmp_path) -> SnapshotStore:
    """The store the settings point at: a local directory, then S3 over HTTP."""
    from segments.index import reset_index

    reset_index()
    if request.param == "local":
        settings.GATEKEEPER_STORE_URL = str(tmp_path / "store")
        return LocalStore(tmp_path / "store")
    url = request.getfixturevalue("s3_settings")
    bucket, prefix = url[len("s3://") :].split("/", 1)
    return S3Store(bucket, prefix)


@pytest.fixture
def make_segments(db) -> Callable[..., dict[str, Segment]]:
    """Segments with lists: make_segments(vip=(10, [1, 2]), active=(20, [2, 3]))."""

    def make(**spec: tuple[int, list[int]]) -> dict[str, Segment]:
        made = {}
        for slug, (priority, ids) in spec.items():
            segment = Segment.objects.create(slug=slug, name=slug.title(), priority=priority)
            if ids:
                body = "".join(f"{i}\n" for i in ids).encode()
                user_list_import(segment=segment, fileobj=io.BytesIO(body), name=f"{slug}.txt")
            made[slug] = segment
        return made

    return make


def delete_object(store: SnapshotStore, key: str) -> None:
    """Delete one object from the store behind the project's back (as an operator's slip or a
    lifecycle rule would): the stores themselves never delete a single object."""
    if isinstance(store, S3Store):
        store.client.delete_object(Bucket=store.bucket, Key=store._key(key))
    else:
        assert isinstance(store, LocalStore)
        (store.root / key).unlink()


def unreadable(store: SnapshotStore, key: str, settings) -> None:
    """Make the store fail to answer for `key`: S3 at an address where nothing listens; a
    directory whose object cannot be read (a directory where the file was: EISDIR)."""
    if isinstance(store, S3Store):
        settings.GATEKEEPER_S3_ENDPOINT_URL = "http://127.0.0.1:9"
    else:
        assert isinstance(store, LocalStore)
        (store.root / key).unlink()
        (store.root / key).mkdir()
