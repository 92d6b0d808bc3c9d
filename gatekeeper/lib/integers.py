"""The one rule for whole numbers typed as text: admin forms, query strings, CSV files and
command-line options all read them through `whole_number`.

JSON bodies carry JSON integers (msgspec refuses strings, fractions and booleans there); text is
ASCII digits only. Python's own `int()` and `str.isdigit()` also take signs, underscores and the
digits of other scripts ("+12", "1_000", "١٢"), which a marketer never means and which would
make the same value pass in one place and fail in another.
"""

import re
from typing import Any

from django import forms

from gatekeeper.lib.problems import Problem

DIGITS = re.compile(r"[0-9]+")
INT32_MAX = 2**31 - 1  # the largest value a PositiveIntegerField holds on every database


class NotAWholeNumber(Problem):
    """The text is not a whole number within the bounds; the message says why, in words."""


def whole_number(
    text: str,
    *,
    maximum: int,
    minimum: int = 0,
    what: str = "The value",
    padded: bool = True,
    field: str = "",
) -> int:
    """`text` as an int from `minimum` to `maximum`. Spaces around it are ignored (a form field
    or a CSV cell often has them) unless `padded` is False: a number in a URL (a path, a query
    string) is exactly its digits, so `/users/%201/` names no user. Anything but ASCII digits
    inside is refused. The messages start with `what` ("email daily: at most 2,147,483,647.");
    NotAWholeNumber names `field` (a query string's `limit`: the REST API's 400 for it)."""
    value = text.strip(" \t\r\n") if padded else text
    if not DIGITS.fullmatch(value):
        shown = value if len(value) <= 20 else value[:17] + "..."
        raise NotAWholeNumber(
            f"{what}: '{shown}' is not a whole number (digits 0-9 only).", field=field
        )
    # Compare lengths first: a 10,000-digit string is refused without building the integer.
    if len(value.lstrip("0")) > len(str(maximum)) or int(value) > maximum:
        raise NotAWholeNumber(f"{what}: at most {maximum:,}.", field=field)
    number = int(value)
    if number < minimum:
        raise NotAWholeNumber(f"{what}: at least {minimum:,}.", field=field)
    return number


class WholeNumberField(forms.CharField):
    """A form field for a whole number under the one rule (`whole_number`), instead of Django's
    IntegerField, which takes "+12", "1_000" and other scripts' digits."""

    def __init__(self, *, maximum: int, minimum: int = 0, what: str = "", **kwargs: Any) -> None:
        self.maximum, self.minimum, self.what = maximum, minimum, what
        kwargs.setdefault("widget", forms.TextInput(attrs={"inputmode": "numeric"}))
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> int | None:  # type: ignore[override]
        text = super().to_python(value)
        if text is None or text in self.empty_values:
            return None
        try:
            return whole_number(
                text, maximum=self.maximum, minimum=self.minimum, what=self.what or "The value"
            )
        except NotAWholeNumber as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None
