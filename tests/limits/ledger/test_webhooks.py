"""The event stream posted to a real local HTTP server that takes, fails, answers 500, times out,
closes the connection and recovers: every event delivered in order, none lost, signatures
checked by the Standard Webhooks library, a repeat only with the same ids; retries with backoff,
a pause after 3 days of failures, resumed; filters; endpoints over REST and their bad input."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from limits.ledger.drain import ledger_drain_all
from limits.models.stream import WebhookDelivery, WebhookEndpoint
from limits.people.suppression import suppress
from limits.stream import webhooks
from limits.stream.events import stream_end
from limits.stream.webhooks import (
    GIVE_UP_AFTER,
    WebhookFields,
    WebhookInvalid,
    retry_in,
    webhook_change,
    webhook_create,
    webhook_deliver,
    webhooks_due,
)
from tests.support.api import call, make_user, token_session
from tests.support.clocks import instant
from worker.gate import gate_check

NOW = float(int(datetime.now(UTC).timestamp()))
State = WebhookEndpoint.State


@pytest.fixture
def snapshot(published):
    return published(vip=(10, [1, 2], {"email": (1, None)}))


def endpoint_for(receiver, **fields) -> WebhookEndpoint:
    ledger_drain_all()  # the stream's first drain: from here on
    endpoint = webhook_create(fields=WebhookFields(url=receiver.url, **fields), start="0")
    receiver.secret = endpoint.secret
    return endpoint


def decided(*messages: str, user: int = 9, channel: str = "email", campaign: str = "") -> None:
    gate_check(
        channel=channel, requests=[(user, m) for m in messages], campaign=campaign, now=instant(NOW)
    )
    ledger_drain_all()


def deliver(endpoint: WebhookEndpoint, *, at: datetime | None = None):
    return webhook_deliver(endpoint.pk, now=at or timezone.now())


@pytest.mark.postgres
def test_events_are_posted_signed_and_in_order(snapshot, receiver):
    endpoint = endpoint_for(receiver)
    decided("a", "b")
    suppress(channel="sms", user_ids=[9], reason="complained", source="test")
    decided("c")
    report = deliver(endpoint)
    assert (report.requests, report.events, report.failed) == (1, 4, False)
    (request,) = receiver.received
    assert request.verified  # by the Standard Webhooks library
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"].startswith(f"msg_{endpoint.pk}_")
    # In the order the drain took them: the change made between two gate calls drained together
    # follows both (each event's `at` says when it happened).
    assert [(e["type"], e.get("message_id")) for e in receiver.taken()] == [
        ("decision", "a"), ("decision", "b"), ("decision", "c"), ("suppression", None),
    ]  # fmt: skip
    endpoint.refresh_from_db()
    assert (endpoint.delivered, endpoint.position) == (4, str(stream_end()))
    assert deliver(endpoint).requests == 0  # caught up: nothing posted
    # A signature made with another secret is refused by the receiver.
    receiver.secret = webhooks.secret_new()
    decided("d")
    deliver(endpoint)
    assert not receiver.received[-1].verified


def test_batches_hold_at_most_a_thousand_events(snapshot, receiver, monkeypatch):
    monkeypatch.setattr(webhooks, "BATCH", 3)
    endpoint = endpoint_for(receiver)
    decided(*[f"m{k}" for k in range(8)])
    report = deliver(endpoint)
    assert report.requests == 3
    assert [len(r.body) > 0 for r in receiver.received] == [True] * 3
    assert [e["message_id"] for e in receiver.taken()] == [f"m{k}" for k in range(8)]
    assert webhooks.BATCH == 3 and webhooks.BATCH_MAX == 1000


def test_failures_are_retried_with_backoff_and_nothing_is_lost(snapshot, receiver, monkeypatch):
    monkeypatch.setattr(webhooks, "TIMEOUT", (2.0, 0.5))
    endpoint = endpoint_for(receiver)
    decided("a", "b")
    receiver.answers = [500, "hang", "close", 200]
    start = timezone.now()
    at = start
    for failures in (1, 2, 3):
        report = deliver(endpoint, at=at)
        assert report.failed and report.events == 0
        endpoint.refresh_from_db()
        assert endpoint.failures == failures
        assert endpoint.next_at == at + retry_in(failures)
        assert deliver(endpoint, at=at + retry_in(failures) - timedelta(seconds=1)) is None
        assert endpoint.pk not in webhooks_due(at)
        at += retry_in(failures)
    assert [r.answered for r in receiver.received] == [500, None, None]
    errors = list(WebhookDelivery.objects.order_by("id").values_list("status_code", "error"))
    assert errors[0] == (500, "HTTP 500: not now")
    assert "Timeout" in errors[1][1] and errors[2][0] is None
    decided("c")  # meanwhile
    report = deliver(endpoint, at=at)
    assert (report.failed, report.events) == (False, 3)
    assert [e["message_id"] for e in receiver.taken()] == ["a", "b", "c"]
    endpoint.refresh_from_db()
    assert (endpoint.failures, endpoint.failing_since, endpoint.next_at) == (0, None, None)
    assert retry_in(1) == timedelta(seconds=5) and retry_in(30) == timedelta(hours=1)


def test_a_batch_posted_again_has_the_same_ids(snapshot, receiver, monkeypatch):
    endpoint = endpoint_for(receiver)
    decided("a", "b")
    # Taken by the receiver, but the run died before it moved the position on.
    monkeypatch.setattr(webhooks, "_saved", lambda *a, **k: None)
    deliver(endpoint)
    monkeypatch.undo()
    deliver(endpoint)
    first, second = receiver.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.body == second.body
    ids = [e["id"] for e in receiver.taken()]
    assert len(ids) == 4 and len(set(ids)) == 2


def test_an_endpoint_failing_for_three_days_is_paused_until_resumed(snapshot, receiver):
    endpoint = endpoint_for(receiver)
    decided("a")
    receiver.default = 503
    at = timezone.now()
    for _ in range(200):
        report = deliver(endpoint, at=at)
        assert report is not None and report.failed
        endpoint.refresh_from_db()
        if endpoint.state != State.ACTIVE:
            break
        assert endpoint.next_at is not None
        at = endpoint.next_at
    assert endpoint.state == State.FAILING and endpoint.failing_since is not None
    assert at - endpoint.failing_since >= GIVE_UP_AFTER
    assert at - endpoint.failing_since < GIVE_UP_AFTER + timedelta(hours=1)
    assert deliver(endpoint, at=at + timedelta(days=1)) is None  # paused: not tried
    assert endpoint.pk not in webhooks_due(at + timedelta(days=1))
    assert len(receiver.received) < 100  # backoff: about 80 tries in 3 days
    receiver.default = 200
    webhook_change(endpoint, active=True)
    report = deliver(endpoint, at=at + timedelta(days=1))
    assert report.events == 1
    assert [e["message_id"] for e in receiver.taken()] == ["a"]


@pytest.mark.postgres
def test_filters_choose_what_an_endpoint_gets(snapshot, receiver):
    endpoint = endpoint_for(receiver, channels=("push",), types=("decision",))
    decided("e1")
    decided("p1", channel="push")
    suppress(channel="push", user_ids=[9], reason="unsubscribed", source="test")
    decided("p2", channel="push", user=2)
    deliver(endpoint)
    assert [e["message_id"] for e in receiver.taken()] == ["p1", "p2"]
    # Nothing more it wants: the position still moves past what the filters drop.
    decided("e2")
    assert deliver(endpoint).requests == 0
    endpoint.refresh_from_db()
    assert endpoint.position == str(stream_end())


def test_a_paused_endpoint_gets_nothing_and_resumes_where_it_was(snapshot, receiver):
    endpoint = endpoint_for(receiver)
    webhook_change(endpoint, active=False)
    decided("a")
    assert deliver(endpoint) is None and not receiver.received
    webhook_change(endpoint, active=True)
    deliver(endpoint)
    assert [e["message_id"] for e in receiver.taken()] == ["a"]


def test_one_run_per_endpoint_at_a_time(snapshot, receiver):
    endpoint = endpoint_for(receiver)
    decided("a")
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        lease_until=timezone.now() + timedelta(seconds=30)
    )
    assert deliver(endpoint) is None
    assert deliver(endpoint, at=timezone.now() + timedelta(seconds=31)).events == 1


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"url": "ftp://example.com/x"}, "url", "not an http or https URL"),
        ({"url": "https:///nohost"}, "url", "not an http or https URL"),
        ({"types": ("click",)}, "types", "not an event type"),
        ({"channels": ("fax",)}, "channels", "fax"),
        ({"channels": ("email", "email")}, "channels", "Each once"),
        ({"campaigns": ("c" * 201,)}, "campaigns", "200 characters"),
    ],
)
def test_bad_fields_are_named_and_nothing_is_made(db, fields, field, words):
    with pytest.raises(WebhookInvalid) as caught:
        webhook_create(fields=WebhookFields(**{"url": "https://example.com/h", **fields}))
    assert words in caught.value.problems[field][0]
    assert not WebhookEndpoint.objects.exists()


def test_endpoints_over_rest(snapshot, receiver, live_server):
    admin = token_session(
        live_server.url,
        make_user(
            "ops", "limits.view_webhookendpoint", "limits.add_webhookendpoint",
            "limits.change_webhookendpoint", "limits.delete_webhookendpoint",
        ),
    )  # fmt: skip
    ledger_drain_all()
    bad = call(admin, "POST", "/api/v1/webhooks/", json={"url": receiver.url, "start": "x"})
    assert bad.status_code == 400 and "start" in bad.json()
    bad = call(admin, "POST", "/api/v1/webhooks/", json={"url": "mailto:a@b.c"})
    assert bad.status_code == 400 and "url" in bad.json()
    assert not WebhookEndpoint.objects.exists()
    made = call(
        admin, "POST", "/api/v1/webhooks/",
        json={"url": receiver.url, "description": "warehouse", "types": ["decision"]},
    )  # fmt: skip
    assert made.status_code == 201, made.text
    shown = made.json()
    assert shown["secret"].startswith("whsec_") and shown["state"] == "active"
    assert shown["position"] == str(stream_end())  # `end` by default: only what comes next
    receiver.secret = shown["secret"]
    decided("a")
    deliver(WebhookEndpoint.objects.get(pk=shown["id"]))
    detail = call(admin, "GET", f"/api/v1/webhooks/{shown['id']}/").json()
    assert detail["delivered"] == 1 and detail["deliveries"][0]["ok"] is True
    changed = call(
        admin, "PATCH", f"/api/v1/webhooks/{shown['id']}/",
        json={"active": False, "new_secret": True, "channels": ["push"]},
    ).json()  # fmt: skip
    assert changed["state"] == "paused" and changed["channels"] == ["push"]
    assert changed["secret"] != shown["secret"]
    bad = call(admin, "PATCH", f"/api/v1/webhooks/{shown['id']}/", json={"types": ["x"]})
    assert bad.status_code == 400 and "types[0]" in bad.json()
    assert call(admin, "GET", "/api/v1/webhooks/").json()[0]["channels"] == ["push"]
    assert call(admin, "DELETE", f"/api/v1/webhooks/{shown['id']}/").status_code == 204
    assert call(admin, "GET", f"/api/v1/webhooks/{shown['id']}/").status_code == 404


def test_beat_queues_a_run_for_each_endpoint_due_and_a_run_delivers(snapshot, receiver):
    from limits.tasks import webhook_run, webhooks_deliver_due
    from tests.support import broker

    endpoint = endpoint_for(receiver)
    resting = webhook_create(fields=WebhookFields(url=receiver.url))
    webhook_change(resting, active=False)
    assert webhooks_deliver_due() == 1
    assert broker.queued("sends") == [("limits.tasks.webhook_run", [endpoint.pk])]
    decided("a")
    assert webhook_run(endpoint.pk) == 1
    assert [e["message_id"] for e in receiver.taken()] == ["a"]
