"""The one rule for whole numbers typed as text: admin forms, query strings, CSV files and
command-line options all read them through `whole_number`.

JSON bodies carry JSON integers (msgspec refuses strings, fractions and booleans there); text is
ASCII digits only. Python's own `int()` and `str.isdigit()` also take signs, underscores and the
digits of other scripts ("+12", "1_000", "١٢"), which a marketer never means and which would
make the same value pass in one place and fail in another.
"""

import re

DIGITS = re.compile(r"[0-9]+")
INT32_MAX = 2**31 - 1  # the largest value a PositiveIntegerField holds on every database


class NotAWholeNumber(ValueError):
    """The text is not a whole number within the bounds; the message says why, in words."""


def whole_number(text: str, *, maximum: int, minimum: int = 0, what: str = "a number") -> int:
    """`text` as an int from `minimum` to `maximum`. Spaces around it are ignored (a form field
    or a CSV cell often has them); anything but ASCII digits inside is refused."""
    value = text.strip(" \t\r\n")
    if not DIGITS.fullmatch(value):
        shown = value if len(value) <= 20 else value[:17] + "..."
        raise NotAWholeNumber(
            f"{what} is a whole number written with the digits 0-9, not '{shown}'."
        )
    # Compare lengths first: a 10,000-digit string is refused without building the integer.
    if len(value.lstrip("0")) > len(str(maximum)) or int(value) > maximum:
        raise NotAWholeNumber(f"{what} is at most {maximum:,}.")
    number = int(value)
    if number < minimum:
        raise NotAWholeNumber(f"{what} is at least {minimum:,}.")
    return number
