"""The suppression list over HTTP: added, listed, imported and removed through the service
(every change journalled with who made it), each bad field named, and the gate following every
change at once in the process that made it."""

import gzip

import pytest

from limits.models.people import Suppression, SuppressionChange
from tests.support.api import call, check_body

pytestmark = pytest.mark.django_db(transaction=True)


def gate(session, *user_ids: int, channel: str = "email") -> list[str]:
    body = {**check_body([(u, f"m{u}") for u in user_ids]), "channel": channel, "dry_run": True}
    answer = call(session, "POST", "/api/v1/gate/check/", json=body)
    assert answer.status_code == 200, answer.text
    return [d["reason"] for d in answer.json()["results"]]


def test_a_campaign_system_adds_reads_and_removes_suppressions_and_the_gate_follows(api, snapshot):
    g = api("gate")
    assert gate(g, 1, 9) == ["allowed", "allowed"]
    added = call(
        g,
        "POST",
        "/api/v1/suppressions/",
        json={"channel": "email", "user_ids": [1, "9", 9], "reason": "unsubscribed", "note": "pc"},
    )
    assert added.status_code == 200, added.text
    assert added.json() == {"channel": "email", "added": 2, "already": 0}
    assert gate(g, 1, 9, 2) == ["suppressed", "suppressed", "allowed"]
    assert gate(g, 1, channel="push") == ["allowed"]
    again = call(g, "POST", "/api/v1/suppressions/", json={"channel": "email", "user_ids": [1]})
    assert again.json() == {"channel": "email", "added": 0, "already": 1}

    one = call(g, "GET", "/api/v1/suppressions/email/1/")
    assert one.status_code == 200
    assert {k: one.json()[k] for k in ("channel", "user_id", "reason", "source", "note")} == {
        "channel": "email",
        "user_id": 1,
        "reason": "unsubscribed",  # the first reason is kept
        "source": "api",
        "note": "pc",
    }
    assert call(g, "GET", "/api/v1/suppressions/push/1/").status_code == 404

    assert call(g, "DELETE", "/api/v1/suppressions/email/1/").status_code == 204
    assert call(g, "DELETE", "/api/v1/suppressions/email/1/").status_code == 404
    removed = call(
        g, "POST", "/api/v1/suppressions/remove/", json={"channel": "email", "user_ids": [9, 5]}
    )
    assert removed.json() == {"channel": "email", "removed": 1, "absent": 1}
    assert gate(g, 1, 9) == ["allowed", "allowed"]
    journal = SuppressionChange.objects.order_by("id").values_list(
        "user_id", "action", "source", "by__username"
    )
    assert list(journal) == [
        (1, "added", "api", "gate"),
        (9, "added", "api", "gate"),
        (1, "removed", "api", "gate"),
        (9, "removed", "api", "gate"),
    ]


def test_the_list_pages_newest_first_and_filters(api, snapshot):
    m = api("marketer")
    for channel, ids, reason in (
        ("email", [1, 2, 3], "bounced"),
        ("all", [4], "manual"),
        ("push", [5], "complained"),
    ):
        body = {"channel": channel, "user_ids": ids, "reason": reason}
        assert call(m, "POST", "/api/v1/suppressions/", json=body).status_code == 200
    first = call(m, "GET", "/api/v1/suppressions/?limit=3").json()
    assert [r["user_id"] for r in first["results"]] == [5, 4, 3]
    second = call(m, "GET", first["next"].removeprefix(m.base_url)).json()
    assert [r["user_id"] for r in second["results"]] == [2, 1] and second["next"] is None
    by_reason = call(m, "GET", "/api/v1/suppressions/?reason=bounced&channel=email").json()
    assert sorted(r["user_id"] for r in by_reason["results"]) == [1, 2, 3]
    for_four = call(m, "GET", "/api/v1/suppressions/?user_id=4").json()["results"]
    assert [r["channel"] for r in for_four] == ["all"]


def test_a_file_is_imported_whole_or_not_at_all(api, snapshot):
    m = api("marketer")
    body = gzip.compress(b"user_id\n11\n12\n\n12\n13\n")
    imported = call(m, "PUT", "/api/v1/suppressions/email/import/?reason=bounced", data=body)
    assert imported.status_code == 200, imported.text
    assert imported.json() == {"channel": "email", "added": 3, "already": 0, "lines": 6}
    assert set(Suppression.objects.values_list("user_id", "reason", "source")) == {
        (11, "bounced", "import"),
        (12, "bounced", "import"),
        (13, "bounced", "import"),
    }
    bad = call(m, "PUT", "/api/v1/suppressions/email/import/", data=b"14\n15\nabc\n")
    assert bad.status_code == 400
    assert bad.json()["line"] == 3 and "line 3" in bad.json()["file"][0]
    assert not Suppression.objects.filter(user_id__in=[14, 15]).exists()


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/v1/suppressions/", {"channel": "fax", "user_ids": [1]}, "channel"),
        ("POST", "/api/v1/suppressions/", {"channel": "email", "user_ids": []}, "user_ids"),
        ("POST", "/api/v1/suppressions/", {"channel": "email", "user_ids": [-1]}, "user_ids[0]"),
        ("POST", "/api/v1/suppressions/", {"channel": "email", "user_ids": ["01"]}, "user_ids[0]"),
        (
            "POST",
            "/api/v1/suppressions/",
            {"channel": "email", "user_ids": [1], "reason": "angry"},
            "reason",
        ),
        ("POST", "/api/v1/suppressions/", {"channel": "email"}, "user_ids"),
        ("POST", "/api/v1/suppressions/remove/", {"channel": "all"}, "user_ids"),
        ("GET", "/api/v1/suppressions/?channel=fax", None, "channel"),
        ("GET", "/api/v1/suppressions/?limit=0", None, "limit"),
        ("GET", "/api/v1/suppressions/?user_id=x", None, "user_id"),
        ("GET", "/api/v1/suppressions/?reason=x", None, "reason"),
        ("GET", "/api/v1/suppressions/fax/1/", None, "channel"),
        ("GET", "/api/v1/suppressions/email/x/", None, "user_id"),
        ("PUT", "/api/v1/suppressions/fax/import/", b"1\n", "channel"),
        ("PUT", "/api/v1/suppressions/email/import/?reason=x", b"1\n", "reason"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(
    api, snapshot, method, path, body, field
):
    m = api("marketer")
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    answer = call(m, method, path, **kwargs)
    assert answer.status_code == 400, answer.text
    assert field in answer.json(), answer.json()
    assert not Suppression.objects.exists()
