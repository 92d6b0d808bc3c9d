"""A user's quota over HTTP: it agrees with the gate and writes nothing."""

import pytest

from tests.api.conftest import call, check_body

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
