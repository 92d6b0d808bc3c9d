"""SMS as a channel like the others: send jobs of phone numbers checked when they are created and
run by the worker through Twilio (the real twilio Client against the local fake), Twilio's STOP
and START replies on the sms suppression list, and caps, rules and quiet hours on sms."""

from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.authtoken.models import Token

from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
from limits.engine.quiet import QuietFields
from limits.models.people import Suppression, SuppressionChange
from limits.people.suppression import suppress, unsuppress
from limits.policy.services import QUIET_HOURS
from tests.fakes.twilio import FakeTwilio, inbound_message, signed
from tests.support.api import make_user
from tests.support.clocks import Clock, throttles_on
from tests.support.sends import make_rule
from worker.chunks import send_chunk_run
from worker.delivery.registry import dispatcher_for
from worker.delivery.sms_numbers import sms_numbers_record, sms_users_of
from worker.delivery.twilio_inbound import OPTED_OUT_SOURCE, STOP_SOURCE
from worker.gate import gate_check
from worker.models import DeadAddress, SendChunk, SendJob, SmsNumber
from worker.services import send_job_create

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://gatekeeper.example.com"
INBOUND = "/twilio/inbound/"
NOW = datetime(2026, 6, 10, 12, 0, tzinfo=UTC)


def number(user_id: int) -> str:
    return f"+1415555{user_id:04d}"


def sms_job(users: range | list[int], **given: Any) -> SendJob:
    fields = {"channel": "sms", "campaign": "spring", "template": "offer", **given}
    return send_job_create(
        recipients=[
            {"user_id": u, "address": number(u), "context": {"text": f"Hi {u}, rides 10% off."}}
            for u in users
        ],
        queue=False,
        **fields,
    )


def run_job(job: SendJob, on_commit: Any) -> None:
    """Run every chunk of `job` through the sms dispatcher the settings name; `on_commit` is
    pytest-django's django_capture_on_commit_callbacks (the test's transaction never commits,
    and a suppression reaches the gate's list on commit)."""
    dispatcher = dispatcher_for("sms")  # what a chunk run builds from the settings
    try:
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            with on_commit(execute=True):
                send_chunk_run(chunk_id=chunk.pk, dispatcher=dispatcher)
    finally:
        dispatcher.close()
    job.refresh_from_db()


def sms_suppressed() -> dict[int, str]:
    """The sms suppression list: user id -> source."""
    return dict(Suppression.objects.filter(channel="sms").values_list("user_id", "source"))


@pytest.fixture
def rated(settings, monkeypatch) -> Clock:
    """Twilio held to a rate by the workers' throttle, on a clock of the test's: a 429's pause
    passes on it instead of in real time."""
    clock = Clock()
    settings.GATEKEEPER_PROVIDER_RATES = "twilio=1000"
    throttles_on(clock, settings, monkeypatch)
    return clock


# --- send jobs through the worker ---------------------------------------------------------------


def test_an_sms_job_through_the_worker_on_twilio(
    published, twilio_settings, rated, django_capture_on_commit_callbacks
):
    published(vip=(10, list(range(1, 30)), {"sms": (None, None)}))
    dead, opted_out, throttled = number(3), number(5), number(8)
    twilio_settings.answer(dead, 21211)
    twilio_settings.answer(opted_out, 21610)
    twilio_settings.answer(throttled, 20429, times=1, retry_after="2")
    job = sms_job(range(1, 13))

    run_job(job, django_capture_on_commit_callbacks)

    assert (job.status, job.sent, job.failed, job.ambiguous, job.capped) == ("done", 10, 2, 0, 0)
    assert job.sent + job.failed + job.capped + job.ambiguous == job.total == 12
    # Each went once, with its own text; the refused one after every worker's pause.
    sent = sorted(m.to for m in twilio_settings.sent)
    assert sent == sorted(number(u) for u in range(1, 13) if u not in (3, 5))
    assert (
        twilio_settings.sent_to(number(1))[0].body == "Hi 1, rides 10% off. Reply STOP to opt out."
    )
    assert len([r for r in twilio_settings.requests if r.value("To") == throttled]) == 2
    assert sum(rated.waits) >= 2.0  # every worker held off Twilio as long as it asked
    # The dead number is reported to the caller; the person who said STOP is suppressed.
    assert list(DeadAddress.objects.values_list("user_id", "address")) == [(3, dead)]
    assert sms_suppressed() == {5: OPTED_OUT_SOURCE}
    assert Suppression.objects.get(channel="sms", user_id=5).reason == "unsubscribed"
    # The numbers texted are known for their replies: not the two that went nowhere.
    assert sorted(SmsNumber.objects.values_list("user_id", flat=True)) == [
        u for u in range(1, 13) if u not in (3, 5)
    ]

    # The next campaign does not text them again: the gate refuses the suppressed one.
    again = sms_job([4, 5], campaign="summer")
    run_job(again, django_capture_on_commit_callbacks)
    assert (again.sent, again.capped, again.reasons["suppressed"]) == (1, 1, 1)
    assert len([r for r in twilio_settings.requests if r.value("To") == opted_out]) == 1


