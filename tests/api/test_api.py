"""The REST API through a live server and a real HTTP client, against real Redis."""

import gzip

import pytest

from tests.api.conftest import call

pytestmark = pytest.mark.django_db(transaction=True)


def check_body(requests_, **extra):
    return {
        "channel": "email",
        "requests": [{"user_id": u, "message_id": m} for u, m in requests_],
        **extra,
    }


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


def test_the_quota_agrees_with_the_gate(api, snapshot):
    call(
        api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a"), (1, "b"), (1, "c")])
    )
    quota = call(api("viewer"), "GET", "/api/v1/users/1/quota/").json()
    assert quota["segment"] == "vip"
    assert quota["scopes"]["email"]["daily"] == {"used": 2, "limit": 2, "remaining": 0}
    assert quota["scopes"]["email"]["weekly"] == {"used": 2, "limit": 3, "remaining": 1}
    assert quota["scopes"]["email"]["next_slot_in"] > 86000
    assert quota["scopes"]["all"]["daily"] == {"used": 2, "limit": 3, "remaining": 1}
    assert quota["scopes"]["push"]["daily"]["limit"] is None


def test_release_gives_a_slot_back(api, snapshot):
    s = api("gate")
    call(s, "POST", "/api/v1/gate/check/", json=check_body([(7, "a")]))
    released = call(
        s, "POST", "/api/v1/gate/release/", json=check_body([(7, "a"), (7, "zz")])
    ).json()
    assert [r["released"] for r in released["results"]] == [True, False]


@pytest.mark.parametrize(
    ("role", "method", "path", "expected"),
    [
        ("anonymous", "GET", "/api/v1/segments/", 401),
        ("anonymous", "POST", "/api/v1/gate/check/", 401),
        ("nobody", "GET", "/api/v1/segments/", 403),
        ("nobody", "GET", "/api/v1/users/1/quota/", 403),
        ("viewer", "GET", "/api/v1/segments/", 200),
        ("viewer", "GET", "/api/v1/limits/", 200),
        ("viewer", "POST", "/api/v1/gate/check/", 403),
        ("viewer", "PUT", "/api/v1/limits/vip/email/", 403),
        ("viewer", "POST", "/api/v1/snapshots/", 403),
        ("gate", "POST", "/api/v1/segments/", 403),
        ("marketer", "GET", "/api/v1/snapshots/", 200),
    ],
)
def test_the_permission_matrix(api, snapshot, role, method, path, expected):
    assert call(api(role), method, path, json={}).status_code == expected


def test_a_marketer_changes_a_cap_and_it_governs_the_gate(api, snapshot):
    m = api("marketer")
    response = call(m, "PUT", "/api/v1/limits/default/email/", json={"daily": 0, "weekly": None})
    assert response.status_code == 200
    assert response.json()["description"] == "no marketing emails"
    assert (
        call(m, "POST", "/api/v1/gate/check/", json=check_body([(7, "a")])).json()["results"][0][
            "reason"
        ]
        == "blocked"
    )
    bad = call(m, "PUT", "/api/v1/limits/default/email/", json={"daily": -1, "weekly": 3})
    assert bad.status_code == 400 and "daily" in bad.json()
    assert call(m, "PUT", "/api/v1/limits/default/fax/", json={"daily": 1, "weekly": 1}).json()[
        "channel"
    ]
    assert (
        call(m, "PUT", "/api/v1/limits/nope/email/", json={"daily": 1, "weekly": 1}).status_code
        == 404
    )


def test_segments_crud_and_the_default_is_protected(api, snapshot):
    m = api("marketer")
    created = call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "New", "priority": 30}
    )
    assert created.status_code == 201
    assert call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "Again", "priority": 31}
    ).json()["slug"]
    assert call(m, "PATCH", "/api/v1/segments/new/", json={"priority": "high"}).json()["priority"]
    assert (
        call(m, "PATCH", "/api/v1/segments/new/", json={"name": "Newcomers"}).json()["name"]
        == "Newcomers"
    )
    assert call(m, "DELETE", "/api/v1/segments/new/").status_code == 204
    refused = call(m, "DELETE", "/api/v1/segments/default/")
    assert refused.status_code == 400 and "cannot be deleted" in refused.json()["detail"]


