"""SMS through Twilio's Programmable Messaging API, with the official `twilio` package: one
`POST /2010-04-01/Accounts/<AccountSid>/Messages.json` per message.

The request is twilio-python's own (`client.messages.create`: its path, form, basic auth,
answer and error parsing). Three things are ours, on the Client's public parts: its API
domain's `base_url` (GATEKEEPER_TWILIO_API_URL: Twilio's, or the tests' fake), the requests
session's adapter (a CA bundle for the fake, GATEKEEPER_TWILIO_CA_BUNDLE, and the retry policy
below), and a response hook that keeps the answer's Retry-After, which TwilioRestException does
not carry. The Client is given an environment of its own: it would otherwise read TWILIO_EDGE
and TWILIO_REGION from the process's, and rewrite every URL's host with them.

What each answer is worth (worker/delivery/base.py's kinds; `twilio_failure`):

| answer                                                    | kind                           |
|-----------------------------------------------------------|--------------------------------|
| 201 with the Message resource                             | sent                           |
| 21211 invalid number, 21614 not a mobile, 21635 landline  | PERMANENT, `invalid`           |
| 21610 the person replied STOP to this sender              | PERMANENT, `opted_out`         |
| 429 (20429)                                               | THROTTLED, with Retry-After    |
| 503 (20503), 408                                          | TRANSIENT                      |
| 500 (20500) and every other 5xx                           | AMBIGUOUS                      |
| any other 4xx (21408, 21612, 21606, 20003, 20403, ...)    | PERMANENT                      |
| connection refused, connect timeout, certificate refused  | TRANSIENT: nothing went out    |
| read timeout, connection lost after the request           | AMBIGUOUS                      |
| a 2xx whose body is not JSON                              | AMBIGUOUS                      |

A 500 is AMBIGUOUS, not TRANSIENT as other providers' 5xx are, on Twilio's own word: retrying
a POST that sends an SMS after a 500 "it is possible for a customer to receive multiple
messages" (https://www.twilio.com/docs/api/errors/20500). A 503 is "try again a few times with
exponential back-off" (https://www.twilio.com/docs/api/errors/20503), and a 20429 is "never
processed and always safe to retry" (https://www.twilio.com/docs/api/errors/20429).

Not idempotent. Twilio's Messages API takes no idempotency key: the Message resource documents
none (https://www.twilio.com/docs/messaging/api/message-resource), twilio-python 9.13.0, which
is generated from Twilio's OpenAPI description and sends an idempotency key where an API has
one (rest/voice/v3, rest/conversations/v2), sends none with a message (`MessageList._create`),
and Twilio says a retried SMS POST may be delivered twice (20500 above). So a send whose answer
was lost is AMBIGUOUS and never sent again, the library never sends a request again once it may
have reached Twilio (RETRIES), and each message is its own claim (`batch_size` 1).
"""

import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar, cast

import requests
import urllib3
from django.conf import settings
from twilio.base.exceptions import TwilioException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from limits.channels import SMS
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    THROTTLED,
    TRANSIENT,
    DispatchError,
    Message,
    OneAtATime,
    retry_after_seconds,
)
from worker.delivery.http import TrustingAdapter, requests_failure

logger = logging.getLogger(__name__)

PROVIDER = "twilio"
# Twilio's codes that say the number itself cannot take an SMS: not a valid number, not a
# mobile, a landline (www.twilio.com/docs/api/errors/21211, 21614, 21635).
DEAD_NUMBER_CODES = frozenset({21211, 21614, 21635})
# The person replied STOP (or another opt-out keyword) to this sender or Messaging Service;
# Twilio refuses every send to them until they reply START (www.twilio.com/docs/api/errors/21610).
OPTED_OUT_CODE = 21610
# Answers about the account, not the message: every send fails alike until someone fixes it.
ACCOUNT_STATUSES = frozenset({401, 403, 404})

