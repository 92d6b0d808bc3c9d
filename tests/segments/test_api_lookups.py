"""Segment lookups over HTTP, and which user ids they take."""

import io

import pytest

from segments.index import refresh
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import
from tests.support.api import call, check_body

pytestmark = pytest.mark.django_db(transaction=True)


def test_lookups_one_and_many_in_order(api, snapshot):
    s = api("viewer")
    one = call(s, "GET", "/api/v1/segments/lookup/?user_id=2").json()
    assert one == {"user_id": 2, "segment": "vip", "snapshot_version": snapshot}
    many = call(s, "POST", "/api/v1/segments/lookup/", json={"user_ids": [9, 1, 9, 2]}).json()
    assert [r["segment"] for r in many["results"]] == ["default", "vip", "default", "vip"]
    assert call(s, "GET", "/api/v1/segments/lookup/?user_id=-3").status_code == 400
    assert call(s, "GET", "/api/v1/segments/lookup/").json() == {
        "user_id": ["This query parameter is required."]
    }


def test_a_full_lookup_of_100000_answers_in_request_order(api, snapshot):
    ids = list(range(100_000, 0, -1))
    response = call(api("viewer"), "POST", "/api/v1/segments/lookup/", json={"user_ids": ids})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["user_id"] for r in results] == ids
    assert [r["user_id"] for r in results if r["segment"] == "vip"] == [2, 1]


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (0, True),
        (2**32 - 1, True),
        ("42", True),
        (2**32, False),
        ("\uff11", False),  # a fullwidth digit: str.isdigit() says yes, we say no
        ("\u0661", False),  # an Arabic-Indic digit
        ("12\n", False),  # digits, then a line end
        (" 12", False),
        ("12\n", False),  # digits, then a line end
        (" 12", False),
        (1.0, False),
        (True, False),
        (None, False),
    ],
)
def test_user_ids_are_unsigned_integers_of_the_configured_width(api, snapshot, value, accepted):
    response = call(api("viewer"), "POST", "/api/v1/segments/lookup/", json={"user_ids": [value]})
    if accepted:
        assert response.status_code == 200
        assert response.json()["results"][0]["user_id"] == int(value)
    else:
        assert response.status_code == 400
        assert "user_ids[0]" in response.json()


def test_64_bit_ids_pass_only_as_far_as_the_loaded_snapshot_can_answer(
    api, transactional_db, settings
):
    settings.GATEKEEPER_ID_WIDTH = 64
    s = api("viewer")
    # No snapshot yet: the configured width is the limit, and 64-bit ids stay below 2^63 (the
    # database keeps ids in signed 64-bit columns).
    assert call(s, "GET", f"/api/v1/users/{2**63 - 1}/quota/").status_code == 503
    refused = call(s, "GET", f"/api/v1/users/{2**63}/quota/")
    assert refused.status_code == 400 and "9223372036854775807" in refused.json()["user_id"][0]
    # A 32-bit snapshot cannot answer for a larger id: a 400 that says so, not a crash.
    Segment.objects.get_or_create(
        is_default=True, defaults={"slug": "default", "name": "Everyone", "priority": 1000}
    )
    vip = Segment.objects.create(slug="vip", name="VIP", priority=10)
    user_list_import(segment=vip, fileobj=io.BytesIO(b"1\n"), name="vip.txt")
    settings.GATEKEEPER_ID_WIDTH = 32
    build_run(build_id=build_start(queue=False).pk)
    assert refresh()
    settings.GATEKEEPER_ID_WIDTH = 64
    for method, path, kwargs in [
        ("GET", f"/api/v1/users/{2**40}/quota/", {}),
        ("GET", f"/api/v1/segments/lookup/?user_id={2**40}", {}),
        ("POST", "/api/v1/segments/lookup/", {"json": {"user_ids": [1, 2**40]}}),
    ]:
        response = call(s, method, path, **kwargs)
        assert response.status_code == 400, path
        assert "4294967295" in str(response.json()), path
    gate = call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(2**40, "a")]))
    assert gate.status_code == 400 and "requests[0].user_id" in gate.json()


def test_lookups_and_quotas_say_so_when_no_snapshot_is_loaded(api, transactional_db):
    s = api("viewer")
    for path in ("/api/v1/segments/lookup/?user_id=1", "/api/v1/users/1/quota/"):
        response = call(s, "GET", path)
        assert response.status_code == 503
        assert "No segment snapshot" in response.json()["detail"]
    gate = call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a")]))
    assert gate.json()["results"][0]["reason"] == "unavailable"
