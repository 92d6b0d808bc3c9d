"""Push straight to the platforms: Firebase Cloud Messaging (HTTP v1, through firebase_admin) and
the Apple Push Notification service (HTTP/2 with a provider token, through httpx).

Both hand a whole batch to their provider at once (`send_many`) and say, per message, what a
retry is worth (worker/dispatchers.py). Neither provider deduplicates, so neither library may
send a request again once it could have reached the provider: a send whose answer was lost is
AMBIGUOUS, and the worker does not send it again. The libraries send again only what cannot
have reached the provider (a connection that could not be made); everything else (5xx, 429
and its Retry-After) is the worker's to retry and to pace.

A token the provider calls dead (unregistered, not a token of this app) fails PERMANENT with
`invalid=True`: the send job reports it as an invalid address.
"""

import asyncio
import contextlib
import functools
import json
import re
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import firebase_admin
import httpx
import jwt
import requests
import urllib3
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from django.conf import settings
from firebase_admin import _http_client, credentials, exceptions, messaging
from google.auth.transport.requests import AuthorizedSession
from google.auth.transport.requests import Request as GoogleAuthRequest
from requests.adapters import HTTPAdapter

from worker.dispatchers import (
    AMBIGUOUS,
    PERMANENT,
    THROTTLED,
    TRANSIENT,
    DispatchError,
    Message,
    PushBackend,
    SendsInBatches,
    retry_after_seconds,
)

# ---------------------------------------------------------------------------------------------
# Firebase Cloud Messaging

# Data keys FCM refuses the whole message for ("from", "message_type", any key starting with
# "google" or "gcm"): left out of the data, not allowed to sink the send.
FCM_RESERVED_DATA_KEY = re.compile(r"^(?:from|message_type)$|^(?:google|gcm)")

# Only a connection that could not be made is tried again (once). firebase_admin's own policy
# POSTs again after a read error (a second push: FCM does not deduplicate) and sleeps out a 503
# or 429's Retry-After in the sending thread, while the worker's throttle pauses every worker.
# POST is not among urllib3's retryable methods, so no answer is retried.
FCM_RETRIES = urllib3.Retry(
    connect=1, read=False, redirect=False, status=0, other=0, respect_retry_after_header=False
)


class FCMPushBackend(SendsInBatches, PushBackend):
    """FCM HTTP v1 through firebase_admin: `messaging.send_each`, up to 500 messages (FCM's
    limit), each its own request, sent in parallel by the library.

    Each backend is its own named firebase App (several may live in one process), deleted by
    `close()`. The App's messaging service is given its HTTP client by this class: the FCM
    endpoint (`GATEKEEPER_FCM_URL`, for tests), a CA bundle for it and for the credentials'
    token endpoint (`GATEKEEPER_FCM_CA_BUNDLE`), and the retry policy above. firebase_admin 7.7
    has no option for any of these: the URL is built from a class constant into the service's
    `_fcm_url`, and the HTTP client is the service's `_client`. Both are replaced on this App's
    own service instance only (never on the class or module), with the library's own
    JsonHttpClient; `_messaging_service` refuses to start if a new version renamed them.
    """

    batch_size: ClassVar[int] = 500
    idempotent: ClassVar[bool] = False
    provider: ClassVar[str] = "fcm"

    def __init__(self) -> None:
        path = settings.GATEKEEPER_FCM_CREDENTIALS
        credential = credentials.Certificate(path) if path else credentials.ApplicationDefault()
        timeout = settings.GATEKEEPER_PUSH_TIMEOUT_SECONDS
        options: dict[str, Any] = {"httpTimeout": timeout}
        if settings.GATEKEEPER_FCM_PROJECT_ID:
            options["projectId"] = settings.GATEKEEPER_FCM_PROJECT_ID
        self.app = firebase_admin.initialize_app(
            credential, options, name=f"gatekeeper-fcm-{uuid.uuid4().hex}"
        )
        self.timeout = timeout
        try:
            self.credential = credential.get_credential()
            ca_bundle = settings.GATEKEEPER_FCM_CA_BUNDLE or None
            # One session for the token endpoint and one for FCM, both trusting the CA bundle.
            self.token_session = requests.Session()
            self.token_session.mount("https://", _Adapter(ca_bundle=ca_bundle))
            self.auth_request = GoogleAuthRequest(self.token_session)
            self.session = AuthorizedSession(self.credential, auth_request=self.auth_request)
            # send_each runs one thread per message: keep their connections for the next batch.
            self.session.mount(
                "https://",
                _Adapter(
                    ca_bundle=ca_bundle,
                    pool_connections=4,
                    pool_maxsize=self.batch_size,
                    max_retries=FCM_RETRIES,
                ),
            )
            self.service = _messaging_service(self.app)
            base = settings.GATEKEEPER_FCM_URL.rstrip("/")
            self.service._fcm_url = f"{base}/v1/projects/{self.app.project_id}/messages:send"
            self.service._client = _http_client.JsonHttpClient(
                session=self.session, retries=False, timeout=timeout
            )
        except BaseException:
            self.close()
            raise

    def send_many(self, messages: list[Message]) -> list[DispatchError | None]:
        if not messages:
            return []
        # An access token first: when it cannot be had, nothing has gone out and the whole
        # batch can wait. (With a fresh token no send thread refreshes it half-way.)
        if not self.credential.valid:
            try:
                self.credential.refresh(functools.partial(self.auth_request, timeout=self.timeout))
            except Exception as exc:
                failure = DispatchError(f"FCM: no access token: {exc}", kind=TRANSIENT)
                return [failure] * len(messages)
        try:
            batch = messaging.send_each([fcm_message(m) for m in messages], app=self.app)
        except ValueError as exc:
            # The library checks every message before sending any: nothing went out.
            return [DispatchError(f"FCM refused the batch: {exc}", kind=PERMANENT)] * len(messages)
        except exceptions.FirebaseError as exc:
            # A send thread failed outside its request (UnknownError): any may have gone out.
            return [DispatchError(f"FCM: {exc}", kind=AMBIGUOUS)] * len(messages)
        return [
            None if response.success else fcm_failure(response.exception)
            for response in batch.responses
        ]

    def close(self) -> None:
        app, self.app = getattr(self, "app", None), None
        if app is not None:
            with contextlib.suppress(Exception):
                firebase_admin.delete_app(app)
        for session in (getattr(self, "session", None), getattr(self, "token_session", None)):
            if session is not None:
                session.close()


