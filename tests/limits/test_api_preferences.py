"""A person's preferences over HTTP: read, replaced whole, changed choice by choice, each change
journaled with its source and who made it; every bad choice named and nothing changed."""

from datetime import UTC, datetime, timedelta

import pytest

from limits.models.people import Preference, PreferenceChange
from limits.people.preferences import PreferencesFields, preferences_read
from limits.policy.selectors import policy_cache, topics_read
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


@pytest.mark.postgres
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
        # Longer than a week (a calendar one included) when no rule counts longer.
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


@pytest.mark.postgres
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


CALENDAR_WEEK = {"kind": "calendar", "unit": "week"}


@pytest.mark.postgres
def test_what_a_get_answers_put_back_as_it_is_changes_nothing(api, snapshot, topics):
    gate = api("gate")
    whole = {
        "topics": {"news": {"email": False}, "offers": {"push": True}},
        "channels": {"sms": False},
        "paused_until": later_text(2),
        "paused_channels": {"push": later_text(3)},
        "frequency": [{"channel": "email", "window": WEEK, "limit": 2}],
    }
    assert call(gate, "PUT", PATH, json=whole).status_code == 200
    shown = call(gate, "GET", PATH).json()
    assert shown["user_id"] == 42
    # The very body a GET answers, its user id the path's (as a number or its digits).
    for method in ("PUT", "PATCH"):
        for user_id in (42, "42"):
            again = call(gate, method, PATH, json={**shown, "user_id": user_id})
            assert again.status_code == 200, (method, user_id, again.text)
            assert again.json() == shown, (method, user_id)
    assert call(gate, "PATCH", PATH, json={"user_id": 42}).json() == shown
    assert call(gate, "GET", PATH).json() == shown
    assert PreferenceChange.objects.count() == 1  # none of them changed anything


@pytest.mark.parametrize("user_id", [43, "43", 0, -1, "042", "abc", None, 1.5, 2**64])
def test_a_user_id_not_the_paths_is_a_400_naming_it_and_nothing_changes(
    api, snapshot, topics, user_id
):
    gate = api("gate")
    before = {"topics": {"news": {"email": False}}}
    shown = call(gate, "PUT", PATH, json=before).json()
    for method, body in (
        ("PUT", {**shown, "user_id": user_id}),
        ("PATCH", {"channels": {"sms": False}, "user_id": user_id}),
    ):
        refused = call(gate, method, PATH, json=body)
        assert refused.status_code == 400, (method, refused.text)
        assert list(refused.json()) == ["user_id"], (method, refused.json())
    if user_id in (43, "43", 0):
        assert "42" in refused.json()["user_id"][0], refused.json()
    assert call(gate, "GET", PATH).json() == shown
    assert list(Preference.objects.values_list("user_id", flat=True)) == [42]
    assert PreferenceChange.objects.count() == 1


def test_the_schema_declares_the_body_a_get_answers_as_one_put_and_patch_take(
    api, snapshot, topics
):
    from openapi_schema_validator import OAS30WriteValidator, oas30_format_checker

    gate = api("gate")
    body = {"topics": {"news": {"email": False}}, "paused_until": later_text(),
            "frequency": [{"channel": "email", "window": CALENDAR_WEEK, "limit": 2},
                          {"channel": "push", "window": WEEK, "limit": 3}]}  # fmt: skip
    assert call(gate, "PUT", PATH, json=body).status_code == 200
    shown = call(gate, "GET", PATH).json()
    served = call(api("viewer"), "GET", "/api/schema/?format=json").json()
    operations = served["paths"]["/api/v1/users/{user_id}/preferences/"]
    for method in ("put", "patch"):
        declared = operations[method]["requestBody"]["content"]["application/json"]["schema"]
        validator = OAS30WriteValidator(
            {**declared, "components": served["components"]}, format_checker=oas30_format_checker
        )
        errors = [error.message for error in validator.iter_errors(shown)]
        assert not errors, (method, errors)
        # The user id is declared, as the path's (a number, or its digits), and may be left out.
        component = declared["$ref"].rsplit("/", 1)[-1]
        properties = served["components"]["schemas"][component]["properties"]
        assert "user_id" in properties and "path" in properties["user_id"]["description"]
        assert "user_id" not in served["components"]["schemas"][component].get("required", [])
        assert validator.is_valid({**shown, "user_id": "42"})
        assert not validator.is_valid({**shown, "user_id": -1})


@pytest.mark.postgres
def test_a_persons_own_calendar_week_is_taken_and_the_logs_keep_it_whole(api, snapshot, topics):
    gate = api("gate")
    mine = {"channel": "email", "window": CALENDAR_WEEK, "limit": 2}
    for method in ("PUT", "PATCH"):
        answer = call(gate, method, PATH, json={"frequency": [mine]})
        assert answer.status_code == 200, (method, answer.text)
        assert answer.json()["frequency"] == [mine]
    # A calendar week in a zone that changes its clocks lasts 7 days and an hour: the logs keep
    # that long for it.
    assert Preference.objects.get(user_id=42).keeps_seconds == 7 * 86_400 + 3_600
    assert policy_cache().table().retention_ms == (7 * 86_400 + 3_600) * 1000
    # Nothing longer than a week when the rules count no longer.
    refused = call(gate, "PATCH", PATH, json={"frequency": [{**mine, "window": MONTH}]})
    assert refused.status_code == 400
    assert "calendar week" in refused.json()["frequency.0.window"][0], refused.json()
    eight_days = {"kind": "rolling", "seconds": 8 * 86_400}
    assert call(gate, "PATCH", PATH, json={"frequency": [{**mine, "window": eight_days}]}).json()[
        "frequency.0.window"
    ]
