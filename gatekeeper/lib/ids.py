"""User ids: the one rule for their bounds and for how a request may write them.

A user id is an unsigned integer of GATEKEEPER_ID_WIDTH bits (32 or 64), and at most 2^63 - 1
whatever the width, since the database keeps ids in signed 64-bit columns (snowflake-style ids
stay below 2^63). In JSON it is an integer, or a string of the digits 0-9 for clients that
cannot hold 64-bit integers (JavaScript). The segments app narrows the bound further to the
loaded snapshot's width (`segments.index.max_answerable_user_id`).
"""

from collections.abc import Sequence
from typing import Annotated, Any

from django.conf import settings
from msgspec import Meta
from rest_framework.exceptions import ValidationError

from gatekeeper.lib.bodies import words_for_pattern
from gatekeeper.lib.integers import DIGITS, NotAWholeNumber, whole_number

DATABASE_MAX = 2**63 - 1

JsonUserId = (
    Annotated[int, Meta(ge=0)]
    | Annotated[
        str,
        Meta(
            pattern=words_for_pattern(
                "^[0-9]{1,20}$", "A user id written as a string is 1 to 20 of the digits 0-9."
            )
        ),
    ]
)
"""How a body declares a user id; `user_ids_checked` then applies the bound."""


def max_user_id(width: int | None = None) -> int:
    """The largest user id of `width` bits (default: the configured width) anything stores."""
    width = int(settings.GATEKEEPER_ID_WIDTH if width is None else width)
    return min(2**width - 1, DATABASE_MAX)


def user_id_from_json(value: Any, *, maximum: int) -> int:
    """A user id as a JSON body gives it: an integer, or a string of nothing but the digits
    0-9 (no sign, no spaces, not even a trailing newline). Raises ValueError with the words."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= 20 and DIGITS.fullmatch(value):
        number = int(value)
    else:
        raise ValueError(out_of_bounds(repr(value), maximum))
    if not 0 <= number <= maximum:
        raise ValueError(out_of_bounds(number, maximum))
    return number


def user_ids_checked(
    values: Sequence[Any], *, field: str, maximum: int, item: str = ""
) -> list[int]:
    """`values` (ints, or digit strings) as ints within [0, maximum]; a 400 naming the first bad
    one as `field[i]` or `field[i].item`. One pass over plain ints in the usual case."""
    plain = values and all(type(v) is int for v in values)
    if plain and min(values) >= 0 and max(values) <= maximum:
        return list(values)
    checked = []
    for i, value in enumerate(values):
        try:
            checked.append(user_id_from_json(value, maximum=maximum))
        except ValueError as exc:
            name = f"{field}[{i}].{item}" if item else f"{field}[{i}]"
            raise ValidationError({name: [str(exc)]}) from None
    return checked


def user_id_from_text(text: str, *, field: str, maximum: int) -> int:
    """A user id written in a path, a query string or a form: digits 0-9 only; a 400 naming
    `field` otherwise."""
    try:
        return whole_number(text, maximum=maximum, what="A user id")
    except NotAWholeNumber:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise ValidationError({field: [out_of_bounds(shown, maximum)]}) from None


def out_of_bounds(value: object, maximum: int) -> str:
    """The one wording of a refused user id (ids are written without thousands separators)."""
    return f"A user id is a whole number from 0 to {maximum}, not {value}."
