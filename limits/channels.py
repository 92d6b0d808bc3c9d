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


def channel_problem(value: str, *, scope: bool = False) -> str | None:
    """The one rule for a channel someone names, and its one wording: None when `value` is a
    delivery channel (with `scope`, or `all`), else what is wrong, in words. Code that collects
    every problem of a body (rules, quiet hours, preferences, topics, the ledger's filters) adds
    this; code that stops at the first one calls validate_channel or validate_scope."""
    known = scopes() if scope else channels()
    if value in known:
        return None
    return f"Unknown channel '{value[:70]}'. Choose one of: {', '.join(known)}."


def validate_scope(value: str, *, field: str | None = None) -> None:
    """A scope (a channel or `all`) by channel_problem; ValidationError otherwise. With
    `field`, the ValidationError names it (the REST API's base answers it as that field's
    400)."""
    _raised(channel_problem(value, scope=True), field)


def validate_channel(value: str, *, field: str | None = None) -> None:
    """A delivery channel by channel_problem (see validate_scope for `field`)."""
    _raised(channel_problem(value), field)


def _raised(problem: str | None, field: str | None) -> None:
    if problem is None:
        return
    if field is not None:
        raise ValidationError({field: [problem]})
    raise ValidationError(problem, code="channel")


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
