"""The channels a cap can name. `all` is the cross-channel scope."""

from django.conf import settings
from django.core.exceptions import ValidationError

ALL = "all"


def channels() -> list[str]:
    """Delivery channels from settings, in their configured order (without `all`)."""
    return list(settings.GATEKEEPER_CHANNELS)


def scopes() -> list[str]:
    """Everything a cap can apply to: each channel, then `all`."""
    return [*channels(), ALL]


def validate_scope(value: str) -> None:
    if value not in scopes():
        raise ValidationError(
            f"Unknown channel '{value}'. Choose one of: {', '.join(scopes())}.", code="channel"
        )


def validate_channel(value: str) -> None:
    if value not in channels():
        raise ValidationError(
            f"Unknown channel '{value}'. Choose one of: {', '.join(channels())}.", code="channel"
        )


def scope_label(scope: str) -> str:
    """A scope as people read it: a channel's name, or "all channels together"."""
    return "all channels together" if scope == ALL else scope


NOUNS = {
    "email": ("email", "emails"),
    "push": ("push message", "push messages"),
    ALL: ("marketing message", "marketing messages"),
}


def noun(channel: str, n: int) -> str:
    one, many = NOUNS.get(channel, (f"{channel} message", f"{channel} messages"))
    return one if n == 1 else many
