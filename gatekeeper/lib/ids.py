"""User ids: the one rule for their bounds and for how a request may write them.

A user id is an unsigned integer of GATEKEEPER_ID_WIDTH bits (32 or 64), and at most 2^63 - 1
whatever the width, since the database keeps ids in signed 64-bit columns (snowflake-style ids
stay below 2^63). In JSON it is an integer, or a string of the digits 0-9 for clients that
cannot hold 64-bit integers (JavaScript). The segments app narrows the bound further to the
loaded snapshot's width (`segments.index.max_answerable_user_id`).
"""

import re
from collections.abc import Sequence
from typing import Annotated, Any

from django.conf import settings
from msgspec import Meta

from gatekeeper.lib.bodies import schema_fill
from gatekeeper.lib.integers import NotAWholeNumber, whole_number
from gatekeeper.lib.problems import Problem

DATABASE_MAX = 2**63 - 1
CANONICAL = re.compile(r"0|[1-9][0-9]*")  # a number's digits, as it is written


def digits_up_to(limit: int) -> str:
    """A regular expression for the whole numbers from 0 to `limit` in decimal, without leading
    zeros (for the schema: the string form of an id, bounded as exactly as the integer form)."""
    text = str(limit)
    width = len(text)
    options = ["0"]
    if width > 1:
        options.append(f"[1-9][0-9]{{0,{width - 2}}}")  # fewer digits than the limit
    for i, char in enumerate(text):  # as many digits: below the limit from digit i on
        low, digit = (1 if i == 0 else 0), int(char)
        if digit > low:
            tail = f"[0-9]{{{width - i - 1}}}" if width - i - 1 else ""
            options.append(f"{text[:i]}[{low}-{digit - 1}]{tail}")
    options.append(text)
    return "|".join(dict.fromkeys(options))


def user_id_schema() -> dict[str, Any]:
    """A user id in a body's schema, bounded by the configured width."""
    maximum = max_user_id()
    return {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": maximum},
            {"type": "string", "pattern": f"^({digits_up_to(maximum)})$"},
        ]
    }


JsonUserId = Annotated[
    Annotated[int, Meta(ge=0)] | Annotated[str, Meta(max_length=20)],
    Meta(
        description="An unsigned user id: an integer, or a string of its digits (for clients "
        "that cannot hold 64-bit integers, JavaScript).",
        extra_json_schema=schema_fill("user_id", user_id_schema),
    ),
]
"""How a body declares a user id; `user_ids_checked` then applies the rule and the bound."""


def max_user_id(width: int | None = None) -> int:
    """The largest user id of `width` bits (default: the configured width) anything stores."""
    width = int(settings.GATEKEEPER_ID_WIDTH if width is None else width)
    return min(2**width - 1, DATABASE_MAX)


def user_id_from_json(value: Any, *, maximum: int, field: str = "") -> int:
    """A user id as a JSON body gives it: an integer, or a string of its digits 0-9 (no sign,
    no spaces, no leading zeros, not even a trailing newline). Raises a Problem (a ValueError)
    with the words, naming `field`."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(value) <= 20 and CANONICAL.fullmatch(value):
        number = int(value)
    else:
        raise Problem(out_of_bounds(repr(value), maximum), field=field)
    if not 0 <= number <= maximum:
        raise Problem(out_of_bounds(number, maximum), field=field)
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
        name = f"{field}[{i}].{item}" if item else f"{field}[{i}]"
        checked.append(user_id_from_json(value, maximum=maximum, field=name))
    return checked


def user_id_from_text(text: str, *, field: str, maximum: int) -> int:
    """A user id written in a URL (a path or a query string): its digits 0-9 and nothing else,
    not even a space or a newline around them; a 400 naming `field` otherwise."""
    try:
        return whole_number(text, maximum=maximum, what="A user id", padded=False)
    except NotAWholeNumber:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise Problem(out_of_bounds(shown, maximum), field=field) from None


def out_of_bounds(value: object, maximum: int) -> str:
    """The one wording of a refused user id (ids are written without thousands separators)."""
    return f"A user id is a whole number from 0 to {maximum}, not {value}."
