"""A person's preferences over HTTP: read, replaced whole, changed choice by choice, each change
journaled with its source and who made it; every bad choice named and nothing changed."""

from datetime import UTC, datetime, timedelta

import pytest

from limits.models import Preference, PreferenceChange
from limits.preferences import PreferencesFields, preferences_read
from limits.selectors import policy_cache, topics_read
from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/users/42/preferences/"
WEEK = {"kind": "rolling", "seconds": 604_800}
SECONDS_5 = {"kind": "rolling", "seconds": 5}
MONTH = {"kind": "calendar", "unit": "month"}
LATER = (datetime.now(tz=UTC) + timedelta(days=7)).replace(microsecond=0)


def later_text(days: int = 7) -> str:
    return (LATER + timedelta(days=days - 7)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def topics(api):
    m = api("marketer")
    for body in (
        {"slug": "news", "name": "News", "channels": ["email", "push"]},
        {"slug": "terms", "name": "Terms", "default": "required"},
        {"slug": "offers", "name": "Offers", "default": "unsubscribed"},
    ):
        assert call(m, "POST", "/api/v1/topics/", json=body).status_code == 201


def test_a_persons_preferences_are_read_replaced_and_changed_choice_by_choice(
    api, snapshot, topics
):
    gate = api("gate")
    empty = call(gate, "GET", PATH)
    assert empty.status_code == 200
    assert empty.json() == {
        "user_id": 42, "topics": {}, "channels": {}, "paused_until": None, "paused_channels": {},
        "frequency": [],
    }  # fmt: skip
    whole = {"topics": {"news": {"email": False}, "offers": {"push": True}},
             "channels": {"sms": False}, "paused_channels": {"push": later_text(3)}}  # fmt: skip
    replaced = call(gate, "PUT", PATH, json=whole)
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["topics"] == {"news": {"email": False}, "offers": {"push": True}}
    assert replaced.json()["paused_channels"] == {"push": later_text(3)}
    assert call(api("viewer"), "GET", PATH).json() == replaced.json()

    changed = call(gate, "PATCH", PATH, json={
        "topics": {"news": {"email": None, "push": False}},  # email back to the default
        "channels": {"sms": None},
        "paused_until": later_text(),
    })  # fmt: skip
    assert changed.status_code == 200, changed.text
    assert changed.json() == {
        "user_id": 42,
        "topics": {"news": {"push": False}, "offers": {"push": True}},
        "channels": {},
        "paused_until": later_text(),
        "paused_channels": {"push": later_text(3)},
        "frequency": [],
    }
    # The same change again changes nothing, and journals nothing.
    assert call(gate, "PATCH", PATH, json={"channels": {"sms": None}}).status_code == 200
    journal = list(
        PreferenceChange.objects.order_by("id").values_list("source", "changed_by__username")
    )
    assert journal == [("api", "gate"), ("api", "gate")]
    assert PreferenceChange.objects.order_by("id").last().before == replaced.json()
    # Everything taken back: the person's row goes; the change is journaled.
    back: dict[str, object] = {
        "topics": {},
        "channels": {},
        "paused_until": None,
        "paused_channels": {},
        "frequency": [],
    }
    assert call(gate, "PUT", PATH, json=back).json() == {"user_id": 42, **back}
    assert not Preference.objects.exists() and PreferenceChange.objects.count() == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"topics": {"nope": {"email": False}}}, "topics.nope"),
        ({"topics": {"news": {"sms": False}}}, "topics.news.sms"),
        ({"topics": {"terms": {"email": False}}}, "topics.terms.email"),
        ({"topics": {"news": {"fax": False}}}, "topics.news.fax"),
        ({"channels": {"fax": False}}, "channels.fax"),
        ({"paused_until": "2020-01-01T00:00:00Z"}, "paused_until"),
        ({"paused_until": "2099-01-01T00:00:00"}, "paused_until"),
        ({"paused_channels": {"email": "2020-01-01T00:00:00Z"}}, "paused_channels.email"),
        ({"colour": "red"}, "colour"),
        ({"frequency": [{"channel": "fax", "window": WEEK, "limit": 2}]}, "frequency.0.channel"),
        ({"frequency": [{"channel": "email", "window": WEEK, "limit": 0}]}, "frequency.0.limit"),
        (
            {"frequency": [{"channel": "email", "window": SECONDS_5, "limit": 2}]},
            "frequency.0.window.seconds",
        ),
        # Longer than any window the rules count (7 days when no rule counts longer).
        ({"frequency": [{"channel": "email", "window": MONTH, "limit": 2}]}, "frequency.0.window"),
        (
            {
                "frequency": [
                    {"channel": "email", "window": WEEK, "limit": 2},
                    {"channel": "email", "window": WEEK, "limit": 1},
                ]
            },
            "frequency.1",
        ),
        ({"frequency": [{"channel": "email", "limit": 2}]}, "frequency[0].window"),
    ],
)
def test_a_bad_choice_is_a_400_naming_it_and_nothing_changes(api, snapshot, topics, body, field):
    gate = api("gate")
    before = {"topics": {"news": {"email": False}}}
    assert call(gate, "PUT", PATH, json=before).status_code == 200
    for method in ("PUT", "PATCH"):
        refused = call(gate, method, PATH, json=body)
        assert refused.status_code == 400, (method, refused.text)
        assert field in refused.json(), (method, refused.json())
    assert call(gate, "GET", PATH).json()["topics"] == {"news": {"email": False}}
    assert PreferenceChange.objects.count() == 1


