"""The gate enforces what people said, at once and exactly: a topic or channel switched off is
`preference` naming it, a topic they must ask for and did not is `preference`, a pause is
`paused` with the seconds until it ends; transactional sends and required topics pass; a
change reaches this process at once and every other within the TTL; nothing is charged."""

from datetime import UTC, datetime, timedelta

import pytest

from limits.engine.limiter import Decision
from limits.engine.topics import TopicFields
from limits.people.preferences import PreferenceCache, PreferencesFields, preferences_patch
from limits.people.preferences import preferences_replace as replace
from limits.policy.selectors import policy_cache, topics_read
from limits.policy.services import TOPICS
from tests.support.api import call
from worker.gate import Gate, gate_check

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.now(tz=UTC).replace(microsecond=0)


@pytest.fixture
def topics(published):
    published(vip=(10, [1, 2], {"email": (5, None), "push": (5, None)}))
    for slug, default in (("news", "subscribed"), ("offers", "unsubscribed"),
                          ("terms", "required")):  # fmt: skip
        TOPICS.create(fields=TopicFields(slug=slug, name=slug, default=default), via="command")
    policy_cache().invalidate()


def said(user_id: int, **fields) -> None:
    replace(user_id=user_id, prefs=PreferencesFields(**fields), topics=topics_read(), source="api")


def reasons(channel="email", topic="", users=(1, 2, 3), **options):
    decisions = gate_check(
        channel=channel,
        requests=[(u, f"{topic}-{channel}-{u}-{options.get('category', 'm')}") for u in users],
        topic=topic,
        now=NOW,
        **options,
    )
    return [(d.reason, d.preference, d.retry_after) for d in decisions]


def test_a_topic_switched_off_is_refused_naming_it_and_charges_nothing(topics):
    said(1, topics={"news": {"email": False}})
    said(2, channels={"email": False})
    off = {"topic": "news", "channel": "email"}
    assert reasons(topic="news") == [
        ("preference", off, None),
        ("preference", {"topic": None, "channel": "email"}, None),
        ("allowed", None, None),
    ]
    assert reasons(channel="push", topic="news") == [("allowed", None, None)] * 3
    # No topic: only the channel switched off refuses.
    assert [r[0] for r in reasons()] == ["allowed", "preference", "allowed"]
    # Nothing was charged for the refused sends: user 1's emails counted are the no-topic one
    # and this one.
    again = gate_check(channel="email", requests=[(1, "again")], now=NOW)[0]
    assert (again.reason, again.counts["daily"]) == ("allowed", 2)


def test_a_topic_people_must_ask_for_goes_only_to_those_who_did(topics):
    said(2, topics={"offers": {"email": True}})
    assert [r[0] for r in reasons(topic="offers")] == ["preference", "allowed", "preference"]


def test_a_pause_holds_everything_until_it_ends_and_names_when(topics):
    said(1, paused_until=NOW + timedelta(hours=2))
    said(2, paused_channels={"push": NOW + timedelta(hours=1)})
    assert reasons(topic="news") == [
        ("paused", None, 7200.0),
        ("allowed", None, None),
        ("allowed", None, None),
    ]
    assert [r[:2] for r in reasons(channel="push")] == [
        ("paused", None),
        ("paused", None),
        ("allowed", None),
    ]


def test_transactional_sends_and_required_topics_pass_everything(topics):
    said(1, channels={"email": False}, paused_until=NOW + timedelta(days=1))
    assert [r[0] for r in reasons(topic="terms", users=(1,))] == ["allowed"]
    assert [r[0] for r in reasons(users=(1,), category="transactional")] == ["exempt"]


@pytest.mark.postgres
def test_a_change_reaches_this_process_at_once_and_another_within_its_ttl(topics):
    clock = [0.0]
    other = PreferenceCache(ttl=2.0, clock=lambda: clock[0])
    gate = Gate(preferences=other, record_stats=False)

    def decided() -> str:
        return gate.check(channel="email", requests=[(3, f"m{clock[0]}")], topic="news",
                          now=NOW)[0].reason  # fmt: skip

    assert decided() == "allowed"
    preferences_patch(user_id=3, changes={"topics": {"news": {"email": False}}},
                      topics=topics_read(), source="api")  # fmt: skip
    assert reasons(topic="news", users=(3,))[0][0] == "preference"  # this process: at once
    clock[0] = 1.0
    assert decided() == "allowed"  # another process: not before its TTL
    clock[0] = 2.5
    assert decided() == "preference"
    preferences_patch(user_id=3, changes={"topics": {"news": {"email": None}}},
                      topics=topics_read(), source="api")  # fmt: skip
    clock[0] = 5.0
    assert decided() == "allowed"