# Only a connection that could not be made is tried again (once). POST is not among urllib3's
# retryable methods, so nothing that may have reached Twilio is sent again, and no status is
# retried: the worker decides every retry.
RETRIES = urllib3.Retry(
    connect=1, read=False, redirect=False, status=0, other=0, respect_retry_after_header=False
)
# What the Client reads instead of the process environment: a TWILIO_EDGE or TWILIO_REGION there
# would rewrite the API's host. Not empty: twilio reads `environment or os.environ`.
ENVIRONMENT = {"TWILIO_EDGE": "", "TWILIO_REGION": ""}


def twilio_missing_settings() -> list[str]:
    """The settings TwilioDispatcher cannot send without and lacks: the account, a credential
    to send with, and a sender."""
    missing = []
    if not settings.GATEKEEPER_TWILIO_ACCOUNT_SID:
        missing.append("GATEKEEPER_TWILIO_ACCOUNT_SID")
    has_key = settings.GATEKEEPER_TWILIO_API_KEY_SID and settings.GATEKEEPER_TWILIO_API_KEY_SECRET
    if not (has_key or settings.GATEKEEPER_TWILIO_AUTH_TOKEN):
        missing.append(
            "GATEKEEPER_TWILIO_AUTH_TOKEN (or GATEKEEPER_TWILIO_API_KEY_SID and _SECRET)"
        )
    if not (settings.GATEKEEPER_TWILIO_FROM or settings.GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID):
        missing.append("GATEKEEPER_TWILIO_FROM (or GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID)")
    return missing


VALIDITY_MAX = 36_000  # Twilio's longest ValidityPeriod, in seconds


def twilio_client(
    base_url: str,
    *,
    username: str,
    password: str,
    account_sid: str | None,
    ca_bundle: str | None,
    timeout: float,
    on_answer: Callable[..., Any],
) -> Client:
    """twilio-python's Client, its API at `base_url` (Twilio's own: https://api.twilio.com), its
    server verified against `ca_bundle` (None: the system's CAs), its requests given `timeout`
    to connect and between an answer's bytes, every answer handed to `on_answer` (a requests
    response hook), connection errors retried by RETRIES, TWILIO_EDGE and TWILIO_REGION of the
    environment ignored."""
    http_client = TwilioHttpClient(timeout=timeout, request_hooks={"response": [on_answer]})
    assert http_client.session is not None  # pool_connections=True: a Session
    http_client.session.mount("https://", TrustingAdapter(ca_bundle=ca_bundle, max_retries=RETRIES))
    client = Client(
        username,
        password,
        account_sid=account_sid,
        http_client=http_client,
        environment=ENVIRONMENT,
    )
    client.api.base_url = base_url.rstrip("/")
    return client