def test_choices_about_a_deleted_topic_and_ended_pauses_are_dropped_not_refused(
    api, snapshot, topics
):
    gate = api("gate")
    body = {"topics": {"news": {"email": False}, "offers": {"email": True}}}
    assert call(gate, "PUT", PATH, json=body).status_code == 200
    assert call(api("marketer"), "DELETE", "/api/v1/topics/offers/").status_code == 204
    assert call(gate, "GET", PATH).json()["topics"] == {"news": {"email": False}}
    # A later change is not refused for the choice about the deleted topic.
    answer = call(gate, "PATCH", PATH, json={"channels": {"email": False}})
    assert answer.status_code == 200, answer.text
    # A pause read after it ended is no pause.
    read = preferences_read(42, topics=topics_read(), now=LATER + timedelta(days=1))
    assert read == PreferencesFields(topics={"news": {"email": False}}, channels={"email": False})


def test_a_user_id_in_the_path_is_its_digits(api, snapshot):
    for bad in ("abc", "-1", "1.5", str(2**64)):
        answer = call(api("gate"), "GET", f"/api/v1/users/{bad}/preferences/")
        assert answer.status_code == 400 and list(answer.json()) == ["user_id"], bad


def test_a_persons_own_frequency_is_kept_and_never_looser_than_the_rules_for_everyone(
    api, snapshot, topics
):
    gate, marketer = api("gate"), api("marketer")
    rule = {"name": "3 a week", "segment": None, "channel": "all", "window": WEEK, "limit": 3}
    assert call(marketer, "POST", "/api/v1/rules/", json=rule).status_code == 201
    policy_cache().invalidate()
    two = {"channel": "email", "window": WEEK, "limit": 2}
    answer = call(gate, "PATCH", PATH, json={"frequency": [two]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["frequency"] == [two]
    assert Preference.objects.get(user_id=42).keeps_seconds == 604_800
    # As many as everyone may get, or more: it would never decide.
    for limit in (3, 4):
        looser = call(gate, "PATCH", PATH, json={"frequency": [{**two, "limit": limit}]})
        assert looser.status_code == 400
        assert "3 a week" in looser.json()["frequency.0.limit"][0], looser.json()
    # "3 a day" never decides under "3 a week" either; "2 a day" does.
    day = {"channel": "email", "window": {"kind": "rolling", "seconds": 86_400}, "limit": 3}
    assert call(gate, "PATCH", PATH, json={"frequency": [day]}).status_code == 400
    day["limit"] = 2
    assert call(gate, "PATCH", PATH, json={"frequency": [day]}).status_code == 200
    assert call(gate, "GET", PATH).json()["frequency"] == [day]
    assert call(gate, "PATCH", PATH, json={"frequency": None}).json()["frequency"] == []
    assert not Preference.objects.exists()