def test_over_rest_the_decision_names_what_was_switched_off(api, snapshot):
    m, gate = api("marketer"), api("gate")
    assert call(m, "POST", "/api/v1/topics/", json={"slug": "news", "name": "News"}).ok
    path = "/api/v1/users/1/preferences/"
    assert call(gate, "PATCH", path, json={"topics": {"news": {"email": False}}}).ok
    body = {
        "channel": "email",
        "topic": "news",
        "requests": [{"user_id": 1, "message_id": "a"}, {"user_id": 2, "message_id": "a"}],
    }
    results = call(gate, "POST", "/api/v1/gate/check/", json=body).json()["results"]  # fmt: skip
    assert [(r["reason"], r["preference"]) for r in results] == [
        ("preference", {"topic": "news", "channel": "email"}),
        ("allowed", None),
    ]


def test_the_user_lookup_shows_what_the_person_said_and_their_changes(topics, viewer_client):
    import re

    from django.urls import reverse

    said(7, topics={"news": {"email": False}}, channels={"sms": False},
         paused_until=NOW + timedelta(days=2))  # fmt: skip
    page = viewer_client.get(reverse("admin:user_lookup"), {"user_id": "7"})
    assert page.status_code == 200
    text = re.sub(r"\s+", " ", page.content.decode())
    assert "news on email: switched off" in text and "All sms: switched off" in text
    assert f"All marketing paused until {NOW + timedelta(days=2):%Y-%m-%d %H:%M} UTC" in text
    assert re.search(r'id="preference-changes">.*<td>api</td>', text)
    quiet = viewer_client.get(reverse("admin:user_lookup"), {"user_id": "8"}).content.decode()
    assert "Nothing: every topic and channel follows its default" in quiet


WEEK = {"kind": "rolling", "seconds": 604_800}


def test_a_persons_own_frequency_is_a_rule_of_theirs_on_the_same_log(topics):
    said(1, frequency=[{"channel": "email", "window": WEEK, "limit": 2}])
    decided = [
        gate_check(
            channel="email", requests=[(1, f"m{n}"), (2, f"m{n}")], now=NOW + timedelta(seconds=n)
        )
        for n in range(3)
    ]
    assert [[d.reason for d in pair] for pair in decided] == [["allowed"] * 2] * 2 + [
        ["cap", "allowed"]
    ]
    refused = decided[2][0]
    assert refused.rule == {"id": 0, "kind": "person", "name": "Their own frequency",
                            "window": WEEK, "limit": 2, "used": 2}  # fmt: skip
    assert refused.retry_after == pytest.approx(604_800 - 2, abs=1)
    # The marketer's caps count the same sends: user 2's third email is their third today.
    assert decided[2][1].counts["daily"] == 3
    # Other channels, transactional sends and required topics are not theirs to limit.
    assert gate_check(channel="push", requests=[(1, "p")], now=NOW)[0].allowed
    for category, topic in (("transactional", ""), ("marketing", "terms")):
        again = gate_check(channel="email", requests=[(1, f"x{category}")], category=category,
                           topic=topic, now=NOW + timedelta(seconds=5))[0]  # fmt: skip
        assert again.reason in ("allowed", "exempt"), category
    # Taken back: the next send goes at once.
    preferences_patch(user_id=1, changes={"frequency": None}, topics=topics_read(), source="api")
    assert gate_check(channel="email", requests=[(1, "m9")], now=NOW + timedelta(seconds=9))[
        0
    ].allowed


