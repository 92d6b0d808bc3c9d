"""A request that conflicts with the current state of what it names (pausing a job that has
ended, say): REST answers 409 (gatekeeper.lib.api), the admin shows the message."""


class Conflict(Exception):
    """What conflicts, in words; `field`: the field at fault, as a 400 would name it."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field
