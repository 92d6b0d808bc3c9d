"""The email providers' tracking webhooks feed the suppression list.

Anymail serves each ESP's tracking webhook at /anymail/<esp>/tracking/ (gatekeeper/urls.py),
checks it and turns the ESP's payload into normalized events (anymail.signals.tracking);
`tracking_received` (connected in worker/apps.py) puts the user on the email suppression list
for good reasons only (and counts complaints and hard bounces for the brakes of the recipient's
mailbox provider, worker/delivery/brakes.py):
- `complained` (a spam complaint): reason `complained`;
- `unsubscribed` (the ESP's own unsubscribe link or list): reason `unsubscribed`;
- `bounced` when the bounce is permanent: reason `bounced`. Anymail reports several ESPs' soft
  bounces as `bounced` too (Postmark's SoftBounce, SES's Transient bounces, SendGrid's blocks,
  Brevo's and Mandrill's soft_bounce): a soft bounce says nothing about the address, so each
  ESP's own field decides (`_HARD_BOUNCE`); a bounce from an ESP not listed there suppresses
  nobody and is logged.
The user is the one in the event's metadata, which every send carries (worker/delivery/esp.py).
An event without it (a message sent some other way) is logged and ignored: the address alone
does not say which user it is.

Security: the webhooks take HTTP basic auth with ANYMAIL_WEBHOOK_SECRET ("user:password", or a
JSON list of them while rotating); configure each ESP's webhook URL as
https://user:password@<host>/anymail/<esp>/tracking/. Mailgun's are checked against its
webhook signing key as well (ANYMAIL_MAILGUN_WEBHOOK_SIGNING_KEY). A request without the secret
is refused (HTTP 400) before any event is read. Anymail itself only warns when no secret is
set and takes anyone's posts: here every event is then refused (HTTP 400, and the ESP posts it
again later), so that nobody can put users on the list with a forged bounce.

A receiver that raises makes the webhook answer 500, and the ESP posts the event again later: a
database error is not swallowed here. Suppressing someone twice changes nothing.
"""

import logging
from collections.abc import Callable
from typing import Any

from anymail.exceptions import AnymailWebhookValidationFailure
from anymail.signals import AnymailTrackingEvent, EventType
from django.conf import settings

from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.integers import NotAWholeNumber, whole_number
from limits.channels import EMAIL
from limits.models.people import Suppression
from limits.people.suppression import suppress
from worker.delivery.brakes import BOUNCED, COMPLAINED, brake_count
from worker.delivery.mailboxes import mailboxes

logger = logging.getLogger(__name__)


def _postmark(event: AnymailTrackingEvent) -> bool:
    esp_event = event.esp_event or {}
    if esp_event.get("RecordType") == "SubscriptionChange":
        return esp_event.get("SuppressionReason") == "HardBounce"
    return esp_event.get("Type") == "HardBounce"


def _amazon_ses(event: AnymailTrackingEvent) -> bool:
    return (event.esp_event or {}).get("bounce", {}).get("bounceType") == "Permanent"


def _sendgrid(event: AnymailTrackingEvent) -> bool:
    # A bounce event's type is "bounce" (permanent) or "blocked" (refused for now).
    return (event.esp_event or {}).get("type", "bounce") == "bounce"


def _mailgun(event: AnymailTrackingEvent) -> bool:
    # Anymail reports Mailgun's temporary failures as deferred; of the permanent ones, a bounce
    # (or a send suppressed for an earlier bounce) is about the address, not "old" or "espblock".
    return event.reject_reason == "bounced"


def _brevo_or_mandrill(event: AnymailTrackingEvent) -> bool:
    return (event.esp_event or {}).get("event") == "hard_bounce"


def _mailjet(event: AnymailTrackingEvent) -> bool:
    return bool((event.esp_event or {}).get("hard_bounce"))