def test_an_own_calendar_frequency_counts_in_the_users_zone(topics):
    said(1, frequency=[{"channel": "email", "window": {"kind": "calendar", "unit": "day"},
                        "limit": 1}])  # fmt: skip
    zone = "Pacific/Kiritimati"  # 14 hours ahead of UTC
    local_midnight = datetime(2030, 6, 2, 10, 0, tzinfo=UTC)  # 00:00 on the 3rd

    def send(message: str, seconds: int) -> list[Decision]:
        at = local_midnight + timedelta(seconds=seconds)
        return gate_check(channel="email", requests=[(1, message)], now=at, time_zones=[zone])

    first, second, third = send("a", -60), send("b", -30), send("c", 30)
    assert [first[0].reason, second[0].reason, third[0].reason] == ["allowed", "cap", "allowed"]
    assert second[0].retry_after == pytest.approx(30, abs=1)


def test_the_logs_keep_what_an_own_frequency_counts_after_the_rule_that_allowed_it_goes(
    topics, api
):
    marketer = api("marketer")
    month = {"name": "4 a month", "segment": None, "channel": "email", "window": {"kind": "calendar",
             "unit": "month"}, "limit": 4}  # fmt: skip
    created = call(marketer, "POST", "/api/v1/rules/", json=month)
    assert created.status_code == 201, created.text
    policy_cache().invalidate()
    said(1, frequency=[{"channel": "email", "window": {"kind": "calendar", "unit": "month"},
                        "limit": 2}])  # fmt: skip
    assert call(marketer, "DELETE", f"/api/v1/rules/{created.json()['id']}/").status_code == 204
    policy_cache().invalidate()
    assert policy_cache().table().retention_ms >= 31 * 86_400_000


@pytest.mark.postgres
def test_a_refusal_by_an_own_frequency_is_kept_in_the_history_as_theirs(topics, api):
    from limits.ledger.drain import ledger_drain

    said(1, frequency=[{"channel": "email", "window": WEEK, "limit": 1}])
    for n in range(2):
        gate_check(channel="email", requests=[(1, f"h{n}")], now=NOW + timedelta(seconds=n))
    ledger_drain()
    answer = call(api("viewer"), "GET", "/api/v1/users/1/history/")
    assert answer.status_code == 200, answer.text
    newest = answer.json()["results"][0]
    assert (newest["reason"], newest["rule"]["id"], newest["rule"]["name"]) == (
        "cap",
        0,
        "Their own frequency",
    )


def test_an_own_calendar_week_counts_the_whole_week_in_the_users_zone_across_a_dst_change(
    topics,
):
    """America/New_York's clocks go back an hour on Sunday 3 November 2030: that calendar week
    (Monday 28 October to Sunday 3 November, local) lasts 7 days and an hour, so its first send
    is still counted after more than 7 x 24 hours."""
    week = {"kind": "calendar", "unit": "week"}
    said(1, frequency=[{"channel": "email", "window": week, "limit": 2}])
    zone = "America/New_York"

    def send(message_id: str, at: datetime) -> Decision:
        return gate_check(channel="email", requests=[(1, message_id)], now=at,
                          time_zones=[zone])[0]  # fmt: skip

    monday = datetime(2030, 10, 28, 4, 30, tzinfo=UTC)  # 00:30 EDT, Monday 28 October
    sunday_night = datetime(2030, 11, 4, 4, 40, tzinfo=UTC)  # 23:40 EST, Sunday 3 November
    next_monday = datetime(2030, 11, 4, 5, 0, tzinfo=UTC)  # 00:00 EST, Monday 4 November
    assert sunday_night - monday > timedelta(days=7)
    first = send("a", monday)
    second = send("b", sunday_night)
    third = send("c", sunday_night + timedelta(minutes=10))
    assert [first.reason, second.reason, third.reason] == ["allowed", "allowed", "cap"]
    assert third.rule == {"id": 0, "kind": "person", "name": "Their own frequency",
                          "window": week, "limit": 2, "used": 2}  # fmt: skip
    assert third.retry_after == pytest.approx(600, abs=1)  # at local midnight, Monday
    # The next calendar week: room again, from its first minute.
    assert send("d", next_monday + timedelta(minutes=1)).reason == "allowed"
    assert send("e", next_monday + timedelta(minutes=2)).reason == "allowed"
    assert send("f", next_monday + timedelta(minutes=3)).reason == "cap"
