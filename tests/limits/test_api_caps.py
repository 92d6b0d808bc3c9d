"""Caps over HTTP: set, validated, governing the gate."""

import pytest

from tests.support.api import call, check_body

pytestmark = pytest.mark.django_db(transaction=True)


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
    # A segment that does not exist has no cap to set: 404.
    missing = call(m, "PUT", "/api/v1/limits/nope/email/", json={"daily": 1, "weekly": 1})
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]
    # None of the refusals changed the cap.
    caps = call(m, "GET", "/api/v1/limits/").json()
    assert {"segment": "default", "channel": "email", "daily": 0, "weekly": None}.items() <= next(
        c for c in caps if (c["segment"], c["channel"]) == ("default", "email")
    ).items()
