"""Topics over HTTP and in the admin: created, read, changed (never their slug) and deleted
through their authored kind (one rule for a valid topic, every change in the history), each bad
field named and nothing stored by a refusal."""

import pytest
from django.urls import reverse

from limits.models.policy import SettingChange, Topic
from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

NEWS = {"slug": "product-news", "name": "Product news", "channels": ["push", "email"]}


def history() -> list[tuple[str, str, str | None]]:
    return list(
        SettingChange.objects.filter(kind="topic")
        .order_by("id")
        .values_list("action", "via", "by__username")
    )


def test_a_marketer_creates_reads_changes_and_deletes_a_topic_and_each_step_is_recorded(
    api, snapshot
):
    m = api("marketer")
    created = call(m, "POST", "/api/v1/topics/", json={**NEWS, "description": "What is new."})
    assert created.status_code == 201, created.text
    topic = created.json()
    # Channels in the settings' order, the default subscribed.
    assert {k: topic[k] for k in ("slug", "name", "description", "channels", "default")} == {
        "slug": "product-news",
        "name": "Product news",
        "description": "What is new.",
        "channels": ["email", "push"],
        "default": "subscribed",
    }
    assert topic["reading"] == (
        "Product news, on emails, push messages: everyone gets it until they switch it off"
    )
    assert call(api("viewer"), "GET", "/api/v1/topics/").json() == [topic]
    path = "/api/v1/topics/product-news/"
    assert call(api("gate"), "GET", path).json() == topic  # a campaign system reads them

    changed = call(m, "PATCH", path, json={"default": "required", "channels": []})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["default"], changed.json()["channels"]) == ("required", [])
    assert changed.json()["reading"] == (
        "Product news, on every channel: everyone gets it; no preference can switch it off"
    )
    assert call(m, "PATCH", path, json={"default": "required"}).status_code == 200  # no change

    assert call(m, "DELETE", path).status_code == 204
    assert call(m, "GET", path).status_code == 404
    assert not Topic.objects.exists()
    assert history() == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("deleted", "api", "marketer"),
    ]
    change = SettingChange.objects.filter(kind="topic").order_by("id")[1]
    assert (change.before or {})["default"] == "subscribed"
    assert (change.after or {})["default"] == "required"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**NEWS, "channels": ["email", "fax"]}, "channels"),
        ({**NEWS, "channels": ["email", "email"]}, "channels"),
        ({**NEWS, "default": "maybe"}, "default"),
        ({**NEWS, "name": "   "}, "name"),
        ({**NEWS, "slug": "no spaces"}, "slug"),
        ({**NEWS, "colour": "red"}, "colour"),
    ],
)
def test_a_bad_topic_is_a_400_naming_the_field_and_nothing_is_stored(api, snapshot, body, field):
    response = call(api("marketer"), "POST", "/api/v1/topics/", json=body)
    assert response.status_code == 400, response.text
    assert field in response.json(), response.json()
    assert not Topic.objects.exists() and not SettingChange.objects.filter(kind="topic").exists()


def test_a_slug_is_taken_once_and_never_changes(api, snapshot):
    m = api("marketer")
    assert call(m, "POST", "/api/v1/topics/", json=NEWS).status_code == 201
    again = call(m, "POST", "/api/v1/topics/", json={**NEWS, "name": "Other"})
    assert again.status_code == 409 and again.json()["field"] == "slug"
    renamed = call(m, "PATCH", "/api/v1/topics/product-news/", json={"slug": "news"})
    assert renamed.status_code == 400 and "slug" in renamed.json()
    bad = call(m, "PATCH", "/api/v1/topics/product-news/", json={"channels": ["fax"]})
    assert bad.status_code == 400 and "channels" in bad.json()
    assert list(Topic.objects.values_list("slug", "name", "channels")) == [
        ("product-news", "Product news", ["email", "push"])
    ]
    assert len(history()) == 1


def test_a_topic_made_in_the_admin_is_read_in_plain_words_and_recorded_with_who(
    admin_client, snapshot
):
    add = reverse("admin:limits_topic_add")
    data = {"slug": "offers", "name": "Offers", "description": "", "channels": ["sms"],
            "default": "unsubscribed"}  # fmt: skip
    refused = admin_client.post(add, {**data, "name": " "})
    assert refused.status_code == 200 and not Topic.objects.exists()
    response = admin_client.post(add, data, follow=True)
    assert response.status_code == 200
    topic = Topic.objects.get()
    assert (topic.slug, topic.channels, topic.default) == ("offers", ["sms"], "unsubscribed")
    assert "Offers, on text messages: only those who switch it on get it" in (
        response.content.decode()
    )
    change = reverse("admin:limits_topic_change", args=[topic.pk])
    page = admin_client.get(change).content.decode()
    assert 'id="topic-history"' in page and "Created: Offers" in page
    # The slug is not on the change form: a post that names another changes nothing of it.
    admin_client.post(change, {**data, "slug": "deals", "default": "subscribed"})
    topic.refresh_from_db()
    assert (topic.slug, topic.default) == ("offers", "subscribed")
    assert list(
        SettingChange.objects.filter(kind="topic").order_by("id").values_list("action", "via")
    ) == [
        ("created", "admin"),
        ("changed", "admin"),
    ]


@pytest.mark.postgres
def test_a_gate_call_names_its_topic_which_must_exist_on_its_channel_and_the_ledger_keeps_it(
    api, snapshot
):
    from limits.ledger.drain import ledger_drain_all

    assert call(api("marketer"), "POST", "/api/v1/topics/", json=NEWS).status_code == 201
    gate = api("gate")
    body = {"channel": "sms", "campaign": "launch", "requests": [{"user_id": 1, "message_id": "a"}]}
    for topic, words in (("nope", "No topic 'nope'. Known: product-news."),
                         ("product-news", "Topic 'product-news' is not sent on sms: it is on "
                                          "email, push.")):  # fmt: skip
        refused = call(gate, "POST", "/api/v1/gate/check/", json={**body, "topic": topic})
        assert refused.status_code == 400 and refused.json() == {"topic": [words]}
    body["channel"] = "push"
    answered = call(gate, "POST", "/api/v1/gate/check/", json={**body, "topic": "product-news"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["results"][0]["reason"] == "allowed"
    untopical = {**body, "requests": [{"user_id": 1, "message_id": "b"}], "topic": None}
    assert call(gate, "POST", "/api/v1/gate/check/", json=untopical).status_code == 200
    ledger_drain_all()
    history = call(api("marketer"), "GET", "/api/v1/users/1/history/").json()["results"]
    assert [(d["message_id"], d["topic"]) for d in history] == [
        ("b", None),
        ("a", "product-news"),
    ]


def test_a_send_job_over_rest_names_its_topic(api, snapshot):
    from worker.models import SendJob

    assert call(api("marketer"), "POST", "/api/v1/topics/", json=NEWS).status_code == 201
    body = {"channel": "email", "campaign": "c", "template": "welcome", "topic": "offers",
            "recipients": [{"user_id": 1, "address": "a@example.com"}]}  # fmt: skip
    refused = call(api("gate"), "POST", "/api/v1/sends/", json=body)
    assert refused.status_code == 400 and "topic" in refused.json(), refused.text
    assert not SendJob.objects.exists()
    taken = call(api("gate"), "POST", "/api/v1/sends/", json={**body, "topic": "product-news"})
    assert taken.status_code == 202, taken.text
    assert taken.json()["topic"] == "product-news"
