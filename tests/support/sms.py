"""Fixtures for SMS through Twilio: the Twilio fake on loopback over TLS, and twilio-python's
real Client pointed at it (with `local_tls` of tests/support/push.py).

The server lives for the session; each test starts from an empty fake."""

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from twilio.rest import Client

from tests.fakes.tls import LocalTLS
from tests.fakes.twilio import FakeTwilio
from worker.delivery.twilio import twilio_client as build_client

TIMEOUT = 0.5  # seconds Twilio may take: a hanging one costs a test no more


class LastAnswer:
    """The headers of the last HTTP answer each thread had. TwilioRestException carries a
    status, a code and a message but no headers: a 429's Retry-After is read here (a
    requests response hook, given to TwilioHttpClient as `request_hooks`)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def record(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        self.local.headers = dict(response.headers)
        return response

    @property
    def headers(self) -> dict[str, str]:
        return getattr(self.local, "headers", {})


def twilio_client(
    base_url: str,
    *,
    username: str,
    password: str,
    account_sid: str | None = None,
    ca_bundle: str | None,
    timeout: float = TIMEOUT,
) -> tuple[Client, LastAnswer]:
    """twilio-python's real Client built by TwilioDispatcher's own builder, and what it last
    heard."""
    last = LastAnswer()
    client = build_client(
        base_url,
        username=username,
        password=password,
        account_sid=account_sid,
        ca_bundle=ca_bundle,
        timeout=timeout,
        on_answer=last.record,
    )
    return client, last


@pytest.fixture(scope="session")
def twilio_server(local_tls: LocalTLS) -> Iterator[FakeTwilio]:
    fake = FakeTwilio(context=local_tls.server_context()).start()
    yield fake
    fake.stop()


@pytest.fixture
def twilio(twilio_server: FakeTwilio) -> Iterator[FakeTwilio]:
    """The Twilio fake, empty."""
    twilio_server.reset()
    yield twilio_server
    assert twilio_server.crashes == [], f"the Twilio fake itself failed: {twilio_server.crashes!r}"


@pytest.fixture
def twilio_api(twilio: FakeTwilio, local_tls: LocalTLS) -> Iterator[tuple[Client, LastAnswer]]:
    """The real Client, with the fake's account and Auth Token, pointed at the fake."""
    client, last = twilio_client(
        twilio.url,
        username=twilio.account_sid,
        password=twilio.auth_token,
        ca_bundle=str(local_tls.ca_bundle),
    )
    yield client, last
    client.http_client.session.close()


@pytest.fixture
def twilio_settings(twilio: FakeTwilio, local_tls: LocalTLS, settings) -> FakeTwilio:
    """The Twilio fake, empty, with TwilioDispatcher's settings pointed at it (the account's
    Auth Token, its number as the sender) and sms sent through Twilio."""
    settings.GATEKEEPER_TWILIO_ACCOUNT_SID = twilio.account_sid
    settings.GATEKEEPER_TWILIO_AUTH_TOKEN = twilio.auth_token
    settings.GATEKEEPER_TWILIO_API_KEY_SID = ""
    settings.GATEKEEPER_TWILIO_API_KEY_SECRET = ""
    settings.GATEKEEPER_TWILIO_FROM = twilio.sender
    settings.GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID = ""
    settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS = 0
    settings.GATEKEEPER_TWILIO_API_URL = twilio.url
    settings.GATEKEEPER_TWILIO_CA_BUNDLE = str(local_tls.ca_bundle)
    settings.GATEKEEPER_TWILIO_TIMEOUT_SECONDS = TIMEOUT
    settings.GATEKEEPER_DISPATCHERS = '{"sms": "twilio"}'
    return twilio
