"""Twilio's Messages API on the wire: twilio-python's real Client (its request building, basic
auth, form encoding, answer and error parsing) against the local fake over TLS
(tests/fakes/twilio.py), and Twilio's signed webhooks checked by twilio-python's own
RequestValidator. What each answer is worth to the worker: worker/delivery/twilio.py and
docs/worker.md ("SMS through Twilio")."""

import http.client

import pytest
import requests
import urllib3
from twilio.base.exceptions import TwilioRestException
from twilio.request_validator import RequestValidator

from bench.servers import free_port
from tests.fakes.twilio import (
    BAD_GATEWAY,
    DROP,
    HANG,
    LOST,
    MAGIC_TO,
    FakeTwilio,
    inbound_message,
    opt_out_type,
    signed,
    status_callback,
)
from tests.support.sms import TIMEOUT, twilio_client

ALICE, BOB = "+14155550101", "+14155550102"
WEBHOOK_URL = "https://gatekeeper.example.com/sms/twilio/inbound"


def send(client, to: str, body: str = "Spring sale: 20% off. Reply STOP to opt out.", **kw):
    return client.messages.create(to=to, from_=FakeTwilio.sender, body=body, **kw)


def refusal(client, to: str) -> TwilioRestException:
    with pytest.raises(TwilioRestException) as caught:
        send(client, to)
    return caught.value


# --- sends ------------------------------------------------------------------------------------


def test_a_send_is_taken_and_answered_with_its_sid(twilio, twilio_api):
    client, _ = twilio_api
    callback = "https://gatekeeper.example.com/sms/twilio/status"
    message = send(client, ALICE, "Hello Alice", status_callback=callback)

    assert message.sid.startswith("SM") and len(message.sid) == 34
    assert (message.status, message.to, message.from_) == ("queued", ALICE, FakeTwilio.sender)
    assert message.date_created is not None  # Twilio's RFC 2822 date, read
    [sent] = twilio.sent
    assert (sent.sid, sent.to, sent.body, sent.status_callback) == (
        message.sid,
        ALICE,
        "Hello Alice",
        callback,
    )
    # What went over the wire: Twilio's path, a form with Twilio's field names, basic auth.
    [request] = twilio.requests
    assert request.path == f"/2010-04-01/Accounts/{twilio.account_sid}/Messages.json"
    assert request.form == {
        "To": [ALICE],
        "From": [FakeTwilio.sender],
        "Body": ["Hello Alice"],
        "StatusCallback": [callback],
    }
    assert request.username == twilio.account_sid
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.headers["user-agent"].startswith("twilio-python/9.13.0")


def test_a_messaging_service_send_is_accepted_without_a_sender_yet(twilio, twilio_api):
    client, _ = twilio_api
    message = client.messages.create(
        to=ALICE, messaging_service_sid=FakeTwilio.messaging_service_sid, body="Hi"
    )

    assert (message.status, message.from_, message.num_segments) == ("accepted", None, "0")
    assert twilio.requests[0].form["MessagingServiceSid"] == [FakeTwilio.messaging_service_sid]
    assert "From" not in twilio.requests[0].form


def test_an_api_key_authenticates_for_its_account(twilio, local_tls):
    client, _ = twilio_client(
        twilio.url,
        username=twilio.api_key_sid,
        password=twilio.api_key_secret,
        account_sid=twilio.account_sid,
        ca_bundle=str(local_tls.ca_bundle),
    )
    assert send(client, ALICE).status == "queued"
    assert twilio.requests[0].username == twilio.api_key_sid


def test_wrong_credentials_are_refused_with_20003(twilio, local_tls):
    client, _ = twilio_client(
        twilio.url,
        username=twilio.account_sid,
        password="not-the-token",
        ca_bundle=str(local_tls.ca_bundle),
    )
    error = refusal(client, ALICE)
    assert (error.status, error.code) == (401, 20003)
    assert twilio.sent == []


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (21211, "is not a valid phone number"),
        (21408, "Permission to send an SMS has not been enabled"),
        (21610, "unsubscribed recipient"),
        (21612, "combination of 'To'"),
        (21614, "not a valid mobile number"),
        (21635, "landline"),
    ],
)
def test_a_refused_number_is_a_rest_exception_with_twilios_code(twilio, twilio_api, code, words):
    client, _ = twilio_api
    twilio.answer(BOB, code)

    error = refusal(client, BOB)

    assert (error.status, error.code) == (400, code)
    assert words in error.msg and error.msg.startswith("Unable to create record: ")
    assert twilio.sent == []
    # The other numbers still go.
    assert send(client, ALICE).status == "queued"


