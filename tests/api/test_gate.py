"""gate/check and gate/release over HTTP, against real Redis."""

import pytest

from tests.api.conftest import call, check_body

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_gate_answers_in_request_order_with_the_segments_caps(api, snapshot):
    response = call(
        api("gate"),
        "POST",
        "/api/v1/gate/check/",
        json=check_body([(1, "a"), (7, "b"), (1, "c"), (1, "d"), (7, "e")]),
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert [(r["user_id"], r["segment"], r["reason"]) for r in results] == [
        (1, "vip", "allowed"),
        (7, "default", "allowed"),
        (1, "vip", "allowed"),
        (1, "vip", "daily_cap"),
        (7, "default", "weekly_cap"),
    ]
    assert results[3]["limits"] == {"daily": 2, "weekly": 3}
    assert results[3]["retry_after"] > 86000


def test_transactional_and_dry_run(api, snapshot):
    s = api("gate")
    exempt = call(
        s, "POST", "/api/v1/gate/check/", json=check_body([(1, "otp")], category="transactional")
    ).json()
    assert exempt["results"][0]["reason"] == "exempt"
    dry = call(s, "POST", "/api/v1/gate/check/", json=check_body([(7, "x")], dry_run=True)).json()
    assert dry["results"][0]["reason"] == "allowed"
    assert (
        call(s, "POST", "/api/v1/gate/check/", json=check_body([(7, "y")])).json()["results"][0][
            "counts"
        ]["daily"]
        == 1
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channel": "fax", "requests": [{"user_id": 1, "message_id": "a"}]}, "channel"),
        ({"requests": [{"user_id": 1, "message_id": "a"}]}, "channel"),
        ({"channel": "email"}, "requests"),
        ({"channel": "email", "requests": "x"}, "requests"),
        (
            {"channel": "email", "requests": [{"user_id": -1, "message_id": "a"}]},
            "requests[0].user_id",
        ),
        (
            {"channel": "email", "requests": [{"user_id": 2**32, "message_id": "a"}]},
            "requests[0].user_id",
        ),
        (
            {"channel": "email", "requests": [{"user_id": "abc", "message_id": "a"}]},
            "requests[0].user_id",
        ),
        ({"channel": "email", "requests": [{"user_id": 1}]}, "requests[0].message_id"),
        ({"channel": "email", "requests": [{"message_id": "a"}]}, "requests[0].user_id"),
        (
            {
                "channel": "email",
                "category": "promo",
                "requests": [{"user_id": 1, "message_id": "a"}],
            },
            "category",
        ),
        (
            {"channel": "email", "dry_run": "yes", "requests": [{"user_id": 1, "message_id": "a"}]},
            "dry_run",
        ),
        ([1, 2], "non_field_errors"),
    ],
)
def test_bad_gate_input_gets_a_400_naming_the_field(api, snapshot, body, field):
    response = call(api("gate"), "POST", "/api/v1/gate/check/", json=body)
    assert response.status_code == 400
    assert field in response.json()


def test_malformed_json_is_a_400(api, snapshot):
    response = call(
        api("gate"),
        "POST",
        "/api/v1/gate/check/",
        data="{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["detail"]


def test_batches_above_the_limit_are_refused_with_the_limit(api, snapshot):
    s = api("gate")
    response = call(
        s, "POST", "/api/v1/gate/check/", json=check_body([(1, f"m{i}") for i in range(10_001)])
    )
    assert response.status_code == 400
    assert "At most 10,000" in response.json()["requests"][0]
    response = call(s, "POST", "/api/v1/segments/lookup/", json={"user_ids": list(range(100_001))})
    assert response.status_code == 400
    assert "At most 100,000" in response.json()["user_ids"][0]


def test_release_gives_a_slot_back(api, snapshot):
    s = api("gate")
    call(s, "POST", "/api/v1/gate/check/", json=check_body([(7, "a")]))
    released = call(
        s, "POST", "/api/v1/gate/release/", json=check_body([(7, "a"), (7, "zz")])
    ).json()
    assert [r["released"] for r in released["results"]] == [True, False]


def test_a_full_batch_of_10000_is_decided_in_request_order(api, snapshot):
    ids = [(i * 7919) % 50_000 for i in range(10_000)]
    body = check_body([(u, f"m{n}") for n, u in enumerate(ids)], dry_run=True)
    response = call(api("gate"), "POST", "/api/v1/gate/check/", json=body)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["user_id"] for r in results] == ids
    assert [r["message_id"] for r in results] == [f"m{n}" for n in range(10_000)]
    assert {r["segment"] for r in results if r["user_id"] in (1, 2)} <= {"vip"}


def test_redis_down_gives_unavailable_decisions_and_a_503_quota(api, snapshot, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    gate = call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a"), (7, "b")]))
    assert gate.status_code == 200
    assert [(r["reason"], r["allowed"]) for r in gate.json()["results"]] == [
        ("unavailable", False),
        ("unavailable", False),
    ]
    quota = call(api("viewer"), "GET", "/api/v1/users/1/quota/")
    assert quota.status_code == 503 and "Redis" in quota.json()["detail"]
    ready = call(api("anonymous"), "GET", "/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["redis"]["ok"] is False
    assert ready.json()["checks"]["database"]["ok"] is True
