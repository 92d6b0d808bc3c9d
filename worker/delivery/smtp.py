"""Email through Django's email backends: SMTP in production (EMAIL_URL), the console or
nothing on a laptop. SMTP's exchange is run step by step so that a send is ambiguous only when
the server may really have taken it."""

import contextlib
import re
from typing import Any, ClassVar

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend
from django.core.mail.message import sanitize_address

from limits.channels import EMAIL
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    TRANSIENT,
    DispatchError,
    Message,
    OneAtATime,
)


class EmailDispatcher(OneAtATime):
    """Email through Django's configured email backend (SMTP in production).

    SMTP has no idempotency key, so the worker must know exactly when a message may have been
    delivered. With the SMTP backend the exchange is run step by step (`_send_smtp`): a failure
    before the message's final "." is transient (a server discards an unfinished message), a
    refusal is transient or permanent by its code, and only a connection lost while waiting for
    the answer to the final "." is ambiguous: the server may have taken the message. Every
    socket operation gives up after EMAIL_TIMEOUT seconds."""

    provider: ClassVar[str] = "smtp"
    channels: ClassVar[tuple[str, ...]] = (EMAIL,)

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