def _resend(event: AnymailTrackingEvent) -> bool:
    # email.bounced is a permanent rejection (Resend's documentation); its bounce type says so.
    bounce = ((event.esp_event or {}).get("data") or {}).get("bounce") or {}
    return bounce.get("type", "Permanent") == "Permanent"


def _deferred_when_soft(event: AnymailTrackingEvent) -> bool:
    # Anymail reports this ESP's soft bounces as deferred: `bounced` is a hard one.
    return True


# Per anymail esp_name: whether a `bounced` event is a permanent bounce.
_HARD_BOUNCE: dict[str, Callable[[AnymailTrackingEvent], bool]] = {
    "Amazon SES": _amazon_ses,
    "Brevo": _brevo_or_mandrill,
    "SendinBlue": _brevo_or_mandrill,
    "Mailgun": _mailgun,
    "Mailjet": _mailjet,
    "Mailtrap": _deferred_when_soft,
    "Mandrill": _brevo_or_mandrill,
    "Postmark": _postmark,
    "Resend": _resend,
    "SendGrid": _sendgrid,
    "Unisender Go": _deferred_when_soft,
}


def suppression_reason(event: AnymailTrackingEvent, esp_name: str) -> str | None:
    """The suppression reason an event gives, or None when it suppresses nobody."""
    if event.event_type == EventType.COMPLAINED:
        return Suppression.Reason.COMPLAINED
    if event.event_type == EventType.UNSUBSCRIBED:
        return Suppression.Reason.UNSUBSCRIBED
    if event.event_type != EventType.BOUNCED:
        return None
    hard = _HARD_BOUNCE.get(esp_name)
    if hard is None:
        logger.warning(
            "A bounce from %s, whose soft and hard bounces are not told apart here: nobody "
            "suppressed",
            esp_name,
        )
        return None
    return Suppression.Reason.BOUNCED if hard(event) else None


# What the brakes count (worker/delivery/brakes.py) of the suppressing events.
_BRAKE_FIGURES: dict[str, str] = {
    Suppression.Reason.COMPLAINED: COMPLAINED,
    Suppression.Reason.BOUNCED: BOUNCED,
}


def user_of(event: AnymailTrackingEvent) -> int | None:
    """The user id our metadata gave the message, or None."""
    value = (event.metadata or {}).get("user_id")
    text = str(value).strip() if isinstance(value, str | int) else ""
    try:
        return whole_number(text, maximum=max_user_id(), what="A user id")
    except NotAWholeNumber:
        return None


def tracking_received(
    sender: Any, event: AnymailTrackingEvent, esp_name: str, **kwargs: Any
) -> None:
    """Receiver of anymail.signals.tracking: suppress the user for a hard bounce, a complaint or
    an unsubscribe (see the module's docstring)."""
    if not (getattr(settings, "ANYMAIL", None) or {}).get("WEBHOOK_SECRET"):
        raise AnymailWebhookValidationFailure(
            f"{esp_name} tracking event refused: ANYMAIL_WEBHOOK_SECRET is not set, so nothing "
            "proves it comes from the provider"
        )
    reason = suppression_reason(event, esp_name)
    if reason is None:
        return
    figure = _BRAKE_FIGURES.get(reason)
    if figure is not None and event.recipient:
        # The brakes count it by the recipient's mailbox provider, whoever the user is.
        brake_count(figure, {mailboxes().group_of(event.recipient): 1})
    user_id = user_of(event)
    if user_id is None:
        logger.warning(
            "%s %s event (message %s) carries no gatekeeper user id: nobody suppressed",
            esp_name,
            event.event_type,
            event.message_id,
        )
        return
    added = suppress(
        channel=EMAIL,
        user_ids=[user_id],
        reason=reason,
        source=f"esp:{esp_name}",
        note=str(event.description or event.mta_response or event.event_type),
    )
    logger.info(
        "%s %s event: user %s %s",
        esp_name,
        event.event_type,
        user_id,
        "suppressed" if added else "already suppressed",
    )
