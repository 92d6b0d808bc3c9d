"""Email through an email service provider's HTTP API (django-anymail), one small class per ESP.

Used for the email channel when its dispatcher is an ESP (worker/delivery/registry.py:
GATEKEEPER_DISPATCHERS='{"email": "postmark"}', or GATEKEEPER_EMAIL_PROVIDER=postmark; sendgrid,
mailgun, amazon_ses, resend, or any other module of anymail.backends). Every send carries
`X-Gatekeeper-Message-Id`, a `Message-ID` derived from its message id (a copy sent again is
recognisable, and receivers drop a second copy; Amazon SES replaces it with its own), its own
`List-Unsubscribe` headers (marketing), and the anymail metadata {"user_id", "message_id"} that ties
the provider's tracking events back to the user (worker/delivery/tracking.py).

Batches. Sends of one dispatcher batch whose rendered subject, text and HTML are the same go
as one API call in anymail's batch mode (`merge_headers` and `merge_metadata`: each recipient
gets their own copy with their own headers and metadata), where anymail carries both for the
ESP without a stored template, at most the API's limit of recipients per call:
- Postmark: POST /email/batch, 500 messages a call.
- SendGrid: POST /v3/mail/send, 1,000 personalizations a call.
- Mailgun: POST /v3/<domain>/messages with recipient-variables, 1,000 recipients a call.
- Amazon SES: one SendEmail call per message. SES's batch call, SendBulkEmail (50 destinations),
  takes per-recipient headers only with a template (anymail sends merge_headers to SES only
  with template_id): our texts are rendered already, and SES would render them again as
  Handlebars (a `{{` in a text would change it).
- Resend and every other ESP: one API call per message.
A batch call fails or succeeds for every recipient in it; its per-recipient statuses decide the
rest (sent/queued: sent; rejected/invalid: the address is dead; failed: permanent; anything
else: unknown, so ambiguous).

Errors, as DispatchError kinds (worker/delivery/base.py): HTTP 429 (or SES's throttling codes) is
THROTTLED with the Retry-After; 408 and 5xx are TRANSIENT; other 4xx are PERMANENT. Anymail
raises requests' transport errors as AnymailRequestsAPIError *from* the requests exception, and
botocore's as AnymailAPIError from it: connection refused, a name that does not resolve, a
connect timeout or a certificate refused (nothing was sent) are TRANSIENT; a read timeout or a
connection lost once the request was on its way (the ESP may have taken it) are AMBIGUOUS.
botocore retries a timed-out call by itself by default, which would send a second copy: the SES
client here never retries (the worker decides). A call answered 2xx whose answer anymail cannot
read is AMBIGUOUS too.

Idempotency (`idempotent`: a send whose outcome is unknown is sent again with the same key):
- Resend deduplicates by the `Idempotency-Key` HTTP header on POST /emails, for 24 hours: the
  message id is the key, one message per call, so ResendDispatcher is idempotent (a retried
  send within a day never goes out twice). Its 409 (the same key still in progress, or used
  with another body) means the first request got there: ambiguous.
- Brevo deduplicates by an `idempotencyKey` in the message's headers, but only for 15 to 30
  minutes (its documentation says both): shorter than a lost task takes to be queued again
  (GATEKEEPER_CHUNK_REQUEUE_SECONDS, 30 minutes), so it is not relied on.
- Amazon SES (SendEmail, SendBulkEmail: no client token), SendGrid (v3 mail send), Mailgun
  (messages API) and Postmark (/email, /email/batch) have no idempotency key: not idempotent.
  A send whose outcome is unknown is counted ambiguous and never sent again.
"""

import functools
import hashlib
import logging
import string
from collections.abc import Sequence
from email.utils import parseaddr
from typing import Any, ClassVar

