"""The REST API through a live server and a real HTTP client, against real Redis."""

import gzip
import io

import pytest

from segments.index import refresh
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import
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


def test_a_marketer_changes_a_cap_and_it_governs_the_gate(api, snapshot):
    m = api("marketer")
    response = call(m, "PUT", "/api/v1/limits/default/email/", json={"daily": 0, "weekly": None})
    assert response.status_code == 200
    assert response.json()["description"] == "no marketing emails"
    checked = call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(7, "a")]))
    assert checked.json()["results"][0]["reason"] == "blocked"
    bad = call(m, "PUT", "/api/v1/limits/default/email/", json={"daily": -1, "weekly": 3})
    assert bad.status_code == 400 and "daily" in bad.json()
    for path, body, field in [
        ("/api/v1/limits/default/fax/", {"daily": 1, "weekly": 1}, "channel"),
        ("/api/v1/limits/nope/email/", {"daily": 1, "weekly": 1}, "segment"),
        ("/api/v1/limits/default/email/", {"daily": 1}, "weekly"),
        ("/api/v1/limits/default/email/", {"daily": 2**31, "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": True, "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": 1.5, "weekly": None}, "daily"),
        # JSON integers only: strings the admin refuses are refused here too.
        ("/api/v1/limits/default/email/", {"daily": "12", "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": "+12", "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": "12 ", "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": "\u0661\u0662", "weekly": None}, "daily"),
        ("/api/v1/limits/default/email/", {"daily": 1, "weekly": None, "monthly": 3}, "monthly"),
    ]:
        refused = call(m, "PUT", path, json=body)
        assert refused.status_code == 400, (path, body)
        assert field in refused.json(), (path, body)
    # None of the refusals changed the cap.
    caps = call(m, "GET", "/api/v1/limits/").json()
    assert {"segment": "default", "channel": "email", "daily": 0, "weekly": None}.items() <= next(
        c for c in caps if (c["segment"], c["channel"]) == ("default", "email")
    ).items()


def test_segments_crud_and_the_default_is_protected(api, snapshot):
    m = api("marketer")
    created = call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "New", "priority": 30}
    )
    assert created.status_code == 201
    again = call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "Again", "priority": 31}
    )
    assert again.status_code == 400 and "slug" in again.json()
    bad_priority = call(m, "PATCH", "/api/v1/segments/new/", json={"priority": "high"})
    assert bad_priority.status_code == 400 and "priority" in bad_priority.json()
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
    stored = good.json()
    assert (stored["status"], stored["users"], stored["lines"]) == ("ready", 2, 4)
    assert (stored["header_lines"], stored["repeated_ids"], stored["blank_lines"]) == (1, 1, 0)
    assert stored["uploaded_by"] == "marketer"  # the token's user, as the admin shows it
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
    assert call(m, "POST", "/api/v1/snapshots/nope/activate/").status_code == 404


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


def test_a_campaign_system_hands_over_a_send_job_and_follows_it(api, snapshot):
    from tests import broker
    from worker.chunks import send_chunk_run

    broker.clear("sends")
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
    ((task, (chunk_id,)),) = broker.queued("sends")  # one chunk, queued for the worker
    assert task == "worker.tasks.send_chunk"
    send_chunk_run(chunk_id=chunk_id)
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


def test_a_full_batch_of_10000_is_decided_in_request_order(api, snapshot):
    ids = [(i * 7919) % 50_000 for i in range(10_000)]
    body = check_body([(u, f"m{n}") for n, u in enumerate(ids)], dry_run=True)
    response = call(api("gate"), "POST", "/api/v1/gate/check/", json=body)
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["user_id"] for r in results] == ids
    assert [r["message_id"] for r in results] == [f"m{n}" for n in range(10_000)]
    assert {r["segment"] for r in results if r["user_id"] in (1, 2)} <= {"vip"}


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


def test_lookups_and_quotas_say_so_when_no_snapshot_is_loaded(api, transactional_db):
    s = api("viewer")
    for path in ("/api/v1/segments/lookup/?user_id=1", "/api/v1/users/1/quota/"):
        response = call(s, "GET", path)
        assert response.status_code == 503
        assert "No segment snapshot" in response.json()["detail"]
    gate = call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a")]))
    assert gate.json()["results"][0]["reason"] == "unavailable"


def test_the_quota_only_reads(api, snapshot):
    s = api("viewer")
    for _ in range(3):
        quota = call(s, "GET", "/api/v1/users/7/quota/").json()
    assert quota["segment"] == "default"
    assert quota["scopes"]["email"]["daily"] == {"used": 0, "limit": 1, "remaining": 1}
    assert quota["scopes"]["email"]["next_slot_in"] is None