def test_twilios_magic_test_numbers_are_answered_as_twilio_answers_them(twilio, twilio_api):
    client, _ = twilio_api
    codes = {to: refusal(client, to).code for to in MAGIC_TO}
    assert codes == MAGIC_TO
    assert twilio.sent == []


def test_the_fake_checks_the_form_as_twilio_does(twilio, twilio_api):
    client, _ = twilio_api
    assert refusal(client, "5551234567").code == 21211  # not E.164
    assert refusal(client, "+0123456789").code == 21211  # no country code starts with 0
    assert refusal(client, "+4").code == 21211  # a country code alone
    assert refusal(client, "+1234567890123456").code == 21211  # 16 digits
    with pytest.raises(TwilioRestException) as too_long:
        send(client, ALICE, "x" * 1601)
    assert too_long.value.code == 21617
    with pytest.raises(TwilioRestException) as no_body:
        client.messages.create(to=ALICE, from_=FakeTwilio.sender)
    assert no_body.value.code == 21602
    with pytest.raises(TwilioRestException) as not_ours:
        client.messages.create(to=ALICE, from_="+15005550001", body="Hi")
    assert not_ours.value.code == 21606
    assert twilio.sent == []
    assert send(client, ALICE, "x" * 1600).status == "queued"


def test_429_is_20429_and_its_retry_after_is_read_from_the_answer(twilio, twilio_api):
    client, last = twilio_api
    twilio.answer(BOB, 20429, times=1, retry_after="7")

    error = refusal(client, BOB)

    assert (error.status, error.code) == (429, 20429)
    # TwilioRestException has no headers: the response hook kept them.
    assert last.headers["Retry-After"] == "7"
    assert twilio.sent == []
    # Answered once: the client did not retry by itself, and the next send goes.
    assert len(twilio.requests) == 1
    assert send(client, BOB).status == "queued"
    assert "Retry-After" not in last.headers


@pytest.mark.parametrize(("code", "status"), [(20500, 500), (20503, 503)])
def test_server_errors_are_rest_exceptions_and_never_retried_by_the_client(
    twilio, twilio_api, code, status
):
    client, _ = twilio_api
    twilio.answer(BOB, code)

    error = refusal(client, BOB)

    assert (error.status, error.code) == (status, code)
    assert len(twilio.requests) == 1


def test_a_proxys_non_json_answer_is_a_rest_exception_with_the_http_status(twilio, twilio_api):
    client, _ = twilio_api
    twilio.answer(BOB, BAD_GATEWAY)

    error = refusal(client, BOB)

    assert (error.status, error.code, error.msg) == (502, 502, "Unable to create record")
    assert len(twilio.requests) == 1


# --- no answer --------------------------------------------------------------------------------


def test_a_hang_is_a_read_timeout_after_the_request_went_out(twilio, twilio_api):
    client, _ = twilio_api
    twilio.answer(BOB, HANG)

    with pytest.raises(requests.exceptions.ReadTimeout):
        send(client, BOB)

    assert len(twilio.requests) == 1  # Twilio had it; here nothing was sent


def test_a_lost_answer_looks_like_a_hang_but_the_message_went_out(twilio, twilio_api):
    client, _ = twilio_api
    twilio.answer(BOB, LOST)

    with pytest.raises(requests.exceptions.ReadTimeout):
        send(client, BOB)

    assert [m.to for m in twilio.sent] == [BOB]  # why a read timeout is ambiguous


def test_a_dropped_connection_is_a_connection_error_after_the_request_went_out(twilio, twilio_api):
    client, _ = twilio_api
    twilio.answer(BOB, DROP)

    with pytest.raises(requests.exceptions.ConnectionError) as caught:
        send(client, BOB)

    assert not isinstance(caught.value, requests.exceptions.ConnectTimeout)
    reason = caught.value.args[0]
    assert isinstance(reason, urllib3.exceptions.ProtocolError)
    assert isinstance(reason.args[1], http.client.RemoteDisconnected)
    assert len(twilio.requests) == 1  # read by Twilio, not sent again by the client


def test_a_refused_connection_says_nothing_was_sent(twilio, local_tls):
    port = free_port()  # nothing listens there
    client, _ = twilio_client(
        f"https://127.0.0.1:{port}",
        username=twilio.account_sid,
        password=twilio.auth_token,
        ca_bundle=str(local_tls.ca_bundle),
    )
    with pytest.raises(requests.exceptions.ConnectionError) as caught:
        send(client, ALICE)

    reason = caught.value.args[0]
    assert isinstance(reason, urllib3.exceptions.MaxRetryError)
    assert isinstance(reason.reason, urllib3.exceptions.NewConnectionError)