import requests
from anymail.exceptions import AnymailAPIError, AnymailError
from anymail.utils import get_anymail_setting, parse_single_address
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)
from botocore.exceptions import SSLError as BotoSSLError
from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from limits.channels import EMAIL
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    THROTTLED,
    TRANSIENT,
    DispatchError,
    Message,
    SendsInBatches,
    retry_after_seconds,
)
from worker.delivery.http import certificate_refused, requests_failure

logger = logging.getLogger(__name__)

ANYMAIL_BACKENDS = "anymail.backends."
# Amazon SES's codes for "too many": SES v2 answers TooManyRequestsException (HTTP 429), the
# AWS query protocol Throttling (HTTP 400).
SES_THROTTLING = frozenset({"TooManyRequestsException", "Throttling", "ThrottlingException"})
_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$&'*+/=?^_`{|}~-")
_MESSAGE_ID_LOCAL_MAX = 128  # characters of a Message-ID's left part; longer ids are hashed
_METADATA_VALUE_MAX = 80  # Postmark's limit for a metadata value, the strictest ESP's


class AnymailDispatcher(SendsInBatches):
    """Email through the anymail backend of `esp` (see the module's docstring)."""

    esp: ClassVar[str] = ""  # the anymail.backends module
    provider: ClassVar[str] = "anymail"
    channels: ClassVar[tuple[str, ...]] = (EMAIL,)
    batch_size: ClassVar[int] = 1
    idempotent: ClassVar[bool] = False
    # Identical sends go as one call in anymail's batch mode, carrying per-recipient headers
    # and metadata (merge_headers, merge_metadata) without a stored template.
    batches: ClassVar[bool] = False

    def __init__(self) -> None:
        # Per-recipient statuses are read here, not raised when all of a call's are refused.
        self.connection: Any = get_connection(
            f"{ANYMAIL_BACKENDS}{self.esp}.EmailBackend",
            ignore_recipient_status=True,
            **self.connection_options(),
        )
        self.from_email = settings.DEFAULT_FROM_EMAIL
        self.domain = _domain(self.from_email)
        self.opened = False

    def connection_options(self) -> dict[str, Any]:
        """Keyword arguments of the anymail backend beyond the ANYMAIL settings."""
        return {}

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        outcomes: list[DispatchError | None] = [None] * len(messages)
        for call in self.calls(messages):
            sent = self._call([messages[i] for i in call])
            for index, outcome in zip(call, sent, strict=True):
                outcomes[index] = outcome
        return outcomes

    def calls(self, messages: Sequence[Message]) -> list[list[int]]:
        """The API calls for `messages`, as their indexes: identical sends together (at most
        batch_size, each address once: a batch's recipients are keyed by address), the rest
        one a call, in the order of each call's first send."""
        if not self.batches or self.batch_size == 1:
            return [[i] for i in range(len(messages))]
        calls: list[list[int]] = []
        filling: dict[tuple[str, str, str | None], list[tuple[list[int], set[str]]]] = {}
        for i, message in enumerate(messages):
            address = message.address.lower()
            candidates = filling.setdefault((message.subject, message.body, message.html), [])
            for indexes, addresses in candidates:
                if address not in addresses and len(indexes) < self.batch_size:
                    indexes.append(i)
                    addresses.add(address)
                    break
            else:
                candidates.append(([i], {address}))
                calls.append(candidates[-1][0])
        return calls

    def _call(self, batch: list[Message]) -> list[DispatchError | None]:
        """One API call for `batch` (identical sends, or one): an outcome per send."""
        try:
            self._open()
        except Exception as exc:
            error = DispatchError(f"{self.provider}: cannot start: {exc}", kind=TRANSIENT)
            return [error] * len(batch)
        try:
            email = self._email(batch)
        except Exception as exc:  # an address anymail cannot parse: nothing was sent
            error = DispatchError(f"{self.provider}: {_first_line(exc)}", kind=PERMANENT)
            return [error] * len(batch)
        try:
            self.deliver(email, batch)
        except AnymailError as exc:
            error = self.failure(exc)
            logger.info(
                "%s call for %d sends failed (%s): %s", self.provider, len(batch), error.kind, error
            )
            return [error] * len(batch)
        except Exception as exc:
            # A bug or an error anymail did not wrap: the request may have gone out.
            logger.exception("%s call for %d sends failed unexpectedly", self.provider, len(batch))
            return [DispatchError(f"{type(exc).__name__}: {exc}", kind=AMBIGUOUS)] * len(batch)
        statuses = email.anymail_status.recipients
        return [self._recipient_outcome(statuses, message) for message in batch]

    def _open(self) -> None:
        # One session (HTTP keep-alive, one boto3 client) for the dispatcher's life.
        if not self.opened:
            self.connection.open()
            self.opened = True

    def deliver(self, email: Any, batch: list[Message]) -> None:
        self.connection.send_messages([email])

    def _email(self, batch: list[Message]) -> Any:
        first = batch[0]
        email: Any = EmailMultiAlternatives(
            subject=first.subject,
            body=first.body,
            from_email=self.from_email,
            to=[message.address for message in batch],
            connection=self.connection,
        )
        if first.html:
            email.attach_alternative(first.html, "text/html")
        if len(batch) == 1:
            email.extra_headers = self.headers(first)
            email.metadata = metadata(first)
            return email
        # Batch mode: one copy per recipient, each with its own headers and metadata.
        email.merge_data = {}
        email.merge_headers = {_key(m.address): self.headers(m) for m in batch}
        email.merge_metadata = {_key(m.address): metadata(m) for m in batch}
        return email

    def headers(self, message: Message) -> dict[str, str]:
        return {
            "Message-ID": message_id_header(message.message_id, self.domain),
            "X-Gatekeeper-Message-Id": header_text(message.message_id),
            **message.headers,
        }

    def _recipient_outcome(
        self, statuses: dict[str, Any], message: Message
    ) -> DispatchError | None:
        found = _status_of(statuses, message.address)
        status = getattr(found, "status", None)
        if status in ("sent", "queued"):
            return None
        if status in ("rejected", "invalid"):
            return DispatchError(
                f"{self.provider} refused the address ({status})", kind=PERMANENT, invalid=True
            )
        if status == "failed":
            return DispatchError(f"{self.provider} could not send it (failed)", kind=PERMANENT)
        return DispatchError(
            f"{self.provider} took the call but gave no status for this recipient ({status})",
            kind=AMBIGUOUS,
        )

    def failure(self, exc: AnymailError) -> DispatchError:
        """What a failed call is worth (see the module's docstring)."""
        cause = exc.__cause__
        if isinstance(exc, AnymailAPIError):
            status = getattr(exc, "status_code", None)
            if isinstance(cause, requests.RequestException) and status is None:
                return requests_failure(self.provider, cause)
            if isinstance(cause, ClientError):
                return _client_error(self.provider, cause)
            if isinstance(cause, BotoCoreError):
                return _botocore_failure(self.provider, cause)
            if status is not None:
                response = getattr(exc, "response", None)
                headers = getattr(response, "headers", None) or {}
                return http_failure(
                    self.provider, status, headers.get("Retry-After"), _answer(response)
                )
            return DispatchError(
                f"{self.provider}: its answer could not be read: {_first_line(exc)}",
                kind=AMBIGUOUS,
            )
        # Refused by anymail before any request (an unsupported option, an address it cannot
        # encode, a missing setting): it will never work.
        return DispatchError(f"{self.provider}: {_first_line(exc)}", kind=PERMANENT)

    def close(self) -> None:
        if self.opened:
            try:
                self.connection.close()
            except Exception:
                logger.warning("Closing the %s connection failed", self.provider, exc_info=True)
            self.opened = False