def test_a_pipeline_replaces_a_list_and_publishes_it(api, snapshot, settings):
    m = api("marketer")
    bad = call(m, "PUT", "/api/v1/segments/vip/users/", data=b"1\n2\nthree\n")
    assert bad.status_code == 400 and bad.json()["line"] == 3
    good = call(m, "PUT", "/api/v1/segments/vip/users/", data=gzip.compress(b"user_id\n5\n6\n6\n"))
    assert good.json() == {"users": 2, "lines": 4}
    settings.CELERY_TASK_ALWAYS_EAGER = True
    from gatekeeper.celery import app

    app.conf.task_always_eager = True
    try:
        started = call(m, "POST", "/api/v1/snapshots/")
    finally:
        app.conf.task_always_eager = False
    assert started.status_code == 202
    build = call(m, "GET", started.json()["url"].split(m.base_url)[1]).json()
    assert build["status"] == "succeeded" and build["progress"] == 100
    from segments.index import refresh

    refresh()
    assert call(m, "GET", "/api/v1/segments/lookup/?user_id=5").json()["segment"] == "vip"
    versions = call(m, "GET", "/api/v1/snapshots/").json()
    assert versions["live_version"] == build["version"]
    back = call(m, "POST", f"/api/v1/snapshots/{snapshot}/activate/")
    assert back.json() == {"live_version": snapshot}
    assert call(m, "POST", "/api/v1/snapshots/nope/activate/").status_code == 400


def test_health_and_readiness(api, snapshot):
    s = api("anonymous")
    assert call(s, "GET", "/healthz").json() == {"status": "ok"}
    ready = call(s, "GET", "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["snapshot"]["version"] == snapshot


def test_not_ready_without_a_snapshot(api):
    response = call(api("anonymous"), "GET", "/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["snapshot"]["ok"] is False


def test_the_schema_and_docs_are_served(api):
    s = api("viewer")
    schema = call(s, "GET", "/api/schema/?format=json").json()
    assert "/api/v1/gate/check/" in schema["paths"]
    assert call(s, "GET", "/api/docs/").status_code == 200


def test_create_api_token_prints_a_working_token(api, snapshot):
    import io

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.management.base import CommandError

    User.objects.create_superuser("boss", "b@example.com", "pw")
    out = io.StringIO()
    call_command("create_api_token", "boss", stdout=out)
    s = api("anonymous")
    s.headers["Authorization"] = f"Token {out.getvalue().strip()}"
    assert call(s, "GET", "/api/v1/segments/").status_code == 200
    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("create_api_token", "ghost")


def test_a_campaign_system_hands_over_a_send_job_and_follows_it(api, snapshot, monkeypatch):
    from worker import services

    queued: list[int] = []
    monkeypatch.setattr(services, "_queue", lambda ids, countdown=0: queued.extend(ids))
    s = api("gate")
    body = {
        "channel": "email",
        "campaign": "spring",
        "template": "welcome",
        "recipients": [
            {"user_id": 1, "address": "a@example.com"},
            {"user_id": 7, "address": "b@example.com"},
        ],
    }
    created = call(s, "POST", "/api/v1/sends/", json=body)
    assert created.status_code == 202
    job = created.json()
    assert (job["status"], job["total"], job["progress"]) == ("queued", 2, 0)
    assert len(queued) == 1
    from worker.services import send_chunk_run

    send_chunk_run(chunk_id=queued[0])
    followed = call(api("viewer"), "GET", f"/api/v1/sends/{job['id']}/").json()
    assert (followed["status"], followed["progress"], followed["sent"]) == ("done", 100, 2)
    bad = call(s, "POST", "/api/v1/sends/", json={**body, "recipients": [{"user_id": 1}]})
    assert bad.status_code == 400 and "recipients[0].address" in bad.json()
    assert call(api("viewer"), "POST", "/api/v1/sends/", json=body).status_code == 403


def test_metrics_report_todays_decisions_from_redis(api, snapshot):
    call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a"), (7, "b")]))
    text = call(api("anonymous"), "GET", "/metrics").text
    assert 'gatekeeper_decisions_today{channel="email",reason="allowed",segment="vip"} 1.0' in text
    assert f'gatekeeper_snapshot_loaded{{source="store",version="{snapshot}"}} 1.0' in text
