"""Bad input, said where it is found and answered the same way everywhere.

An error that carries a problem says what is wrong, in words, and names where: the field as the
REST API names it (`limit`, `requests[3].time_zone`). Its `field_errors()` is the body of that
400, and the REST API's base (gatekeeper.lib.api.JsonAPIView) answers any such error that
reaches it with that body; no view turns one into a 400 by hand.

Most are a `Problem`: one message, one field (or several, `Problems`). Code that reads a value
raises one, naming the field when its caller says which; forms, commands and file readers catch
it as the ValueError it is. Errors with a body of their own (a refused file names its line) give
`field_errors()` themselves (segments.parsing.UserListError,
limits.people.preferences_import.PreferencesFileRefused).
"""

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

# The key of a problem with the body as a whole (DRF's own).
NON_FIELD = "non_field_errors"


@runtime_checkable
class CarriesProblems(Protocol):
    """An error that says what is wrong by field: `field_errors()` is its 400's body
    ({"limit": ["..."]}, or a body of its own for a file)."""

    def field_errors(self) -> dict[str, Any]: ...


class Problem(ValueError):
    """One problem: `message`, in words, with `field` (empty: the input as a whole)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message, self.field = message, field

    def field_errors(self) -> dict[str, Any]:
        return {self.field or NON_FIELD: [self.message]}


class Problems(Problem):
    """Several fields' problems at once (every one a body has, so that it is mended in one go)."""

    def __init__(self, problems: Mapping[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()))
        self.problems = {field: list(messages) for field, messages in problems.items()}

    def field_errors(self) -> dict[str, Any]:
        return {field: list(messages) for field, messages in self.problems.items()}