def test_the_quota_follows_a_sequence_of_sends_across_channels(api, snapshot):
    g = api("gate")
    decided = []
    for channel, message in [("email", "e1"), ("push", "p1"), ("email", "e2"), ("email", "e3")]:
        body = {"channel": channel, "requests": [{"user_id": 2, "message_id": message}]}
        decided.append(call(g, "POST", "/api/v1/gate/check/", json=body).json()["results"][0])
    # vip: email 2/day, 3/week; all 3/day. e3 is refused by both caps, the channel's first.
    assert [d["reason"] for d in decided] == ["allowed", "allowed", "allowed", "daily_cap"]
    quota = call(api("viewer"), "GET", "/api/v1/users/2/quota/").json()["scopes"]
    assert quota["email"]["daily"] == {"used": 2, "limit": 2, "remaining": 0}
    assert quota["push"]["daily"] == {"used": 1, "limit": None, "remaining": None}
    assert quota["all"]["daily"] == {"used": 3, "limit": 3, "remaining": 0}
    assert quota["all"]["next_slot_in"] == pytest.approx(decided[3]["retry_after"], abs=5)


def test_anonymous_requests_are_told_how_to_authenticate(api, snapshot):
    response = call(api("anonymous"), "GET", "/api/v1/users/1/quota/")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Token"
    bad_token = api("anonymous")
    bad_token.headers["Authorization"] = "Token not-a-token"
    assert call(bad_token, "GET", "/api/v1/segments/").status_code == 401


def test_logged_in_staff_use_the_browsable_api_with_their_session(api, snapshot):
    from django.contrib.auth.models import User

    User.objects.create_user("staff", password="pw", is_staff=True, is_superuser=True)
    s = api("anonymous")
    login_page = call(s, "GET", "/admin/login/")
    token = s.cookies["csrftoken"]
    assert login_page.status_code == 200
    logged_in = call(
        s,
        "POST",
        "/admin/login/?next=/admin/",
        data={"username": "staff", "password": "pw", "csrfmiddlewaretoken": token},
        headers={"Referer": s.base_url + "/admin/login/"},
    )
    assert logged_in.status_code == 200 and "sessionid" in s.cookies
    page = call(s, "GET", "/api/v1/segments/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
    assert "vip" in page.text
    # A session write without the CSRF token is refused, as for any cookie-authenticated form.
    unsafe = call(s, "PUT", "/api/v1/limits/vip/push/", json={"daily": 1, "weekly": None})
    assert unsafe.status_code == 403 and "CSRF" in unsafe.json()["detail"]
    safe = call(
        s,
        "PUT",
        "/api/v1/limits/vip/push/",
        json={"daily": 1, "weekly": None},
        headers={"X-CSRFToken": s.cookies["csrftoken"], "Referer": s.base_url + "/"},
    )
    assert safe.status_code == 200


def test_the_served_schema_is_the_documented_one_and_the_docs_work_offline(api):
    from drf_spectacular.generators import SchemaGenerator

    s = api("anonymous")
    served = call(s, "GET", "/api/schema/?format=json").json()
    generated = SchemaGenerator().get_schema(request=None, public=True)
    assert sorted(served["paths"]) == sorted(generated["paths"])
    gate = served["paths"]["/api/v1/gate/check/"]["post"]
    assert set(gate["responses"]) == {"200", "400", "401", "403", "413"}
    assert list(gate["requestBody"]["content"]) == ["application/json"]
    docs = call(s, "GET", "/api/docs/")
    assert docs.status_code == 200
    assets = [
        part.split('"')[0] for part in docs.text.split('src="')[1:] if part.startswith("/static/")
    ]
    assert assets, "Swagger UI's scripts come from this server"
    for asset in assets:
        assert call(s, "GET", asset).status_code == 200, asset


def test_a_revoked_token_stops_working_once_its_cache_entry_expires(api, snapshot, monkeypatch):
    from rest_framework.authtoken.models import Token

    from gatekeeper.lib.permissions import CachedTokenAuthentication

    s = api("viewer")
    assert call(s, "GET", "/api/v1/segments/lookup/?user_id=1").status_code == 200
    Token.objects.filter(user__username="viewer").delete()
    # Within the cache time the process still knows the token (no query per request)...
    assert call(s, "GET", "/api/v1/segments/lookup/?user_id=1").status_code == 200
    # ...and once the entry is stale it asks the database again, which says no.
    monkeypatch.setattr(CachedTokenAuthentication, "TOKEN_CACHE_SECONDS", 0.0)
    CachedTokenAuthentication._cache.clear()
    assert call(s, "GET", "/api/v1/segments/lookup/?user_id=1").status_code == 401
