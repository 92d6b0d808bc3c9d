"""Push to the Apple Push Notification service: HTTP/2 with a provider token (a .p8 signing key),
through httpx. Apple does not deduplicate: a send whose answer was lost is AMBIGUOUS and never
sent again; a token Apple calls dead fails PERMANENT with `invalid=True`."""

import asyncio
import contextlib
import json
import re
import ssl
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from django.conf import settings

from limits.channels import PUSH
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    TRANSIENT,
    DispatchError,
    Message,
    SendsInBatches,
)

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


class APNsDispatcher(SendsInBatches):
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
    channels: ClassVar[tuple[str, ...]] = (PUSH,)

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

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        if not messages:
            return []
        return self.loop.run_until_complete(self._send_batch(messages))

    async def _send_batch(self, messages: Sequence[Message]) -> list[DispatchError | None]:
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
