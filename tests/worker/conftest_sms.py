"""Fixtures for SMS through Twilio: the Twilio fake on loopback over TLS, and twilio-python's
real Client pointed at it. Imported by the test modules that use them, with `local_tls` from
conftest_push.

The server lives for the session; each test starts from an empty fake."""

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from requests.adapters import HTTPAdapter
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from tests.fakes.tls import LocalTLS
from tests.fakes.twilio import FakeTwilio

TIMEOUT = 0.5  # seconds Twilio may take: a hanging one costs a test no more

# Connections that could not be made are tried once more; nothing that may have reached Twilio
# is (POST is not among urllib3's retryable methods, and no status is retried).
RETRIES = urllib3.Retry(
    connect=1, read=False, redirect=False, status=0, other=0, respect_retry_after_header=False
)


# What the Client reads instead of the process environment: a TWILIO_EDGE or TWILIO_REGION
# there would rewrite the API's host (`api.<edge>.<region>.twilio.com`), the fake's too. Not
# empty: twilio reads `environment or os.environ`.
ENVIRONMENT = {"TWILIO_EDGE": "", "TWILIO_REGION": ""}


class TrustingAdapter(HTTPAdapter):
    """Verifies servers against `ca_bundle` per request: requests lets REQUESTS_CA_BUNDLE
    override a session's own `verify` (psf/requests#3829)."""

    def __init__(self, *, ca_bundle: str | None, **kwargs: Any) -> None:
        self.ca_bundle = ca_bundle
        super().__init__(**kwargs)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.ca_bundle:
            kwargs["verify"] = self.ca_bundle
        return super().send(request, *args, **kwargs)


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
    """twilio-python's real Client, its API domain at `base_url` (Twilio's own is
    https://api.twilio.com), its server verified against `ca_bundle`."""
    last = LastAnswer()
    http_client = TwilioHttpClient(timeout=timeout, request_hooks={"response": [last.record]})
    assert http_client.session is not None
    http_client.session.mount("https://", TrustingAdapter(ca_bundle=ca_bundle, max_retries=RETRIES))
    client = Client(
        username,
        password,
        account_sid=account_sid,
        http_client=http_client,
        environment=ENVIRONMENT,
    )
    client.api.base_url = base_url
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