class _Adapter(HTTPAdapter):
    """An adapter that verifies servers against `ca_bundle` when one is given. Per request:
    requests lets REQUESTS_CA_BUNDLE, set on many hosts, override a session's own `verify`
    (psf/requests#3829)."""

    def __init__(self, *, ca_bundle: str | None, **kwargs: Any) -> None:
        self.ca_bundle = ca_bundle
        super().__init__(**kwargs)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if self.ca_bundle:
            kwargs["verify"] = self.ca_bundle
        return super().send(request, *args, **kwargs)


def _messaging_service(app: firebase_admin.App) -> Any:
    """The App's own messaging service, the instance `messaging.send_each(app=app)` uses."""
    service = messaging._get_messaging_service(app)
    if not all(hasattr(service, name) for name in ("_fcm_url", "_client")):
        raise RuntimeError(
            "firebase_admin's messaging service has no _fcm_url or _client any more: check "
            "FCMPushBackend (worker/push_providers.py) against this firebase-admin version"
        )
    return service


def fcm_message(message: Message) -> messaging.Message:
    """The notification (title and body) and the message's data, which FCM wants as strings:
    strings as they are, other values as JSON (3 -> "3", True -> "true", lists and objects as
    JSON text); null values and FCM's reserved keys are left out."""
    data = {
        str(key): value if isinstance(value, str) else json.dumps(value, default=str)
        for key, value in message.data.items()
        if value is not None and not FCM_RESERVED_DATA_KEY.search(str(key))
    }
    return messaging.Message(
        token=message.address,
        notification=messaging.Notification(title=message.subject, body=message.body.strip()),
        data=data or None,
    )


def fcm_failure(exc: exceptions.FirebaseError | None) -> DispatchError:
    """What one failed FCM send is worth."""
    if isinstance(exc, messaging.UnregisteredError | messaging.SenderIdMismatchError):
        return DispatchError(f"FCM: {exc}", kind=PERMANENT, invalid=True)
    response = getattr(exc, "http_response", None)
    if exc is None or response is None:
        # No answer: the connection could not be made (nothing went out), or broke or timed
        # out once the request was on its way (FCM may have taken it).
        kind = AMBIGUOUS if _may_have_reached_server(exc) else TRANSIENT
        return DispatchError(f"FCM: no answer: {exc}", kind=kind)
    status = response.status_code
    if status == 429 or isinstance(exc, messaging.QuotaExceededError):
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        return DispatchError(f"FCM: {exc}", kind=THROTTLED, retry_after=retry_after)
    if status >= 500 or status == 408:
        return DispatchError(f"FCM answered {status}: {exc}", kind=TRANSIENT)
    if isinstance(exc, exceptions.InvalidArgumentError) and _concerns_token(exc, response):
        return DispatchError(f"FCM: {exc}", kind=PERMANENT, invalid=True)
    if 400 <= status < 500:
        return DispatchError(f"FCM answered {status}: {exc}", kind=PERMANENT)
    return DispatchError(f"FCM answered {status}: {exc}", kind=TRANSIENT)