class PostmarkDispatcher(AnymailDispatcher):
    esp = provider = "postmark"
    batch_size = 500  # POST /email/batch: up to 500 messages
    batches = True


class SendGridDispatcher(AnymailDispatcher):
    esp = provider = "sendgrid"
    batch_size = 1000  # POST /v3/mail/send: up to 1,000 personalizations
    batches = True


class MailgunDispatcher(AnymailDispatcher):
    esp = provider = "mailgun"
    batch_size = 1000  # batch sending: up to 1,000 recipients a message
    batches = True


class AmazonSESDispatcher(AnymailDispatcher):
    """One SendEmail per message (see the module's docstring for SendBulkEmail)."""

    esp = provider = "amazon_ses"

    def connection_options(self) -> dict[str, Any]:
        params = dict(get_anymail_setting("client_params", esp_name="Amazon SES", default={}))
        config = params.get("config") or Config()
        if not isinstance(config, Config):
            config = Config(**config)
        # botocore sends a call again when it timed out reading the answer: a second copy of
        # a message SES may have taken. One attempt; the worker decides what a failure is worth.
        params["config"] = config.merge(
            Config(retries={"mode": "standard", "total_max_attempts": 1})
        )
        return {"client_params": params}


class ResendDispatcher(AnymailDispatcher):
    """One message a call, its message id the `Idempotency-Key` Resend keeps for 24 hours."""

    esp = provider = "resend"
    idempotent = True

    def deliver(self, email: Any, batch: list[Message]) -> None:
        # Anymail has no per-message HTTP header: set it on the session for this one call.
        session = self.connection.session
        session.headers["Idempotency-Key"] = idempotency_key(batch[0].message_id)
        try:
            super().deliver(email, batch)
        finally:
            session.headers.pop("Idempotency-Key", None)

    def failure(self, exc: AnymailError) -> DispatchError:
        if getattr(exc, "status_code", None) == 409:
            # The key is still in progress or was used for another body: a request with it got
            # there first, and may have been sent.
            return DispatchError(f"{self.provider}: {_first_line(exc)}", kind=AMBIGUOUS)
        return super().failure(exc)


