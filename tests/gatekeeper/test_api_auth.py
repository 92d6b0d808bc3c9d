"""Tokens, sessions and what an anonymous caller is told."""

import io

import pytest

from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_api_token_prints_a_working_token(api, snapshot):

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
