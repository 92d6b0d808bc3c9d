"""A user's quota over HTTP: it agrees with the gate and writes nothing."""

import time

import pytest

from tests.support.api import call, check_body
from tests.support.clocks import instant
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_the_quota_shows_every_rule_that_applies_with_its_figures(api, snapshot):
    m = api("marketer")
    promo = call(
        m,
        "POST",
        "/api/v1/rules/",
        json={
            "name": "2 promos a day",
            "segment": None,
            "channel": "push",
            "match": "tag",
            "tag": "promo",
            "window": {"kind": "calendar", "unit": "day"},
            "limit": 2,
            "reserve": {"below_priority": 5, "slots": 1},
        },
    ).json()
    per_campaign = call(
        m,
        "POST",
        "/api/v1/rules/",
        json={
            "name": "1 per campaign a week",
            "segment": "vip",
            "channel": "all",
            "match": "campaign",
            "window": {"kind": "rolling", "seconds": 604_800},
            "limit": 1,
        },
    ).json()
    g = api("gate")
    body = {
        "channel": "push",
        "campaign": "spring",
        "tags": ["promo"],
        "requests": [{"user_id": 1, "message_id": "a"}],
    }
    assert call(g, "POST", "/api/v1/gate/check/", json=body).json()["results"][0]["allowed"]

    quota = call(api("viewer"), "GET", "/api/v1/users/1/quota/?campaign=spring").json()
    assert (quota["segment"], quota["time_zone"], quota["experiment"]) == ("vip", "UTC", None)
    assert "sent" not in quota  # only with ?window=
    rules = {r["name"]: r for r in quota["rules"]}
    assert {r["name"] for r in quota["rules"] if r["classic"]} == {
        "VIP: daily cap on email",
        "VIP: weekly cap on email",
        "VIP: daily cap on all channels together",
    }
    assert rules["2 promos a day"] == {
        "id": promo["id"],
        "kind": "rule",
        "name": "2 promos a day",
        "channel": "push",
        "description": promo["description"],
        "match": "tag",
        "tag": "promo",
        "window": {"kind": "calendar", "unit": "day"},
        "limit": 2,
        "used": 1,
        "remaining": 1,
        "next_slot_in": None,
        "reserve": {"below_priority": 5, "slots": 1},
        "classic": False,
    }
    campaign = rules["1 per campaign a week"]
    assert (campaign["id"], campaign["channel"], campaign["used"], campaign["remaining"]) == (
        per_campaign["id"],
        "all",
        1,
        0,
    )
    assert 604_000 < campaign["next_slot_in"] <= 604_800
    other = call(api("viewer"), "GET", "/api/v1/users/1/quota/?campaign=summer").json()
    assert {r["name"]: r["used"] for r in other["rules"]}["1 per campaign a week"] == 0


def test_the_quota_counts_recent_sends_in_a_window_and_reads_days_in_a_time_zone(api, snapshot):
    now = time.time()
    for ago, channel, message in [(30, "email", "a"), (3 * 3_600, "push", "b"), (60, "push", "c")]:
        (decision,) = gate_check(channel=channel, requests=[(7, message)], now=instant(now - ago))
        assert decision.allowed
    v = api("viewer")
    recent = call(v, "GET", "/api/v1/users/7/quota/?window=2h").json()
    assert recent["sent"] == {"email": 1, "push": 1, "sms": 0}
    assert call(v, "GET", "/api/v1/users/7/quota/?window=7d").json()["sent"] == {
        "email": 1,
        "push": 2,
        "sms": 0,
    }
    zoned = call(v, "GET", "/api/v1/users/7/quota/?time_zone=Asia/Kathmandu").json()
    assert zoned["time_zone"] == "Asia/Kathmandu"


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("window=3x", "window", "not a length of time"),
        ("window=3", "window", "3 seconds: a window is 1 minute to 90 days"),
        ("window=-3h", "window", "not a length of time"),
        ("window=%D9%A3h", "window", "not a length of time"),  # an Arabic-Indic 3
        ("window=30s", "window", "1 minute to 90 days"),
        ("window=91d", "window", "1 minute to 90 days"),
        ("window=8d", "window", "The log keeps sends for 7 days"),
        ("time_zone=Mars/Olympus_Mons", "time_zone", "Unknown time zone 'Mars/Olympus_Mons'"),
        ("time_zone=", "time_zone", "Unknown time zone"),
        (f"campaign={'c' * 201}", "campaign", "At most 200"),
    ],
)
def test_bad_quota_queries_are_refused_naming_them(api, snapshot, query, field, words):
    refused = call(api("viewer"), "GET", f"/api/v1/users/7/quota/?{query}")
    assert refused.status_code == 400, refused.text
    assert words in " ".join(refused.json()[field]), refused.json()


def test_a_longer_rule_makes_the_log_keep_sends_longer_and_the_window_may_reach_back_as_far(
    api, snapshot
):
    v = api("viewer")
    assert call(v, "GET", "/api/v1/users/7/quota/?window=30d").status_code == 400
    call(
        api("marketer"),
        "POST",
        "/api/v1/rules/",
        json={
            "name": "4 a month",
            "segment": None,
            "channel": "all",
            "window": {"kind": "calendar", "unit": "month"},
            "limit": 4,
        },
    )
    assert call(v, "GET", "/api/v1/users/7/quota/?window=30d").json()["sent"] == {
        "email": 0,
        "push": 0,
        "sms": 0,
    }
    refused = call(v, "GET", "/api/v1/users/7/quota/?window=40d")
    assert "The log keeps sends for 31 days" in refused.json()["window"][0]