DISPATCHERS: dict[str, type[AnymailDispatcher]] = {
    cls.esp: cls
    for cls in (
        AmazonSESDispatcher,
        MailgunDispatcher,
        PostmarkDispatcher,
        ResendDispatcher,
        SendGridDispatcher,
    )
}


@functools.cache
def anymail_dispatcher_class(esp: str) -> type[AnymailDispatcher]:
    """The dispatcher of an ESP (a module of anymail.backends): its own, or, for an ESP without
    one, one API call per message (every anymail backend makes those), rated under its name."""
    known = DISPATCHERS.get(esp)
    if known is not None:
        return known
    return type(f"AnymailDispatcher_{esp}", (AnymailDispatcher,), {"esp": esp, "provider": esp})


def metadata(message: Message) -> dict[str, str]:
    """What the ESP hands back with each tracking event: whose send it was."""
    message_id = message.message_id
    if len(message_id) > _METADATA_VALUE_MAX:
        message_id = "sha256:" + hashlib.sha256(message_id.encode()).hexdigest()[:64]
    return {"user_id": str(message.user_id), "message_id": message_id}


def message_id_header(message_id: str, domain: str) -> str:
    """A Message-ID that is a function of the message id alone: a copy sent again has the same.
    Its left part is the id with every character outside RFC 5322's atext %-encoded (so no dot
    problems either); a long one is a hash of it."""
    local = "".join(
        c if c in _ATEXT else "".join(f"%{b:02X}" for b in c.encode()) for c in message_id
    )
    if not local or len(local) > _MESSAGE_ID_LOCAL_MAX:
        local = "sha256-" + hashlib.sha256(message_id.encode()).hexdigest()[:40]
    return f"<{local}@{domain}>"


def header_text(message_id: str) -> str:
    """The message id as a header value: as it is when it is visible ASCII and spaces (the
    usual case, and what the SMTP dispatcher sends), else %-encoded (no line breaks reach an
    ESP's headers)."""
    if all(" " <= c <= "~" for c in message_id):
        return message_id
    return "".join(
        c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
        for c in message_id
    )


