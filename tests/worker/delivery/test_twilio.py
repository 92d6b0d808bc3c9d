"""TwilioDispatcher: twilio-python's real Client against the local Twilio fake over TLS, and what
each of Twilio's answers is worth to the worker (worker/delivery/twilio.py's table)."""

import logging
from contextlib import closing

import pytest

from bench.servers import free_port
from tests.fakes.twilio import BAD_GATEWAY, DROP, GARBLED, HANG, LOST, FakeTwilio
from worker.delivery.base import AMBIGUOUS, PERMANENT, THROTTLED, TRANSIENT, DispatchError, Message
from worker.delivery.registry import dispatcher_class, dispatchers_check
from worker.delivery.twilio import TwilioDispatcher

ALICE, BOB = "+14155550101", "+14155550102"


def text(n: int, to: str, body: str = "Spring sale: 20% off. Reply STOP to opt out.\n") -> Message:
    return Message(message_id=f"spring:{n}", user_id=n, address=to, subject="", body=body)


def outcome(error: DispatchError | None) -> tuple[str, bool, bool, float | None] | None:
    """What the worker reads of an outcome: (kind, invalid, opted_out, retry_after)."""
    if error is None:
        return None
    return (error.kind, error.invalid, error.opted_out, error.retry_after)


@pytest.fixture
def dispatcher(twilio_settings):
    sender = TwilioDispatcher()
    yield sender
    sender.close()


def test_a_text_goes_to_twilio_from_the_accounts_number(twilio, dispatcher):
    assert dispatcher.send_many([text(1, ALICE)]) == [None]

    [request] = twilio.requests
    assert request.path == f"/2010-04-01/Accounts/{twilio.account_sid}/Messages.json"
    assert request.username == twilio.account_sid
    # The body as rendered, without the template file's last line break (a character billed).
    assert request.form == {
        "To": [ALICE],
        "From": [FakeTwilio.sender],
        "Body": ["Spring sale: 20% off. Reply STOP to opt out."],
    }
    assert request.headers["user-agent"].startswith("twilio-python/")


def test_a_messaging_service_an_api_key_and_a_validity_period_are_sent_as_twilio_wants(
    twilio, twilio_settings, settings
):
    settings.GATEKEEPER_TWILIO_FROM = ""
    settings.GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID = FakeTwilio.messaging_service_sid
    settings.GATEKEEPER_TWILIO_API_KEY_SID = FakeTwilio.api_key_sid
    settings.GATEKEEPER_TWILIO_API_KEY_SECRET = FakeTwilio.api_key_secret
    settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS = 600
    with closing(TwilioDispatcher()) as sender:
        assert sender.send_many([text(1, ALICE)]) == [None]

    [request] = twilio.requests
    assert request.username == FakeTwilio.api_key_sid
    assert request.form["MessagingServiceSid"] == [FakeTwilio.messaging_service_sid]
    assert request.form["ValidityPeriod"] == ["600"]
    assert "From" not in request.form
    assert twilio.sent[0].status == "accepted"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (21211, (PERMANENT, True, False, None)),  # not a valid number
        (21614, (PERMANENT, True, False, None)),  # not a mobile
        (21635, (PERMANENT, True, False, None)),  # a landline
        (21610, (PERMANENT, False, True, None)),  # replied STOP
        (21408, (PERMANENT, False, False, None)),  # the account may not text that country
        (21612, (PERMANENT, False, False, None)),  # no route from our sender
        (20503, (TRANSIENT, False, False, None)),  # Twilio: try again with back-off
        (20500, (AMBIGUOUS, False, False, None)),  # Twilio: a retry may text twice
        (BAD_GATEWAY, (AMBIGUOUS, False, False, None)),  # a proxy's 502 page
        (HANG, (AMBIGUOUS, False, False, None)),  # read timeout after the request went out
        (LOST, (AMBIGUOUS, False, False, None)),  # taken, answer lost
        (DROP, (AMBIGUOUS, False, False, None)),  # connection closed after the request
        (GARBLED, (AMBIGUOUS, False, False, None)),  # 201 whose body is not JSON
    ],
)
def test_each_answer_is_worth_what_twilio_says_and_is_asked_once(
    twilio, dispatcher, answer, expected
):
    twilio.answer(BOB, answer)

    outcomes = dispatcher.send_many([text(1, ALICE), text(2, BOB), text(3, ALICE)])

    assert [outcome(o) for o in outcomes] == [None, expected, None]
    # The library sent nothing again, whatever the answer: the worker decides every retry.
    assert [r.value("To") for r in twilio.requests] == [ALICE, BOB, ALICE]


def test_a_429_is_throttled_for_its_retry_after(twilio, dispatcher):
    twilio.answer(BOB, 20429, times=1, retry_after="7")

    assert outcome(dispatcher.send_many([text(2, BOB)])[0]) == (THROTTLED, False, False, 7.0)
    # Without one the throttle's own pause applies; the next send goes.
    twilio.answer(BOB, 20429, times=1)
    assert outcome(dispatcher.send_many([text(2, BOB)])[0]) == (THROTTLED, False, False, None)
    assert dispatcher.send_many([text(2, BOB)]) == [None]


