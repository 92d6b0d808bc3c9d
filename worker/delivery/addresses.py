"""The one rule for an address, per channel: an email address, a push token, a phone number
(E.164). Send jobs check every recipient when they are created with `address_rule`
(worker/delivery/registry.py): this rule, then the dispatcher's own `address_problem`, which
may be stricter still."""

import re
from collections.abc import Callable

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from limits.channels import EMAIL, PUSH, SMS

EMAIL_MAX = 254
TOKEN_MAX = 4096
VISIBLE = re.compile(r"[!-~]+")  # visible ASCII: one regex pass, not a Python loop per character
# E.164: a plus, then the country code and the number, 15 digits at most, never a leading 0.
E164 = re.compile(r"\+[1-9][0-9]{1,14}")


def shown(text: str) -> str:
    """An address as an error message quotes it: at most 40 characters."""
    return text if len(text) <= 40 else text[:37] + "..."


def email_address_problem(address: str) -> str | None:
    if len(address) > EMAIL_MAX:
        return f"An email address is at most {EMAIL_MAX} characters."
    try:
        validate_email(address)
    except ValidationError:
        return f"'{shown(address)}' is not an email address."
    return None


def push_token_problem(address: str) -> str | None:
    """1 to 4,096 visible ASCII characters, no spaces: FCM registration tokens, APNs device
    tokens and relay ids all fit."""
    if not address or len(address) > TOKEN_MAX:
        return f"A push token is 1 to {TOKEN_MAX:,} characters."
    if not VISIBLE.fullmatch(address):
        return f"'{shown(address)}' is not a push token (visible ASCII characters, no spaces)."
    return None


def phone_number_problem(address: str) -> str | None:
    """A mobile number in E.164: +, the country code and the number, at most 15 digits
    (+447700900123). Spaces, dashes and a national 0 are refused rather than guessed at."""
    if not E164.fullmatch(address):
        return (
            f"'{shown(address)}' is not a phone number in E.164 form: a +, the country code "
            "and the number, digits only, at most 15 (+447700900123)."
        )
    return None


def address_of_any_kind_problem(address: str) -> str | None:
    """A channel this module has no rule for: an address is 1 to 4,096 visible characters."""
    if not address or len(address) > TOKEN_MAX or not VISIBLE.fullmatch(address):
        return f"An address is 1 to {TOKEN_MAX:,} visible ASCII characters, no spaces."
    return None


RULES: dict[str, Callable[[str], str | None]] = {
    EMAIL: email_address_problem,
    PUSH: push_token_problem,
    SMS: phone_number_problem,
}
