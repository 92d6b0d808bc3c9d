"""Making a published version live again over HTTP, on both stores (S3 over its real API): a
version with an object missing is incomplete, a 400 that names it, and stays so; a store that
does not answer is a 503, worth trying again."""

import pytest

from segments.publishing import build_run
from segments.selectors import snapshot_live_version
from segments.services import build_start
from segments.store import SnapshotStore, snapshot_key, store_from_settings
from tests.support.api import call
from tests.support.stores import delete_object, unreadable

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> SnapshotStore:
    """The store the settings point at (tests/conftest.py's directory, or a bucket on moto's S3
    server), before the `snapshot` fixture publishes to it."""
    if request.param == "s3":
        request.getfixturevalue("s3_settings")
    return store_from_settings()


def test_a_version_with_a_missing_object_is_a_400_naming_it(store, api, snapshot):
    first = snapshot
    second = build_run(build_id=build_start(queue=False).pk).version
    delete_object(store, snapshot_key(first, "vip.roaring"))
    m = api("marketer")
    for _ in range(2):  # the same answer every time: nothing to wait for
        refused = call(m, "POST", f"/api/v1/snapshots/{first}/activate/")
        assert refused.status_code == 400, refused.text
        assert refused.json() == {
            "detail": f"Snapshot version {first} is incomplete: its object "
            f"snapshots/{first}/vip.roaring is missing from the store ({store.url}), so it can "
            "never be loaded. Make another version live, or build and publish a new one."
        }
        assert snapshot_live_version() == second
    # The complete version is made live as ever.
    assert call(m, "POST", f"/api/v1/snapshots/{second}/activate/").json() == {
        "live_version": second
    }


def test_a_store_that_does_not_answer_is_a_503(store, api, snapshot, settings):
    second = build_run(build_id=build_start(queue=False).pk).version
    unreadable(store, snapshot_key(snapshot, "vip.roaring"), settings)
    failed = call(api("marketer"), "POST", f"/api/v1/snapshots/{snapshot}/activate/")
    assert failed.status_code == 503, failed.text
    assert failed.json()["detail"].startswith("The snapshot store is unreachable: ")
    assert snapshot_live_version(store=store) == second
