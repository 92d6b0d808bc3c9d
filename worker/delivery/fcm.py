"""Push straight to Firebase Cloud Messaging (HTTP v1, through firebase_admin); Apple's is
worker/delivery/apns.py.

Both hand a whole batch to their provider at once (`send_many`) and say, per message, what a
retry is worth (worker/delivery/base.py). Neither provider deduplicates, so neither library may
send a request again once it could have reached the provider: a send whose answer was lost is
AMBIGUOUS, and the worker does not send it again. The libraries send again only what cannot
have reached the provider (a connection that could not be made); everything else (5xx, 429
and its Retry-After) is the worker's to retry and to pace.

A token the provider calls dead (unregistered, not a token of this app) fails PERMANENT with
`invalid=True`: the send job reports it as an invalid address.
"""

import contextlib
import functools
import json
import re
import ssl
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import firebase_admin
import requests
import urllib3
from django.conf import settings
from firebase_admin import _http_client, credentials, exceptions, messaging
from google.auth.transport.requests import AuthorizedSession
from google.auth.transport.requests import Request as GoogleAuthRequest

from limits.channels import PUSH
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    THROTTLED,
    TRANSIENT,
    DispatchError,
    Message,
    SendsInBatches,
    causes,
    retry_after_seconds,
)
from worker.delivery.http import TrustingAdapter

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


class FCMDispatcher(SendsInBatches):
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
    channels: ClassVar[tuple[str, ...]] = (PUSH,)

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
            self.token_session.mount("https://", TrustingAdapter(ca_bundle=ca_bundle))
            self.auth_request = GoogleAuthRequest(self.token_session)
            self.session = AuthorizedSession(self.credential, auth_request=self.auth_request)
            # send_each runs one thread per message: keep their connections for the next batch.
            self.session.mount(
                "https://",
                TrustingAdapter(
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

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
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


def _messaging_service(app: firebase_admin.App) -> Any:
    """The App's own messaging service, the instance `messaging.send_each(app=app)` uses."""
    service = messaging._get_messaging_service(app)
    if not all(hasattr(service, name) for name in ("_fcm_url", "_client")):
        raise RuntimeError(
            "firebase_admin's messaging service has no _fcm_url or _client any more: check "
            "FCMDispatcher (worker/push_providers.py) against this firebase-admin version"
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
    for cause in causes(exc):
        if isinstance(
            cause,
            urllib3.exceptions.ConnectTimeoutError  # and NewConnectionError, NameResolutionError
            | requests.exceptions.ConnectTimeout
            | ssl.SSLCertVerificationError,
        ):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Apple Push Notification service