def test_the_fakes_certificate_is_trusted_only_through_the_ca_bundle(twilio, local_tls):
    client, _ = twilio_client(
        twilio.url, username=twilio.account_sid, password=twilio.auth_token, ca_bundle=None
    )
    with pytest.raises(requests.exceptions.SSLError):
        send(client, ALICE)
    assert twilio.requests == []


def test_twilio_variables_in_the_environment_do_not_move_the_client(twilio, local_tls, monkeypatch):
    monkeypatch.setenv("TWILIO_REGION", "ie1")
    monkeypatch.setenv("TWILIO_EDGE", "dublin")
    client, _ = twilio_client(
        twilio.url,
        username=twilio.account_sid,
        password=twilio.auth_token,
        ca_bundle=str(local_tls.ca_bundle),
    )
    assert send(client, ALICE).status == "queued"


def test_timeouts_are_one_number_for_connect_and_read(twilio_api):
    client, _ = twilio_api
    assert client.http_client.timeout == TIMEOUT


# --- webhooks ---------------------------------------------------------------------------------


def test_a_stop_reply_is_signed_as_twilio_signs_it(twilio):
    hook = inbound_message(
        WEBHOOK_URL,
        auth_token=twilio.auth_token,
        account_sid=twilio.account_sid,
        from_=ALICE,
        to=FakeTwilio.sender,
        body="STOP",
        messaging_service_sid=FakeTwilio.messaging_service_sid,
        advanced_opt_out=True,
    )
    validator = RequestValidator(twilio.auth_token)

    assert validator.validate(hook.url, hook.params, hook.signature)
    assert hook.params["OptOutType"] == "STOP"
    assert (hook.params["From"], hook.params["To"], hook.params["Body"]) == (
        ALICE,
        FakeTwilio.sender,
        "STOP",
    )
    assert hook.params["MessageSid"].startswith("SM")
    assert hook.headers["I-Twilio-Idempotency-Token"]
    assert hook.body.decode().count("&") == len(hook.params) - 1

    tampered = {**hook.params, "From": BOB}
    assert not validator.validate(hook.url, tampered, hook.signature)
    assert not validator.validate(WEBHOOK_URL + "?x=1", hook.params, hook.signature)
    assert not RequestValidator("another-token").validate(hook.url, hook.params, hook.signature)


def test_opt_out_type_is_only_for_a_whole_keyword_and_only_with_advanced_opt_out(twilio):
    assert [opt_out_type(b) for b in ("stop", " Unsubscribe ", "START", "unstop", "help")] == [
        "STOP",
        "STOP",
        "START",
        "START",
        "HELP",
    ]
    assert opt_out_type("Stop please") is None
    plain = inbound_message(
        WEBHOOK_URL,
        auth_token=twilio.auth_token,
        account_sid=twilio.account_sid,
        from_=ALICE,
        to=FakeTwilio.sender,
        body="STOP",
    )
    assert "OptOutType" not in plain.params
    assert RequestValidator(twilio.auth_token).validate(plain.url, plain.params, plain.signature)


def test_a_status_callback_is_signed_for_the_url_the_send_named(twilio, twilio_api):
    client, _ = twilio_api
    send(client, ALICE, status_callback="https://gatekeeper.example.com/sms/twilio/status?j=4")
    hook = status_callback(
        twilio.sent[0],
        auth_token=twilio.auth_token,
        account_sid=twilio.account_sid,
        status="undelivered",
        error_code=30005,
    )

    assert hook.url == "https://gatekeeper.example.com/sms/twilio/status?j=4"
    assert (hook.params["MessageStatus"], hook.params["ErrorCode"]) == ("undelivered", "30005")
    assert RequestValidator(twilio.auth_token).validate(hook.url, hook.params, hook.signature)


def test_the_signature_is_twilios_documented_algorithm():
    # HMAC-SHA1 over the URL then each parameter's name and value sorted by name, base64.
    import base64
    import hashlib
    import hmac

    hook = signed(WEBHOOK_URL, {"Body": "STOP", "From": ALICE, "AccountSid": "AC1"}, auth_token="t")
    text = WEBHOOK_URL + "AccountSid" + "AC1" + "Body" + "STOP" + "From" + ALICE
    expected = base64.b64encode(hmac.new(b"t", text.encode(), hashlib.sha1).digest()).decode()
    assert hook.signature == expected