def test_a_refused_account_fails_every_text_for_good_and_says_so_once(
    twilio, twilio_settings, settings, caplog
):
    settings.GATEKEEPER_TWILIO_AUTH_TOKEN = "not-the-token"
    with (
        closing(TwilioDispatcher()) as sender,
        caplog.at_level(logging.ERROR, logger="worker.delivery.twilio"),
    ):
        outcomes = sender.send_many([text(1, ALICE), text(2, BOB)])

    assert [outcome(o) for o in outcomes] == [(PERMANENT, False, False, None)] * 2
    assert "20003" in str(outcomes[0])
    assert [r.message for r in caplog.records if r.name == "worker.delivery.twilio"] == [
        f"Twilio refused the account, every SMS will fail: {outcomes[0].__cause__}"
    ]
    assert twilio.sent == []


def test_a_twilio_that_cannot_be_reached_is_transient(twilio_settings, settings):
    port = free_port()  # nothing listens there
    settings.GATEKEEPER_TWILIO_API_URL = f"https://127.0.0.1:{port}"
    with closing(TwilioDispatcher()) as sender:
        [refused] = sender.send_many([text(1, ALICE)])
    assert outcome(refused) == (TRANSIENT, False, False, None)


def test_a_certificate_not_trusted_is_transient_and_nothing_is_sent(
    twilio, twilio_settings, settings
):
    settings.GATEKEEPER_TWILIO_CA_BUNDLE = ""  # the fake's CA is not the system's
    with closing(TwilioDispatcher()) as sender:
        [refused] = sender.send_many([text(1, ALICE)])
    assert outcome(refused) == (TRANSIENT, False, False, None)
    assert twilio.requests == []


def test_twilio_variables_in_the_environment_do_not_move_the_dispatcher(
    twilio_settings, monkeypatch
):
    monkeypatch.setenv("TWILIO_REGION", "ie1")
    monkeypatch.setenv("TWILIO_EDGE", "dublin")
    with closing(TwilioDispatcher()) as sender:
        assert sender.send_many([text(1, ALICE)]) == [None]


def test_without_its_settings_the_dispatcher_cannot_start_and_the_check_warns(
    twilio_settings, settings
):
    assert dispatcher_class("sms") is TwilioDispatcher
    assert dispatchers_check(None) == []
    settings.GATEKEEPER_TWILIO_ACCOUNT_SID = ""
    settings.GATEKEEPER_TWILIO_FROM = ""
    with pytest.raises(DispatchError) as caught:
        TwilioDispatcher()
    assert caught.value.kind == TRANSIENT
    assert "GATEKEEPER_TWILIO_ACCOUNT_SID" in str(caught.value)
    [warning] = dispatchers_check(None)
    assert warning.id == "worker.W002"
    assert (
        "GATEKEEPER_TWILIO_ACCOUNT_SID" in warning.msg and "GATEKEEPER_TWILIO_FROM" in warning.msg
    )
    # Sending with an API key still needs the Auth Token for the STOP webhook's signatures.
    settings.GATEKEEPER_TWILIO_ACCOUNT_SID = FakeTwilio.account_sid
    settings.GATEKEEPER_TWILIO_FROM = FakeTwilio.sender
    settings.GATEKEEPER_TWILIO_API_KEY_SID = FakeTwilio.api_key_sid
    settings.GATEKEEPER_TWILIO_API_KEY_SECRET = FakeTwilio.api_key_secret
    settings.GATEKEEPER_TWILIO_AUTH_TOKEN = ""
    [warning] = dispatchers_check(None)
    assert warning.id == "worker.W002" and "GATEKEEPER_TWILIO_AUTH_TOKEN" in warning.msg
    TwilioDispatcher().close()  # it sends all the same
    # A ValidityPeriod Twilio refuses would fail every text: said at start-up, naming it.
    settings.GATEKEEPER_TWILIO_AUTH_TOKEN = FakeTwilio.auth_token
    settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS = 40_000
    [warning] = dispatchers_check(None)
    assert warning.id == "worker.W002" and "GATEKEEPER_TWILIO_VALIDITY_SECONDS" in warning.msg


def test_sms_goes_through_the_console_unless_twilio_is_named(settings):
    settings.GATEKEEPER_DISPATCHERS = ""
    settings.GATEKEEPER_TWILIO_ACCOUNT_SID = ""
    assert dispatcher_class("sms").provider == "console"
    assert [m.id for m in dispatchers_check(None)] == []
    settings.GATEKEEPER_DISPATCHERS = '{"push": "twilio"}'
    [error] = dispatchers_check(None)
    assert error.id == "worker.E002" and "sends sms, not push" in error.msg
