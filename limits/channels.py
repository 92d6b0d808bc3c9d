"""The channels a cap can name. `all` is the cross-channel scope."""

from django.conf import settings
from django.core.exceptions import ValidationError

ALL = "all"
# The channels the product itself knows by name (a dispatcher for each, an address rule, words
# for people). Which of them a deployment uses is GATEKEEPER_CHANNELS.
EMAIL = "email"
PUSH = "push"
SMS = "sms"


def channels() -> list[str]:
    """Delivery channels from settings, in their configured order (without `all`)."""
    return list(settings.GATEKEEPER_CHANNELS)


def scopes() -> list[str]:
    """Everything a cap can apply to: each channel, then `all`."""
    return [*channels(), ALL]


def validate_scope(value: str, *, field: str | None = None) -> None:
    """The one rule for a scope (a channel or `all`). With `field`, the ValidationError names it
    (the REST API's base answers it as that field's 400)."""
    _known(value, scopes(), field)


def validate_channel(value: str, *, field: str | None = None) -> None:
    """The one rule for a delivery channel (see validate_scope for `field`)."""
    _known(value, channels(), field)


def _known(value: str, known: list[str], field: str | None) -> None:
    if value not in known:
        message = f"Unknown channel '{value}'. Choose one of: {', '.join(known)}."
        if field is not None:
            raise ValidationError({field: [message]})
        raise ValidationError(message, code="channel")


def scope_label(scope: str) -> str:
    """A scope as people read it: a channel's name, or "all channels together"."""
    return "all channels together" if scope == ALL else scope


NOUNS = {
    EMAIL: ("email", "emails"),
    PUSH: ("push message", "push messages"),
    SMS: ("text message", "text messages"),
    ALL: ("marketing message", "marketing messages"),
}


def noun(channel: str, n: int) -> str:
    one, many = NOUNS.get(channel, (f"{channel} message", f"{channel} messages"))
    return one if n == 1 else many