def test_sms_numbers_are_checked_as_e164_when_a_job_is_created(db, client):
    for bad in ("07700 900123", "447700900123", "+44 7700 900123", "+0447700900123", "+4"):
        with pytest.raises(ValidationError) as caught:
            send_job_create(
                channel="sms",
                campaign="spring",
                template="welcome",
                recipients=[
                    {"user_id": 1, "address": "+447700900123"},
                    {"user_id": 2, "address": bad},
                ],
                queue=False,
            )
        [message] = caught.value.message_dict["recipients[1].address"]
        assert "E.164" in message and bad[:20] in message
    assert not SendJob.objects.exists()

    # Over REST: the same rule, a 400 naming the row.
    service = make_user("campaigns", *CAMPAIGN_SYSTEM)
    token, _ = Token.objects.get_or_create(user=service)
    body: dict[str, Any] = {
        "channel": "sms",
        "campaign": "spring",
        "template": "welcome",
        "recipients": [
            {"user_id": 1, "address": "+447700900123"},
            {"user_id": 2, "address": "(415) 555-0102"},
        ],
    }
    refused = client.post(
        "/api/v1/sends/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert refused.status_code == 400
    assert "E.164" in refused.json()["recipients[1].address"][0]
    body["recipients"][1]["address"] = "+14155550102"
    taken = client.post(
        "/api/v1/sends/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert taken.status_code == 202 and taken.json()["total"] == 2


@pytest.mark.postgres
def test_the_numbers_texted_are_kept_per_user_and_their_last_text(db):
    earlier = datetime(2026, 6, 1, tzinfo=UTC)
    later = datetime(2026, 6, 2, tzinfo=UTC)
    shared = number(1)
    sms_numbers_record(sends=[(1, shared), (2, shared), (1, shared), (3, number(3))], at=earlier)
    sms_numbers_record(sends=[(2, shared)], at=later)

    assert sms_users_of(shared) == [1, 2]
    assert sms_users_of(number(9)) == []
    assert SmsNumber.objects.get(number=shared, user_id=2).last_sent_at == later
    assert SmsNumber.objects.get(number=shared, user_id=1).last_sent_at == earlier
    assert SmsNumber.objects.count() == 3


# --- replies: STOP and START ----------------------------------------------------------------------


@pytest.fixture
def replies(twilio_settings, settings):
    """Numbers texted: user 1 and 2 share a phone, user 3 has their own."""
    settings.GATEKEEPER_PUBLIC_URL = PUBLIC_URL
    sent = datetime(2026, 6, 1, tzinfo=UTC)
    sms_numbers_record(sends=[(1, number(1)), (2, number(1)), (3, number(3))], at=sent)
    return twilio_settings


def reply(from_: str, body: str, *, url: str = PUBLIC_URL + INBOUND, **options: Any):
    return inbound_message(
        url,
        auth_token=FakeTwilio.auth_token,
        account_sid=FakeTwilio.account_sid,
        from_=from_,
        to=FakeTwilio.sender,
        body=body,
        **options,
    )


def post(client, hook, *, signature: str | None = None):
    headers = {} if signature == "" else {"HTTP_X_TWILIO_SIGNATURE": signature or hook.signature}
    return client.post(
        INBOUND, hook.body, content_type="application/x-www-form-urlencoded", **headers
    )


def test_a_signed_stop_suppresses_every_user_texted_at_that_number(client, replies, published):
    published(vip=(10, [1, 2, 3], {}))
    answer = post(client, reply(number(1), " stop "))

    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/xml"
    assert answer.content.decode().endswith("<Response/>")
    assert sms_suppressed() == {1: STOP_SOURCE, 2: STOP_SOURCE}
    assert set(Suppression.objects.values_list("reason", flat=True)) == {"unsubscribed"}
    # The gate refuses their marketing texts from now on, and only on sms.
    decisions = gate_check(channel="sms", requests=[(1, "a"), (3, "b")])
    assert [d.reason for d in decisions] == ["suppressed", "allowed"]
    assert gate_check(channel="email", requests=[(1, "c")])[0].reason == "allowed"


def test_every_opt_out_keyword_and_twilios_opt_out_type_suppress_and_other_words_do_not(
    client, replies
):
    for body in ("Stop please", "HELP", "stop!", "Thanks"):
        assert post(client, reply(number(3), body)).status_code == 200
    assert sms_suppressed() == {}
    # A Messaging Service with Advanced Opt-Out says it was an opt-out, in a keyword of its own.
    service = FakeTwilio.messaging_service_sid
    custom = reply(number(3), "ARRET", messaging_service_sid=service)
    custom.params["OptOutType"] = "STOP"
    hook = signed(custom.url, custom.params, auth_token=FakeTwilio.auth_token)
    assert post(client, hook).status_code == 200
    assert sms_suppressed() == {3: STOP_SOURCE}
    for word in ("STOPALL", "unsubscribe", "Cancel", "END", "quit", "REVOKE", "optout"):
        unsuppress(channel="sms", user_ids=[3], source="test")
        post(client, reply(number(3), word))
        assert sms_suppressed() == {3: STOP_SOURCE}, word


def test_a_post_not_signed_by_twilio_for_the_public_url_is_refused(client, replies, settings):
    stop = reply(number(1), "STOP")
    assert post(client, stop, signature="").status_code == 403
    assert post(client, stop, signature="bm90IGEgc2lnbmF0dXJl").status_code == 403
    tampered = reply(number(1), "STOP")
    tampered.params["From"] = number(3)
    assert post(client, tampered, signature=stop.signature).status_code == 403
    # Signed for the address this server saw (the Host header, plain HTTP): not Twilio's.
    assert (
        post(client, reply(number(1), "STOP", url="http://testserver" + INBOUND)).status_code == 403
    )
    # Signed with another account's token.
    other = inbound_message(
        PUBLIC_URL + INBOUND,
        auth_token="another-token",
        account_sid=FakeTwilio.account_sid,
        from_=number(1),
        to=FakeTwilio.sender,
        body="STOP",
    )
    assert post(client, other).status_code == 403
    # No Auth Token configured: nothing can be checked, everything is refused.
    settings.GATEKEEPER_TWILIO_AUTH_TOKEN = ""
    assert post(client, stop).status_code == 403
    assert sms_suppressed() == {}
    assert client.get(INBOUND).status_code == 405


def test_a_stop_from_a_number_nobody_was_texted_at_suppresses_nobody(client, replies, caplog):
    answer = post(client, reply(number(42), "STOP"))
    assert answer.status_code == 200 and sms_suppressed() == {}
    assert "from a number nobody was texted at" in caplog.text


def test_a_stop_posted_again_changes_nothing(client, replies):
    stop = reply(number(3), "STOP")
    assert post(client, stop).status_code == 200
    assert post(client, stop).status_code == 200  # Twilio's retry of the same post

    assert sms_suppressed() == {3: STOP_SOURCE}
    assert SuppressionChange.objects.filter(channel="sms", user_id=3).count() == 1


def test_start_lifts_only_what_a_stop_or_twilio_put_there(client, replies):
    post(client, reply(number(1), "STOP"))  # users 1 and 2
    suppress(channel="sms", user_ids=[3], reason="unsubscribed", source=OPTED_OUT_SOURCE)
    assert sms_suppressed() == {1: STOP_SOURCE, 2: STOP_SOURCE, 3: OPTED_OUT_SOURCE}

    assert post(client, reply(number(1), "Start")).status_code == 200
    assert post(client, reply(number(3), "unstop")).status_code == 200
    assert sms_suppressed() == {}

    # A marketer's own entry stays, whatever the person texts.
    suppress(channel="sms", user_ids=[3], reason="unsubscribed", source="admin")
    post(client, reply(number(3), "YES"))
    assert sms_suppressed() == {3: "admin"}
    # Twilio's Advanced Opt-Out names the opt-in itself.
    post(client, reply(number(1), "STOP"))
    post(client, reply(number(1), "START", messaging_service_sid="MG1", advanced_opt_out=True))
    assert sms_suppressed() == {3: "admin"}


# --- caps, rules and quiet hours on sms ----------------------------------------------------------


def test_caps_rules_and_quiet_hours_govern_sms_as_every_channel(
    published, django_capture_on_commit_callbacks
):
    published(vip=(10, [1, 2, 3], {"all": (1, None)}), dormant=(20, [4], {}))
    texts = gate_check(channel="sms", requests=[(1, "t1"), (1, "t2")], now=NOW)
    assert [d.reason for d in texts] == ["allowed", "daily_cap"]  # the `all` cap counts texts
    # ... and the text counts against every other channel's share of it.
    assert gate_check(channel="email", requests=[(1, "e1")], now=NOW)[0].reason == "daily_cap"

    # The rules' cache is dropped on commit: the test's transaction never commits.
    with django_capture_on_commit_callbacks(execute=True):
        rule = make_rule("No texts for dormant users", segment="dormant", channel="sms", limit=0)
    blocked = gate_check(channel="sms", requests=[(4, "t3")], now=NOW)[0]
    assert blocked.reason == "blocked" and blocked.rule is not None
    assert blocked.rule["id"] == rule.pk
    assert gate_check(channel="push", requests=[(4, "p1")], now=NOW)[0].reason == "allowed"

    with django_capture_on_commit_callbacks(execute=True):
        QUIET_HOURS.create(
            fields=QuietFields(
                segment=None, channel="sms", start="11:00", end="13:00", spread_minutes=0
            ),
            via="command",
        )
    quiet = gate_check(channel="sms", requests=[(2, "t4")], now=NOW)[0]  # 12:00 UTC
    assert (quiet.reason, quiet.retry_after) == ("quiet_hours", pytest.approx(3600))
    assert gate_check(channel="email", requests=[(3, "e2")], now=NOW)[0].reason == "allowed"
