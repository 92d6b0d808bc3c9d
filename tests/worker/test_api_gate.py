"""gate/check and gate/release over HTTP, against real Redis."""

import time
from datetime import datetime, timedelta
from datetime import time as dt_time
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.support.api import call, check_body, zones_a_day_apart
from tests.support.clocks import instant
from worker.gate import gate_check

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
    # The requests as they were checked may be handed back, time zones and all.
    zoned = [{"user_id": 7, "message_id": "a", "time_zone": "Asia/Tokyo"}]
    again = call(s, "POST", "/api/v1/gate/release/", json={"channel": "email", "requests": zoned})
    assert again.json()["results"][0]["released"] is False  # already taken back
    zoned[0]["time_zone"] = "Asia/Tokio"
    bad = call(s, "POST", "/api/v1/gate/release/", json={"channel": "email", "requests": zoned})
    assert bad.status_code == 400 and "requests[0].time_zone" in bad.json()


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


# --- rules: tags, priority, time zones ---------------------------------------------------------


def rule_body(**fields):
    return {
        "name": "a rule",
        "segment": None,
        "channel": "push",
        "window": {"kind": "rolling", "seconds": 3_600},
        "limit": 1,
        **fields,
    }


def push(user_id, message_id, **extra):
    return {
        "channel": "push",
        "requests": [{"user_id": user_id, "message_id": message_id}],
        **extra,
    }


def test_a_tag_rule_counts_only_the_sends_carrying_its_tag_and_names_itself(api, snapshot):
    created = call(
        api("marketer"),
        "POST",
        "/api/v1/rules/",
        json=rule_body(name="1 promo an hour", match="tag", tag="promo"),
    ).json()
    g = api("gate")
    decided = [
        call(g, "POST", "/api/v1/gate/check/", json=body).json()["results"][0]
        for body in (
            push(7, "a", tags=["promo", "spring"]),
            push(7, "b"),
            push(7, "c", tags=["spring"]),
            push(7, "d", tags=["promo"]),
        )
    ]
    assert [d["reason"] for d in decided] == ["allowed", "allowed", "allowed", "cap"]
    refused = decided[3]
    assert refused["rule"] == {
        "id": created["id"],
        "kind": "rule",
        "name": "1 promo an hour",
        "window": {"kind": "rolling", "seconds": 3_600},
        "limit": 1,
        "used": 1,
    }
    assert refused["reserved"] is None
    assert 3_500 < refused["retry_after"] <= 3_600
    assert decided[0]["rule"] is None and decided[0]["reserved"] is None


def test_a_reserve_keeps_the_last_slot_for_important_sends(api, snapshot):
    call(
        api("marketer"),
        "POST",
        "/api/v1/rules/",
        json=rule_body(name="2 an hour", limit=2, reserve={"below_priority": 7, "slots": 1}),
    )
    g = api("gate")
    first = call(g, "POST", "/api/v1/gate/check/", json=push(7, "a", priority=5)).json()
    low = call(g, "POST", "/api/v1/gate/check/", json=push(7, "b", priority=6)).json()
    urgent = call(g, "POST", "/api/v1/gate/check/", json=push(7, "c", priority=7)).json()
    after = call(g, "POST", "/api/v1/gate/check/", json=push(7, "d", priority=9)).json()
    assert first["results"][0]["reason"] == "allowed"
    refused = low["results"][0]
    assert (refused["reason"], refused["reserved"]) == ("cap", 1)
    # The rule's own limit, and what it counted: it had room, its reserve did not.
    assert (refused["rule"]["limit"], refused["rule"]["used"]) == (2, 1)
    assert urgent["results"][0]["reason"] == "allowed"
    assert (after["results"][0]["reason"], after["results"][0]["reserved"]) == ("cap", None)


def test_a_calendar_rule_counts_the_day_in_the_users_time_zone(api, snapshot):
    """A send recorded just before one zone's midnight is today's in a zone whose day began
    earlier, and yesterday's in the first one."""
    call(
        api("marketer"),
        "POST",
        "/api/v1/rules/",
        json=rule_body(name="1 a day", window={"kind": "calendar", "unit": "day"}),
    )
    now = time.time()
    earlier, later, recorded_at = zones_a_day_apart(now)
    (sent,) = gate_check(channel="push", requests=[(7, "yesterday")], now=instant(recorded_at))
    assert sent.reason == "allowed"

    g = api("gate")
    body = {
        "channel": "push",
        "dry_run": True,
        "requests": [
            {"user_id": 7, "message_id": "a", "time_zone": earlier},
            {"user_id": 7, "message_id": "b", "time_zone": later},
        ],
    }
    results = call(g, "POST", "/api/v1/gate/check/", json=body).json()["results"]
    assert [r["reason"] for r in results] == ["daily_cap", "allowed"]
    assert results[0]["rule"]["window"] == {"kind": "calendar", "unit": "day"}
    # Refused until the next local midnight where the user is.
    local = datetime.fromtimestamp(now, tz=ZoneInfo(earlier))
    next_midnight = datetime.combine(local.date() + timedelta(days=1), dt_time(), local.tzinfo)
    assert results[0]["retry_after"] == pytest.approx(next_midnight.timestamp() - now, abs=30)


def test_unknown_time_zones_and_bad_tags_are_refused_naming_them(api, snapshot):
    g = api("gate")
    requests_ = [
        {"user_id": 1, "message_id": "a", "time_zone": "Europe/Paris"},
        {"user_id": 1, "message_id": "b", "time_zone": "Mars/Olympus_Mons"},
    ]
    bad_zone = call(
        g, "POST", "/api/v1/gate/check/", json={"channel": "email", "requests": requests_}
    )
    assert bad_zone.status_code == 400
    assert bad_zone.json() == {
        "requests[1].time_zone": [
            "Unknown time zone 'Mars/Olympus_Mons'. Use an IANA name such as Europe/Paris."
        ]
    }
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"tags": ["promo", "Promo"]}, "tags[1]", "Lowercase"),
        ({"tags": ["promo", "sale", "promo"]}, "tags[2]", "twice"),
        ({"tags": ["promo\n"]}, "tags[0]", "is not a tag"),
        ({"tags": [f"t{i}" for i in range(9)]}, "tags", "At most 8"),
        ({"tags": "promo"}, "tags", "list"),
        ({"priority": 10}, "priority", "at most 9"),
        ({"priority": -1}, "priority", "at least 0"),
        ({"priority": 5.0}, "priority", "integer"),
    ]
    empty_zone = [{"user_id": 1, "message_id": "a", "time_zone": ""}]
    refused = call(
        g, "POST", "/api/v1/gate/check/", json={"channel": "email", "requests": empty_zone}
    )
    assert refused.status_code == 400 and "requests[0].time_zone" in refused.json()
    for extra, field, words in cases:
        refused = call(g, "POST", "/api/v1/gate/check/", json=check_body([(1, "x")], **extra))
        assert refused.status_code == 400, (extra, refused.text)
        assert words in " ".join(refused.json()[field]), (extra, refused.json())
    # Nothing was recorded by the refused calls.
    assert (
        call(g, "POST", "/api/v1/gate/check/", json=check_body([(1, "x")])).json()["results"][0][
            "counts"
        ]["daily"]
        == 1
    )
