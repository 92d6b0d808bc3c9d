"""Delivery channels: one small class per channel with one `send()`.

A failed send raises DispatchError saying what a retry is worth:
- TRANSIENT: nothing was delivered and trying again later may work (timeouts before sending,
  5xx, connection refused): the worker retries with backoff.
- PERMANENT: it will never work (unknown address, 4xx): the worker gives the quota back.
- AMBIGUOUS: it may have been delivered (the connection broke after the request went out):
  the worker keeps the quota and does not send again, because a double send is worse than a
  lost one for marketing.
  With `invalid=True` the provider said the address or push token itself is dead
  (unregistered, uninstalled app, unknown mailbox): the send job lists it for its caller.
- THROTTLED: the provider refused it for its rate (HTTP 429), nothing was delivered: every
  worker holds off the provider for `retry_after` seconds (or one), then it is sent again
  (worker/throttle.py).

`provider` names the provider for its sending rate (`GATEKEEPER_PROVIDER_RATES`).

`batch_size` says how many sends the worker claims at once before handing them over. A
dispatcher that makes one provider call per message keeps 1, so a worker killed mid-chunk leaves
at most one send unknown. One whose sends have no outside effect (null, memory) or that hands a
whole batch to its provider in one call (`send_many`) claims that many in one Redis round trip.

`idempotent` says the provider deduplicates by the message id (an idempotency key): a send whose
outcome is unknown is then sent again with the same key instead of being counted as ambiguous.

`address_problem(address)` (a class method) says why an address or token cannot be sent to, or
None; send jobs check every recipient with it when they are created.
"""

import contextlib
import email.utils
import json
import logging
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend
from django.core.mail.message import sanitize_address
from django.core.validators import validate_email
from django.template import TemplateDoesNotExist
from django.template.base import TextNode, Variable, VariableNode
from django.template.loader import get_template, render_to_string
from django.utils.module_loading import import_string

from gatekeeper.lib.bodies import words_for_pattern
from limits.channels import channels as dispatch_channels
from limits.unsubscribe import unsubscribe_headers
from worker.gate import MARKETING

logger = logging.getLogger(__name__)

TRANSIENT, PERMANENT, AMBIGUOUS, THROTTLED = "transient", "permanent", "ambiguous", "throttled"