def _concerns_token(exc: Exception, response: Any) -> bool:
    """Whether an INVALID_ARGUMENT is about the registration token: FCM says so in its message
    ("The registration token is not a valid FCM registration token") or, in a BadRequest
    detail, names the field `message.token`. Any other invalid argument (a data key, the
    payload's size) is the message's fault, not the token's."""
    if "registration token" in str(exc).lower():
        return True
    try:
        details = response.json()["error"].get("details", [])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return any(
        violation.get("field") == "message.token"
        for detail in details
        if isinstance(detail, dict)
        for violation in detail.get("fieldViolations") or []
        if isinstance(violation, dict)
    )


def _may_have_reached_server(exc: BaseException | None) -> bool:
    """False when the error chain shows no connection was ever made (refused, unresolvable,
    connect timeout, server certificate refused); True otherwise, to be safe."""
    for cause in _causes(exc):
        if isinstance(
            cause,
            urllib3.exceptions.ConnectTimeoutError  # and NewConnectionError, NameResolutionError
            | requests.exceptions.ConnectTimeout
            | ssl.SSLCertVerificationError,
        ):
            return False
    return True


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """An error and what it wraps: firebase's `cause`, Python's chain, urllib3's `reason` and
    requests' wrapped exception (its first argument)."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen or len(seen) > 50:
            continue
        seen.add(id(current))
        yield current
        pending.extend([current.__cause__, current.__context__])
        for wrapped in (getattr(current, "cause", None), getattr(current, "reason", None)):
            if isinstance(wrapped, BaseException):
                pending.append(wrapped)
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))


# ---------------------------------------------------------------------------------------------
# Apple Push Notification service

APNS_PRODUCTION_URL = "https://api.push.apple.com"
APNS_SANDBOX_URL = "https://api.sandbox.push.apple.com"
# apns-id: a UUID derived from the message id, the same for every attempt of one send, so that
# Apple's and our logs name a push alike.
APNS_ID_NAMESPACE = uuid.UUID("7c0cd4bf-e70f-44da-8a9e-83c94a990778")
# A device token is 32 bytes in hex today (64 characters); Apple has said tokens may grow, so up
# to 100 bytes (200 characters) are taken, whole bytes only.
APNS_DEVICE_TOKEN = re.compile(r"(?:[0-9a-fA-F]{2}){32,100}")
# Apple refuses provider tokens refreshed more often than every 20 minutes or older than 60.
APNS_PROVIDER_TOKEN_SECONDS = 30 * 60
# Reasons that say the device token is dead or not this app's.
APNS_INVALID_TOKEN_REASONS = {"BadDeviceToken", "DeviceTokenNotForTopic", "Unregistered"}


def apns_id(message_id: str) -> str:
    return str(uuid.uuid5(APNS_ID_NAMESPACE, message_id))


class APNsPushBackend(SendsInBatches, PushBackend):
    """APNs over one HTTP/2 connection, with token-based authentication (a .p8 signing key).

    httpx (http2=True) and PyJWT rather than aioapns. aioapns 4.0 cannot be pointed at another
    host and port (they are class constants of its protocol classes, picked inside its
    connection pool). It also sends a request again on a new connection when the connection is
    lost after writing it (a second push); with max_connection_attempts=1 it does not, but then
    a connection lost and one never made end in the same MaxAttemptsExceeded. A batch larger
    than the 64 KiB HTTP/2 window hits FlowControlError, slept off a second at a time, instead
    of waiting for the window; and an error answer without a JSON body is waited for for ever.
    httpcore waits for the window and for the server's stream limit, and sends again on another
    connection only requests the server never took (refused streams, GOAWAY past them).

    The worker is synchronous: the backend owns an event loop, runs each batch on it (all the
    batch's pushes in flight at once over the one connection) and closes it in `close()`.
    """

    batch_size: ClassVar[int] = 1000
    idempotent: ClassVar[bool] = False
    provider: ClassVar[str] = "apns"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if not APNS_DEVICE_TOKEN.fullmatch(address):
            return "An APNs device token is 64 to 200 hexadecimal characters (32 to 100 bytes)."
        return None

    def __init__(self) -> None:
        self.key_id = settings.GATEKEEPER_APNS_KEY_ID
        self.team_id = settings.GATEKEEPER_APNS_TEAM_ID
        self.topic = settings.GATEKEEPER_APNS_TOPIC
        if not (settings.GATEKEEPER_APNS_KEY and self.key_id and self.team_id and self.topic):
            raise DispatchError(
                "GATEKEEPER_APNS_KEY, GATEKEEPER_APNS_KEY_ID, GATEKEEPER_APNS_TEAM_ID and "
                "GATEKEEPER_APNS_TOPIC must be set",
                kind=TRANSIENT,
            )
        key = load_pem_private_key(Path(settings.GATEKEEPER_APNS_KEY).read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise DispatchError("GATEKEEPER_APNS_KEY is not an APNs (P-256) key", kind=TRANSIENT)
        self.key = key
        default_url = APNS_SANDBOX_URL if settings.GATEKEEPER_APNS_SANDBOX else APNS_PRODUCTION_URL
        verify: ssl.SSLContext | bool = True
        if settings.GATEKEEPER_APNS_CA_BUNDLE:
            verify = ssl.create_default_context(cafile=settings.GATEKEEPER_APNS_CA_BUNDLE)
        self.provider_token: tuple[float, str] | None = None  # (issued at, JWT)
        self.client = httpx.AsyncClient(
            base_url=settings.GATEKEEPER_APNS_URL or default_url,
            http1=False,  # APNs speaks HTTP/2 only
            http2=True,
            verify=verify,
            timeout=settings.GATEKEEPER_PUSH_TIMEOUT_SECONDS,
            limits=httpx.Limits(max_connections=1),
        )
        self.loop = asyncio.new_event_loop()

    def send_many(self, messages: list[Message]) -> list[DispatchError | None]:
        if not messages:
            return []
        return self.loop.run_until_complete(self._send_batch(messages))

    async def _send_batch(self, messages: list[Message]) -> list[DispatchError | None]:
        # The first goes alone: it opens the connection if there is none, and when that cannot
        # be done nothing is tried again per message (a connect timeout would otherwise be
        # waited out by each in turn).
        first = await self._send_one(messages[0])
        if isinstance(first, _NoConnection):
            return [first] * len(messages)
        rest = await asyncio.gather(*(self._send_one(m) for m in messages[1:]))
        return [first, *rest]

    async def _send_one(self, message: Message) -> DispatchError | None:
        problem = self.address_problem(message.address)
        if problem:  # also keeps anything but a token out of the request's path
            return DispatchError(problem, kind=PERMANENT, invalid=True)
        headers = {
            "authorization": f"bearer {self._provider_token()}",
            "apns-topic": self.topic,
            "apns-push-type": "alert",
            "apns-id": apns_id(message.message_id),
        }
        try:
            response = await self.client.post(
                f"/3/device/{message.address}", content=apns_payload(message), headers=headers
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return _NoConnection(f"APNs unreachable: {exc!r}", kind=TRANSIENT)
        except httpx.TransportError as exc:
            # Written, then the connection broke or the answer was late: Apple may have it.
            return DispatchError(f"APNs: no answer to a sent push: {exc!r}", kind=AMBIGUOUS)
        return apns_failure(response)

    def _provider_token(self) -> str:
        now = time.time()
        if (
            self.provider_token is None
            or now - self.provider_token[0] > APNS_PROVIDER_TOKEN_SECONDS
        ):
            token = jwt.encode(
                {"iss": self.team_id, "iat": int(now)},
                self.key,
                algorithm="ES256",
                headers={"kid": self.key_id},
            )
            self.provider_token = (now, token)
        return self.provider_token[1]

    def close(self) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


class _NoConnection(DispatchError):
    """No connection could be made: the push never left."""


def apns_payload(message: Message) -> bytes:
    """The alert (title and body), and the message's data as custom keys beside `aps`."""
    payload = {key: value for key, value in message.data.items() if key != "aps"}
    payload["aps"] = {"alert": {"title": message.subject, "body": message.body.strip()}}
    return json.dumps(payload, ensure_ascii=False, default=str).encode()


def apns_failure(response: httpx.Response) -> DispatchError | None:
    """What an APNs answer is worth: None when it took the push."""
    status = response.status_code
    if status == 200:
        return None
    try:
        reason = str(response.json().get("reason", ""))
    except (ValueError, AttributeError):
        reason = ""
    text = f"APNs answered {status} {reason or '(no reason)'}"
    if status == 410 or reason in APNS_INVALID_TOKEN_REASONS:
        return DispatchError(text, kind=PERMANENT, invalid=True)
    if status == 429:
        # TooManyRequests is about one device ("too many requests to the same device token"),
        # not the provider's rate: that send waits for a later chunk, the others go on (a
        # THROTTLED answer would pause every worker).
        return DispatchError(text, kind=TRANSIENT)
    if 400 <= status < 500:
        return DispatchError(text, kind=PERMANENT)
    return DispatchError(text, kind=TRANSIENT)