class TwilioDispatcher(OneAtATime):
    """SMS through Twilio's Messages API, one request a message (see the module's docstring).

    One Client per dispatcher, its HTTP session kept for the chunk's sends (keep-alive) and
    closed by `close()`. Each request may take GATEKEEPER_TWILIO_TIMEOUT_SECONDS to connect and
    as long again between the answer's bytes, well under the chunk's lease.
    """

    provider: ClassVar[str] = PROVIDER
    channels: ClassVar[tuple[str, ...]] = (SMS,)
    batch_size: ClassVar[int] = 1
    idempotent: ClassVar[bool] = False

    @classmethod
    def settings_problems(cls) -> list[str]:
        """What the dispatcher cannot send without, an Auth Token the STOP webhook needs, and a
        ValidityPeriod Twilio would refuse with every text."""
        missing = twilio_missing_settings()
        problems = [f"{', '.join(missing)} not set"] if missing else []
        if settings.GATEKEEPER_TWILIO_API_KEY_SID and not settings.GATEKEEPER_TWILIO_AUTH_TOKEN:
            problems.append(
                "GATEKEEPER_TWILIO_AUTH_TOKEN not set: the STOP webhook (/twilio/inbound/) "
                "cannot check Twilio's signatures and refuses every reply"
            )
        if not 0 <= settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS <= VALIDITY_MAX:
            problems.append(
                f"GATEKEEPER_TWILIO_VALIDITY_SECONDS is "
                f"{settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS}: 0 (Twilio's default) or 1 to "
                f"{VALIDITY_MAX:,}"
            )
        return problems

    def __init__(self) -> None:
        missing = twilio_missing_settings()
        if missing:
            raise DispatchError(f"Twilio: {', '.join(missing)} not set", kind=TRANSIENT)
        account_sid = settings.GATEKEEPER_TWILIO_ACCOUNT_SID
        if settings.GATEKEEPER_TWILIO_API_KEY_SID:
            # An API key can be revoked on its own; the Auth Token still signs the webhooks.
            username = settings.GATEKEEPER_TWILIO_API_KEY_SID
            password = settings.GATEKEEPER_TWILIO_API_KEY_SECRET
        else:
            username, password = account_sid, settings.GATEKEEPER_TWILIO_AUTH_TOKEN
        self.options: dict[str, Any] = {}
        if settings.GATEKEEPER_TWILIO_FROM:
            self.options["from_"] = settings.GATEKEEPER_TWILIO_FROM
        if settings.GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID:
            self.options["messaging_service_sid"] = settings.GATEKEEPER_TWILIO_MESSAGING_SERVICE_SID
        if settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS:
            self.options["validity_period"] = settings.GATEKEEPER_TWILIO_VALIDITY_SECONDS
        # The last answer's Retry-After (a 429's). A dispatcher serves one chunk run, in one
        # thread, a request at a time: one attribute is enough.
        self.retry_after: str | None = None
        self.account_refused = False
        self.client = twilio_client(
            settings.GATEKEEPER_TWILIO_API_URL,
            username=username,
            password=password,
            account_sid=account_sid,
            ca_bundle=settings.GATEKEEPER_TWILIO_CA_BUNDLE or None,
            timeout=float(settings.GATEKEEPER_TWILIO_TIMEOUT_SECONDS),
            on_answer=self._answered,
        )
        self.session = cast(TwilioHttpClient, self.client.http_client).session

    def _answered(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        self.retry_after = response.headers.get("Retry-After")
        return response

    def send(self, message: Message) -> None:
        self.retry_after = None
        try:
            self.client.messages.create(
                to=message.address, body=message.body.strip(), **self.options
            )
        except TwilioException as exc:  # TwilioRestException, TwilioServiceException
            failure = twilio_failure(exc, retry_after=self.retry_after)
            self._account_trouble(exc)
            raise failure from exc
        except requests.RequestException as exc:
            raise requests_failure("Twilio", exc) from exc
        except json.JSONDecodeError as exc:
            # A 2xx whose body is not JSON: Twilio may have taken it.
            raise DispatchError(f"Twilio: unreadable answer: {exc}", kind=AMBIGUOUS) from exc

    def _account_trouble(self, exc: TwilioException) -> None:
        """Say it loudly, once per dispatcher, when Twilio refuses the account itself (wrong
        credentials, a suspended account, another account's path): every send fails alike."""
        if getattr(exc, "status", None) in ACCOUNT_STATUSES and not self.account_refused:
            self.account_refused = True
            logger.error("Twilio refused the account, every SMS will fail: %s", exc)

    def close(self) -> None:
        self.session.close()


def twilio_failure(exc: TwilioException, *, retry_after: str | None = None) -> DispatchError:
    """What a Twilio error answer is worth (the module's docstring); `retry_after` is the
    answer's Retry-After header."""
    status = int(getattr(exc, "status", 0) or 0)
    code = getattr(exc, "code", None)
    text = f"Twilio answered {status} ({code}): {getattr(exc, 'msg', '') or exc}"
    if code in DEAD_NUMBER_CODES:
        return DispatchError(text, kind=PERMANENT, invalid=True)
    if code == OPTED_OUT_CODE:
        return DispatchError(text, kind=PERMANENT, opted_out=True)
    if status == 429 or code == 20429:
        return DispatchError(text, kind=THROTTLED, retry_after=retry_after_seconds(retry_after))
    if status in (408, 503):
        return DispatchError(text, kind=TRANSIENT)
    if 400 <= status < 500:
        return DispatchError(text, kind=PERMANENT)
    # 500 and every other 5xx (a gateway's page too), or a status no error should have: the
    # message may be on its way.
    return DispatchError(text, kind=AMBIGUOUS)