class DispatchError(Exception):
    def __init__(
        self,
        message: str,
        *,
        kind: str = TRANSIENT,
        retry_after: float | None = None,
        invalid: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after  # THROTTLED: seconds the provider asked for
        # PERMANENT only: the provider says the address or token is dead (unregistered push
        # token, unknown mailbox); the job reports it back to its caller.
        self.invalid = invalid

    @property
    def permanent(self) -> bool:
        return self.kind == PERMANENT


@dataclass
class Message:
    """One rendered send."""

    message_id: str
    user_id: int
    address: str
    subject: str
    body: str
    html: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # email: added to the message's own


TEMPLATE_NAME_WORDS = (
    "A template name is 1 to 100 lower-case letters, digits, - and _, starting with a letter or "
    "digit (templates/<channel>/<name>/)."
)
TEMPLATE_NAME = words_for_pattern("^[a-z0-9][a-z0-9_-]{0,99}$", TEMPLATE_NAME_WORDS)
TEMPLATE_NAME_RE = re.compile(TEMPLATE_NAME)


def template_check(*, channel: str, template: str) -> None:
    """Raise TemplateDoesNotExist unless the channel's templates for `template` exist."""
    names = ("subject.txt", "body.txt") if channel == "email" else ("title.txt", "body.txt")
    for name in names:
        render_to_string(f"{channel}/{template}/{name}", {})


def template_names() -> list[str]:
    """The templates a send job may name: those of the project's templates directory that are
    complete for at least one channel (a job is refused when its channel lacks them)."""
    found = set()
    directories: list[Any] = list(settings.TEMPLATES[0]["DIRS"])  # type: ignore[call-overload]
    for directory in directories:
        for channel in dispatch_channels():
            root = Path(directory) / channel
            if not root.is_dir():
                continue
            for candidate in root.iterdir():
                if not TEMPLATE_NAME_RE.fullmatch(candidate.name):
                    continue
                try:
                    template_check(channel=channel, template=candidate.name)
                except TemplateDoesNotExist:
                    continue
                found.add(candidate.name)
    return sorted(found)


# Filters whose output is not a function of their input alone: a template using one is
# rendered for every recipient.
_UNSTABLE_FILTERS = frozenset({"random"})
_REMEMBERED = 4096  # outputs one template keeps, per chunk
_REMEMBERED_CHARACTERS = 1_000_000  # and characters: personal HTML bodies seldom repeat
_MISSING = object()  # a name the context lacks (renders unlike None)


class _Template:
    """A compiled template that remembers its outputs when it can.

    A template made only of text and `{{ variables|filters }}` renders the same text for the
    same values of the names it reads, and a campaign's texts mostly repeat (the same offer,
    a handful of cities or first names): such a template is rendered once per distinct set of
    values, then read from a dictionary (at most _REMEMBERED outputs and _REMEMBERED_CHARACTERS;
    afterwards the rest are rendered). Any other template (tags), or other values than texts, is rendered every time."""

    def __init__(self, template: Any) -> None:
        self.template = template
        self.names = _names_read(template)
        self.outputs: dict[tuple[Any, ...], str] = {}
        self.room = _REMEMBERED_CHARACTERS

    def render(self, context: dict[str, Any]) -> str:
        if self.names is None:
            return self.template.render(context)
        key = tuple([context.get(name, _MISSING) for name in self.names])
        # Only texts and absent names make keys: 1, 1.0 and True are equal keys that render
        # differently, and a list is no key at all.
        if not all(type(value) is str or value is _MISSING for value in key):
            return self.template.render(context)
        output = self.outputs.get(key)
        if output is None:
            output = self.template.render(context)
            if len(self.outputs) < _REMEMBERED and len(output) <= self.room:
                self.outputs[key] = output
                self.room -= len(output)
        return output


def _names_read(template: Any) -> tuple[str, ...] | None:
    """The context names a template of text and variables reads, or None when its output may
    depend on more than their values (tags, unstable filters, another engine)."""
    nodelist = getattr(getattr(template, "template", None), "nodelist", None)
    if nodelist is None:
        return None
    names: set[str] = set()

    def read(value: Any) -> None:
        if isinstance(value, Variable) and value.lookups:
            names.add(value.lookups[0])

    for node in nodelist:
        if isinstance(node, TextNode):
            continue
        if not isinstance(node, VariableNode):
            return None
        expression = node.filter_expression
        read(expression.var)
        for function, arguments in expression.filters:
            if getattr(function, "_filter_name", None) in _UNSTABLE_FILTERS:
                return None
            for _lookup, argument in arguments:
                read(argument)
    return tuple(sorted(names))


class Renderer:
    """A job's templates, loaded and compiled once, rendered per recipient."""

    def __init__(
        self, *, channel: str, template: str, campaign: str, category: str = MARKETING
    ) -> None:
        self.channel, self.campaign = channel, campaign
        # Marketing email carries its one-click unsubscribe link (RFC 8058); receipts do not.
        self.unsubscribable = channel == "email" and category == MARKETING
        title = "subject.txt" if channel == "email" else "title.txt"
        self.title = _Template(get_template(f"{channel}/{template}/{title}"))
        self.body = _Template(get_template(f"{channel}/{template}/body.txt"))
        self.html = None
        if channel == "email":
            try:
                self.html = _Template(get_template(f"email/{template}/body.html"))
            except TemplateDoesNotExist:
                self.html = None
        self.subjects: dict[str, str] = {}  # a title as rendered: its spaces made one

    def __call__(self, recipient: dict[str, Any]) -> Message:
        data = recipient.get("context") or {}
        context = {**data, "user_id": recipient["user_id"], "campaign": self.campaign}
        title = self.title.render(context)
        subject = self.subjects.get(title)
        if subject is None:
            subject = " ".join(title.split())
            if len(self.subjects) < _REMEMBERED:
                self.subjects[title] = subject
        return Message(
            message_id=recipient["message_id"],
            user_id=recipient["user_id"],
            address=recipient["address"],
            subject=subject,
            body=self.body.render(context),
            html=self.html.render(context) if self.html is not None else None,
            data=data,
            headers=(
                unsubscribe_headers(user_id=recipient["user_id"], channel=self.channel)
                if self.unsubscribable
                else {}
            ),
        )


def send_many(dispatcher: Any, messages: list[Message]) -> list[DispatchError | None]:
    """Send a batch through `dispatcher`: its own `send_many` when it has one, else one `send`
    per message. One outcome per message, in order: None (sent) or the DispatchError."""
    own = getattr(dispatcher, "send_many", None)
    if own is not None:
        return list(own(messages))
    outcomes: list[DispatchError | None] = []
    for message in messages:
        try:
            dispatcher.send(message)
            outcomes.append(None)
        except DispatchError as exc:
            outcomes.append(exc)
        except Exception as exc:
            # A dispatcher bug or an error it did not classify: the send may have gone out.
            logger.exception("Send %s failed unexpectedly", message.message_id)
            outcomes.append(DispatchError(f"{type(exc).__name__}: {exc}", kind=AMBIGUOUS))
    return outcomes


class SendsInBatches:
    """A dispatcher whose provider takes a batch in one call (`send_many`): `send` is a batch of
    one, raising its DispatchError."""

    def send(self, message: Message) -> None:
        (outcome,) = self.send_many([message])
        if outcome is not None:
            raise outcome

    def send_many(self, messages: list[Message]) -> list[DispatchError | None]:
        raise NotImplementedError


class EmailDispatcher:
    """Email through Django's configured email backend (SMTP in production).

    SMTP has no idempotency key, so the worker must know exactly when a message may have been
    delivered. With the SMTP backend the exchange is run step by step (`_send_smtp`): a failure
    before the message's final "." is transient (a server discards an unfinished message), a
    refusal is transient or permanent by its code, and only a connection lost while waiting for
    the answer to the final "." is ambiguous: the server may have taken the message. Every
    socket operation gives up after EMAIL_TIMEOUT seconds."""

    batch_size: ClassVar[int] = 1
    idempotent: ClassVar[bool] = False
    provider: ClassVar[str] = "smtp"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if len(address) > 254:
            return "An email address is at most 254 characters."
        try:
            validate_email(address)
        except ValidationError:
            return f"'{_shown(address)}' is not an email address."
        return None

    def __init__(self) -> None:
        self.connection: Any = get_connection()

    def send(self, message: Message) -> None:
        email = EmailMultiAlternatives(
            subject=message.subject,
            body=message.body,
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[message.address],
            headers={"X-Gatekeeper-Message-Id": message.message_id, **message.headers},
            connection=self.connection,
        )
        if message.html:
            email.attach_alternative(message.html, "text/html")
        if isinstance(self.connection, SMTPBackend):
            self._send_smtp(email)
            return
        try:
            email.send()  # console, file, locmem, dummy: nothing goes over a network
        except Exception as exc:
            raise DispatchError(f"email backend: {exc}", kind=TRANSIENT) from exc

    def _send_smtp(self, email: EmailMultiAlternatives) -> None:
        backend = self.connection
        try:
            backend.open()  # connect, TLS, login: nothing sent yet
        except OSError as exc:  # smtplib's errors are OSErrors
            self._reset()
            raise DispatchError(f"SMTP unavailable: {exc}", kind=TRANSIENT) from exc
        smtp = backend.connection
        encoding = email.encoding or settings.DEFAULT_CHARSET
        sender = sanitize_address(email.from_email, encoding)
        recipients = [sanitize_address(a, encoding) for a in email.recipients()]
        mime: Any = email.message()  # Django's SafeMIME classes take linesep
        data = _smtp_data(mime.as_bytes(linesep="\r\n"))
        try:
            smtp.ehlo_or_helo_if_needed()
            _expect(smtp.mail(sender), (250,), "MAIL FROM")
            for recipient in recipients:
                _expect(smtp.rcpt(recipient), (250, 251), f"RCPT TO {recipient}")
            _expect(smtp.docmd("data"), (354,), "DATA")
            smtp.send(data)
        except _Refused as refused:
            with contextlib.suppress(OSError):
                smtp.rset()
            raise DispatchError(str(refused), kind=refused.kind) from refused
        except OSError as exc:
            self._reset()
            raise DispatchError(
                f"SMTP connection lost before the message was complete: {exc}", kind=TRANSIENT
            ) from exc
        try:
            code, reply = smtp.getreply()
        except OSError as exc:
            self._reset()
            raise DispatchError(
                f"SMTP: no answer once the message was sent; the server may have taken it ({exc})",
                kind=AMBIGUOUS,
            ) from exc
        if code != 250:
            kind = PERMANENT if 500 <= code < 600 else TRANSIENT
            raise DispatchError(f"SMTP refused the message: {code} {reply!r}", kind=kind)

    def _reset(self) -> None:
        """Drop a connection in an unknown state; the next send opens a new one."""
        with contextlib.suppress(Exception):
            self.connection.close()
        self.connection.connection = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()


class _Refused(Exception):
    def __init__(self, step: str, code: int, reply: bytes) -> None:
        super().__init__(f"SMTP {step}: {code} {reply!r}")
        self.kind = PERMANENT if 500 <= code < 600 else TRANSIENT


def _expect(answer: tuple[int, bytes], codes: tuple[int, ...], step: str) -> None:
    code, reply = answer
    if code not in codes:
        raise _Refused(step, code, reply)


def _smtp_data(message: bytes) -> bytes:
    """A message as DATA carries it: CRLF line ends, leading dots doubled, ending "." line."""
    data = re.sub(rb"(?:\r\n|\n|\r(?!\n))", b"\r\n", message)
    data = re.sub(rb"(?m)^\.", b"..", data)
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n"


PUSH_TOKEN = re.compile(r"[!-~]+")  # visible ASCII: one regex pass, not a Python loop per character


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


class PushBackend:
    batch_size: ClassVar[int] = 1
    idempotent: ClassVar[bool] = False
    provider: ClassVar[str] = "push"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        """A push token: 1 to 4,096 visible ASCII characters, no spaces (FCM registration
        tokens, APNs device tokens and relay ids all fit). A backend may be stricter."""
        if not address or len(address) > 4096:
            return "A push token is 1 to 4,096 characters."
        if not PUSH_TOKEN.fullmatch(address):
            return f"'{_shown(address)}' is not a push token (visible ASCII characters, no spaces)."
        return None

    def send(self, message: Message) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to close by default."""


class ConsolePushBackend(PushBackend):
    """Prints each push (development)."""

    provider: ClassVar[str] = "console"

    def send(self, message: Message) -> None:
        print(
            f"push to {message.address} (user {message.user_id}): {message.subject} | {message.body.strip()}"
        )


class MemoryPushBackend(PushBackend):
    """Keeps pushes in a list (tests)."""

    outbox: ClassVar[list[Message]] = []
    batch_size: ClassVar[int] = 1000
    provider: ClassVar[str] = "memory"

    def send(self, message: Message) -> None:
        self.outbox.append(message)


class NullPushBackend(PushBackend):
    """Drops every push (benchmarks)."""

    batch_size: ClassVar[int] = 1000
    provider: ClassVar[str] = "null"

    def send(self, message: Message) -> None:
        return None

    def send_many(self, messages: list[Message]) -> list[DispatchError | None]:
        return [None] * len(messages)


class WebhookPushBackend(PushBackend):
    """POSTs each push as JSON to a provider relay; the message id is the idempotency key, so
    a relay that honours it never delivers a retried push twice, and a push whose outcome is
    unknown (a worker died during it, the relay timed out) is sent again with the same key."""

    idempotent: ClassVar[bool] = True
    provider: ClassVar[str] = "webhook"

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


def retry_after_seconds(header: str | None) -> float | None:
    """An HTTP Retry-After header's delay in seconds (delta-seconds or an HTTP date), at most
    an hour; None when absent or unreadable."""
    if not header:
        return None
    header = header.strip()
    if header.isascii() and header.isdigit():
        return float(min(int(header), 3600))
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(3600.0, max(0.0, (when - datetime.now(UTC)).total_seconds()))


def dispatcher_class(channel: str) -> Any:
    if channel == "email":
        backend = str(settings.EMAIL_BACKEND)
        if backend.startswith("anymail.backends."):
            # An email service provider's API (GATEKEEPER_EMAIL_PROVIDER): its dispatcher is
            # found by name, as push backends are, since worker.email_providers builds on this
            # module.
            return import_string("worker.email_providers.anymail_dispatcher_class")(backend)
        return EmailDispatcher
    return import_string(settings.GATEKEEPER_PUSH_BACKEND)


def dispatcher_for(channel: str) -> Any:
    return dispatcher_class(channel)()
