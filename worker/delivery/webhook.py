"""Push through a relay of the company's own: each push POSTed as JSON to
GATEKEEPER_PUSH_WEBHOOK_URL, the message id as its idempotency key."""

import json
import urllib.error
import urllib.request
from typing import ClassVar

from django.conf import settings

from limits.channels import PUSH
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


class WebhookDispatcher(OneAtATime):
    """POSTs each push as JSON to a provider relay; the message id is the idempotency key, so
    a relay that honours it never delivers a retried push twice, and a push whose outcome is
    unknown (a worker died during it, the relay timed out) is sent again with the same key."""

    idempotent: ClassVar[bool] = True
    provider: ClassVar[str] = "webhook"
    channels: ClassVar[tuple[str, ...]] = (PUSH,)

    def __init__(self, url: str | None = None, timeout: float = 5.0) -> None:
        self.url = url or settings.GATEKEEPER_PUSH_WEBHOOK_URL
        if not self.url:
            raise DispatchError("GATEKEEPER_PUSH_WEBHOOK_URL is not set", kind=TRANSIENT)
        self.timeout = timeout

    def send(self, message: Message) -> None:
        payload = json.dumps(
            {
                "message_id": message.message_id,
                "user_id": message.user_id,
                "token": message.address,
                "title": message.subject,
                "body": message.body.strip(),
                "data": message.data,
            }
        ).encode()
        request = urllib.request.Request(
            self.url,
            data=payload,
            method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": message.message_id},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 429:
                raise DispatchError(
                    "push relay answered 429 (too many requests)",
                    kind=THROTTLED,
                    retry_after=retry_after_seconds(exc.headers.get("Retry-After")),
                ) from exc
            kind = PERMANENT if 400 <= exc.code < 500 and exc.code != 408 else TRANSIENT
            raise DispatchError(f"push relay answered {exc.code}", kind=kind) from exc
        except urllib.error.URLError as exc:
            raise DispatchError(f"push relay unreachable: {exc.reason}", kind=TRANSIENT) from exc
        except TimeoutError as exc:
            # The request went out; the relay may have delivered it.
            raise DispatchError("push relay timed out", kind=AMBIGUOUS) from exc
