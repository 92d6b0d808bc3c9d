"""What the drain feeds besides the ledger's table, registered rather than imported: the event
stream's batches (limits.stream.events) and the studies' members and outcome events
(limits.studies.drain) each register a listener in the app's `ready()`, as the places of personal
data do, so that the drain imports nothing above the ledger.

A listener is called in the drain's transaction: `begun` first (before anything is written),
`written` once the round's decisions and outcomes are (in the order the listeners registered),
and `upkeep` with the ledger's daily upkeep. A listener may own a kind of entry in the ledger's
Redis stream (its `field`): the drain hands such entries to it, read by its `entry`, in the
stream's order among the decisions (`Round.steps_of`), and takes every older entry still pending
elsewhere before a batch that holds one, so that what the entry depends on (the decisions
before it) is written first.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from limits.ledger.stream import Decided

# A row that took an outcome, as the event stream takes it: (row id, outcome code, row's time).
Taken = tuple[int, int, datetime]


@dataclass
class Drained:
    """What one drain did, for its caller and its log."""

    entries: int = 0  # stream entries taken
    rows: int = 0  # decisions written
    skipped: int = 0  # stream entries already written by a drainer that died before acking
    unreadable: int = 0  # stream entries no drainer can read (dropped, logged)
    outcomes: int = 0  # rows that took a send outcome (a message admitted twice: two rows)
    unmatched: int = 0  # send outcomes whose decision the ledger does not hold
    changes: int = 0  # journal changes the stream took (suppression, preferences, dead addresses)
    events: int = 0  # outcome events counted (new ids; in a study of their user or none)
    events_repeated: int = 0  # outcome events whose id was counted before: not again


@dataclass
class Round:
    """One drain's writes, as its listeners see them (in its transaction, all written)."""

    now: datetime
    calls: Sequence[Decided] = ()  # the decisions written, in the stream's order
    # Those decisions and the listeners' own entries (owner, entry read), in the stream's order.
    steps: Sequence[tuple["DrainListener | None", Any]] = ()
    first: int = 0  # the first row's id: rows run on from it in the order of `calls`
    rows: int = 0  # rows written
    known: Sequence[Taken] = ()  # outcomes written with their rows
    taken: Sequence[Taken] = ()  # outcomes that updated rows written before

    def steps_of(self, listener: "DrainListener") -> list[Any]:
        """The decisions and `listener`'s own entries, in the stream's order."""
        return [step for owner, step in self.steps if owner is None or owner is listener]


class DrainListener:
    """Something the drain feeds. Subclasses override what they need."""

    field: str | None = None  # the stream field of this listener's own entries (None: none)

    def begun(self) -> None:
        """First in the drain's transaction, before anything is written."""

    def entry(self, packed: bytes) -> Any:
        """One of this listener's own stream entries, read (raises msgspec.DecodeError,
        ValueError or TypeError for what its writer does not write)."""
        raise NotImplementedError(f"{type(self).__name__} owns no stream entries")

    def written(self, done: Round, report: Drained) -> None:
        """After the round's decisions and outcomes are written; counts go into `report`."""

    def upkeep(self, now: datetime, cutoff: datetime) -> None:
        """With the ledger's upkeep, which keeps the rows from `cutoff` on
        (GATEKEEPER_LEDGER_DAYS): forget what has aged out."""


_LISTENERS: list[DrainListener] = []


def drain_listen(listener: DrainListener) -> None:
    """Register `listener` (once per type: an app's `ready()` may run again in tests)."""
    if not any(type(known) is type(listener) for known in _LISTENERS):
        _LISTENERS.append(listener)


def drain_listeners() -> tuple[DrainListener, ...]:
    return tuple(_LISTENERS)


def entry_owner(fields: Any) -> DrainListener | None:
    """The listener whose own entry a stream entry's `fields` hold (None: a decision's, or a
    send's outcomes)."""
    if fields:
        for listener in _LISTENERS:
            if listener.field is not None and listener.field.encode() in fields:
                return listener
    return None