def idempotency_key(message_id: str) -> str:
    """Resend's key: the message id when it fits (visible ASCII, 256 characters), else its hash."""
    if len(message_id) <= 256 and all("!" <= c <= "~" for c in message_id):
        return message_id
    return "sha256:" + hashlib.sha256(message_id.encode()).hexdigest()


def http_failure(
    provider: str, status: int, retry_after: str | None, detail: str = ""
) -> DispatchError:
    """An ESP's HTTP answer that is not a success."""
    detail = f": {detail}" if detail else ""
    if status == 429:
        return DispatchError(
            f"{provider} answered 429 (too many requests){detail}",
            kind=THROTTLED,
            retry_after=retry_after_seconds(retry_after),
        )
    if status == 408 or status >= 500:
        return DispatchError(f"{provider} answered {status}{detail}", kind=TRANSIENT)
    if 400 <= status < 500:
        return DispatchError(f"{provider} refused the call ({status}){detail}", kind=PERMANENT)
    # A success whose body anymail could not read (or that reports an error in it): some of
    # the call may have gone out.
    return DispatchError(
        f"{provider} answered {status} but not as expected{detail}", kind=AMBIGUOUS
    )


def _client_error(provider: str, err: ClientError) -> DispatchError:
    """An AWS API error answer (Amazon SES)."""
    meta = err.response.get("ResponseMetadata", {})
    headers = meta.get("HTTPHeaders", {})  # lower-case names
    code = err.response.get("Error", {}).get("Code", "")
    status = meta.get("HTTPStatusCode") or 400
    if code in SES_THROTTLING:
        status = 429
    message = err.response.get("Error", {}).get("Message", "")
    return http_failure(provider, status, headers.get("retry-after"), f"{code} {message}".strip())


def _botocore_failure(provider: str, err: BotoCoreError) -> DispatchError:
    """A botocore error without an AWS answer."""
    if isinstance(err, BotoSSLError):
        if certificate_refused(err):
            return DispatchError(f"{provider}: certificate refused, nothing sent", kind=TRANSIENT)
        return DispatchError(f"{provider}: TLS failure, the request may be there", kind=AMBIGUOUS)
    if isinstance(err, EndpointConnectionError):  # refused, unresolved, connect timeout
        return DispatchError(f"{provider} unreachable, nothing sent: {err}", kind=TRANSIENT)
    if isinstance(err, NoCredentialsError | PartialCredentialsError | NoRegionError):
        return DispatchError(f"{provider}: no credentials, nothing sent: {err}", kind=TRANSIENT)
    if isinstance(err, ParamValidationError):
        return DispatchError(f"{provider}: {err}", kind=PERMANENT)
    # A read timeout, a connection closed before the answer (ReadTimeoutError,
    # ConnectionClosedError) or anything else once the request was made.
    return DispatchError(f"{provider}: no complete answer: {err}", kind=AMBIGUOUS)


def _key(address: str) -> str:
    """How anymail keys a batch's recipients (merge_headers, statuses): the address's addr-spec."""
    return str(parse_single_address(address).addr_spec)


def _status_of(statuses: dict[str, Any], address: str) -> Any:
    try:
        key = _key(address)
    except AnymailError:
        key = address
    found = statuses.get(key)
    if found is None:
        # Some ESPs answer with the address lower-cased.
        lowered = key.lower()
        found = next((s for k, s in statuses.items() if k.lower() == lowered), None)
    return found


def _domain(from_email: str) -> str:
    domain = parseaddr(from_email)[1].rpartition("@")[2].strip().lower()
    try:
        return domain.encode("idna").decode("ascii") if domain else "gatekeeper.invalid"
    except UnicodeError:
        return "gatekeeper.invalid"


def _answer(response: Any) -> str:
    """An ESP's error answer, on one line and short: what it said is in there."""
    text = getattr(response, "text", "") or ""
    return " ".join(str(text).split())[:300]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
