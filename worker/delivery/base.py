"""The delivery contract: what every dispatcher (one per provider family, worker/delivery/)
keeps, the message it sends and the error it raises.

A dispatcher (`Dispatcher`) sends a batch (`send_many`) and answers one outcome per message, in
order: None (sent) or a DispatchError saying what a retry is worth:
- TRANSIENT: nothing was delivered and trying again later may work (timeouts before sending,
  5xx, connection refused): the worker retries with backoff.
- PERMANENT: it will never work (unknown address, 4xx): the worker gives the quota back.
  With `invalid=True` the provider said the address or push token itself is dead
  (unregistered, uninstalled app, unknown mailbox, a number that is no mobile): the send job
  lists it for its caller. With `opted_out=True` the provider said this person opted out of
  this channel with it (Twilio's 21610: they replied STOP): the worker puts the user on the
  channel's suppression list (source `opted_out_source(provider)`), so the gate stops their
  marketing there before anything is charged.
- AMBIGUOUS: it may have been delivered (the connection broke after the request went out):
  the worker keeps the quota and does not send again, because a double send is worse than a
  lost one for marketing.
- THROTTLED: the provider refused it for its rate (HTTP 429), nothing was delivered: every
  worker holds off the provider for `retry_after` seconds (or one), then it is sent again
  (worker/delivery/throttle.py).

`provider` names the provider for its sending rate (`GATEKEEPER_PROVIDER_RATES`); `channels`
the channels it can send (empty: any; the registry refuses it for another at start-up).

`batch_size` says how many sends the worker claims at once before handing them over. A
dispatcher that makes one provider call per message keeps 1, so a worker killed mid-chunk leaves
at most one send unknown. One whose sends have no outside effect (null, memory) or that hands a
whole batch to its provider in one call claims that many in one Redis round trip.

`idempotent` says the provider deduplicates by the message id (an idempotency key): a send whose
outcome is unknown is then sent again with the same key instead of being counted as ambiguous.

`address_problem(address)` (a class method) says why an address cannot be sent to by this
provider, or None. The channel's own rule (worker/delivery/addresses.py) is asked first; a
provider may be stricter (APNs takes hex device tokens only). Send jobs check every recipient
when they are created.

`close()` lets go of connections and clients once a chunk's sends are done.

Most providers take one message a call (`OneAtATime`: write `send`); a provider that takes a
batch in one call writes `send_many` (`SendsInBatches`).
"""

import email.utils
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol

import msgspec

logger = logging.getLogger(__name__)

TRANSIENT, PERMANENT, AMBIGUOUS, THROTTLED = "transient", "permanent", "ambiguous", "throttled"
# Never handed to the provider: its mailbox provider's rate had no room for it soon
# (worker/delivery/mailboxes.py); sent by a later chunk after `retry_after` s, no attempt spent.
POSTPONED = "postponed"


class DispatchError(Exception):
    def __init__(
        self,
        message: str,
        *,
        kind: str = TRANSIENT,
        retry_after: float | None = None,
        invalid: bool = False,
        opted_out: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after  # THROTTLED: seconds the provider asked for
        # PERMANENT only: the provider says the address or token is dead (unregistered push
        # token, unknown mailbox); the job reports it back to its caller.
        self.invalid = invalid
        # PERMANENT only: the provider says the person opted out of this channel (a STOP
        # reply); the worker suppresses the user on the channel.
        self.opted_out = opted_out

    @property
    def permanent(self) -> bool:
        return self.kind == PERMANENT


def opted_out_source(provider: str) -> str:
    """The suppression list's source of an entry a provider's opted-out answer made."""
    return f"provider:{provider}"


class Recipient(msgspec.Struct, frozen=True, omit_defaults=True):
    """One recipient of a chunk, as the worker runs it and the renderer reads it: typed (a
    chunk stores its recipients as JSON objects, worker/recipients.py's; encoded back the same,
    a default left out)."""

    user_id: int
    address: str
    message_id: str
    context: dict[str, Any] = {}
    time_zone: str | None = None


def recipients_typed(rows: list[Any]) -> list[Recipient]:
    """A chunk's stored recipients as Recipients, converted in C."""
    return msgspec.convert(rows, list[Recipient])


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


class Dispatcher(Protocol):
    """What the worker asks of a dispatcher (the module's docstring says what each means)."""

    provider: ClassVar[str]
    channels: ClassVar[tuple[str, ...]]
    batch_size: ClassVar[int]
    idempotent: ClassVar[bool]

    @classmethod
    def address_problem(cls, address: str) -> str | None: ...

    @classmethod
    def settings_problems(cls) -> list[str]: ...

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]: ...

    def close(self) -> None: ...


class DispatcherBase:
    """The defaults: one send a claim, no idempotency key, no rule of its own for addresses,
    nothing to close."""

    provider: ClassVar[str] = ""
    channels: ClassVar[tuple[str, ...]] = ()  # the channels it can send; empty: any
    batch_size: ClassVar[int] = 1
    idempotent: ClassVar[bool] = False

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        return None

    @classmethod
    def settings_problems(cls) -> list[str]:
        """What is wrong with its settings, in words (the start-up check warns with them)."""
        return []

    def close(self) -> None:
        """Nothing to close by default."""


class OneAtATime(DispatcherBase):
    """A dispatcher whose provider takes one message a call: `send` raises its DispatchError,
    and a batch is sent a message at a time."""

    def send(self, message: Message) -> None:
        raise NotImplementedError

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        outcomes: list[DispatchError | None] = []
        for message in messages:
            try:
                self.send(message)
                outcomes.append(None)
            except DispatchError as exc:
                outcomes.append(exc)
            except Exception as exc:
                # A dispatcher bug or an error it did not classify: the send may have gone out.
                logger.exception("Send %s failed unexpectedly", message.message_id)
                outcomes.append(DispatchError(f"{type(exc).__name__}: {exc}", kind=AMBIGUOUS))
        return outcomes


class SendsInBatches(DispatcherBase):
    """A dispatcher whose provider takes a batch in one call (`send_many`): `send` is a batch of
    one, raising its DispatchError."""

    def send(self, message: Message) -> None:
        (outcome,) = self.send_many([message])
        if outcome is not None:
            raise outcome

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        raise NotImplementedError


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """An error and every error it wraps, each once: Python's chain (`__cause__`,
    `__context__`), the arguments (requests wraps urllib3's error there), urllib3's `reason`,
    firebase's `cause` and botocore's keyword arguments. Client libraries wrap the transport's
    error that tells whether a request can have reached the provider."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen or len(seen) > 50:
            continue
        seen.add(id(current))
        yield current
        linked = [
            current.__cause__,
            current.__context__,
            *current.args,
            getattr(current, "reason", None),
            getattr(current, "cause", None),
            *(getattr(current, "kwargs", None) or {}).values(),
        ]
        pending.extend(e for e in linked if isinstance(e, BaseException))


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
