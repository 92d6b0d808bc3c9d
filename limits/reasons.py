"""Every word a decision, a send and a send job are counted by, once: the reasons a gate decision
carries, the groups the code asks for, what became of an admitted send, how a send job counts
its recipients, and a send's category.

The REST bodies and answers (their enumerations in the schema), the ledger, the reports, the
dashboard (words and colours) and the worker read these; a new reason is added here and
nowhere else (tests/limits/test_reasons.py fails on a reason spelled anywhere but here).
"""

from enum import StrEnum

from django.core.exceptions import ValidationError


class Reason(StrEnum):
    """Why the gate decided as it did (DESIGN.md, Gate). Members are strings: a Reason is its
    value wherever a string is (the ledger's column, JSON, Redis counters)."""

    ALLOWED = "allowed"  # admitted and recorded in the user's log
    DUPLICATE = "duplicate"  # admitted before under the same message id: not charged again
    DAILY_CAP = "daily_cap"  # refused by a rule whose window is a day
    WEEKLY_CAP = "weekly_cap"  # ... a week
    CAP = "cap"  # ... any other window
    BLOCKED = "blocked"  # refused by a rule whose limit is 0
    # a reserved scheduled job holds the rule's last slots (limits.engine.reservations)
    RESERVED = "reserved"
    # a round gave the user's slot to sends worth more to them (worker/rounds.py); decided
    # before the send reaches the gate
    OUTRANKED = "outranked"
    QUIET_HOURS = "quiet_hours"  # held: the user's quiet hours
    SUPPRESSED = "suppressed"  # the user is on the channel's suppression list
    PREFERENCE = "preference"  # the person switched this topic (or channel) off
    PAUSED = "paused"  # the person paused their marketing (or this channel's) until a date
    HOLDOUT = "holdout"  # the user is in the global control group: no marketing
    EXEMPT = "exempt"  # transactional: never refused, never counted
    UNAVAILABLE = "unavailable"  # Redis, the snapshot or the suppression list missing
    # A send job's own, for a waiting send that never reached the gate again.
    EXPIRED = "expired"  # still waiting when its job expired
    CANCELLED = "cancelled"  # still waiting when its job's waiting sends were cancelled
    # A send job's own, for an email held before the gate (worker/delivery/deliverability.py).
    WARMING_UP = "warming_up"  # beyond its sending domain's warm-up volume today: tomorrow
    BRAKED = "braked"  # its mailbox provider is paused by the brake: until it is resumed


# The groups of reasons: each is named here once, and the code asks for it by its name.
# A send job's own, never the gate's.
JOB_OWN: tuple[Reason, ...] = (Reason.EXPIRED, Reason.CANCELLED, Reason.WARMING_UP, Reason.BRAKED)
# Held before the gate, and gated when their hold ends.
HELD_BEFORE_GATE: tuple[Reason, ...] = (Reason.WARMING_UP, Reason.BRAKED)
# What the gate answers (the schema's enumeration of a decision's reason), in this order.
REASONS: tuple[Reason, ...] = tuple(r for r in Reason if r not in JOB_OWN)
# A send job's reasons: the gate's and its own.
JOB_REASONS: tuple[Reason, ...] = tuple(Reason)
# What the gate may answer a marketing send (all but exempt, a transactional send's).
MARKETING_REASONS: tuple[Reason, ...] = tuple(r for r in REASONS if r != Reason.EXEMPT)
# The send went ahead.
ADMITTED: tuple[Reason, ...] = (Reason.ALLOWED, Reason.DUPLICATE, Reason.EXEMPT)
# The send goes out now (a duplicate went out before): the decisions a send's outcome belongs
# to, and what a plan counts as sent.
SENDING: tuple[Reason, ...] = (Reason.ALLOWED, Reason.EXEMPT)
# Every other reason of the gate's.
REFUSED: tuple[Reason, ...] = tuple(r for r in REASONS if r not in ADMITTED)
# A rule had no room: the decision names the rule.
CAPPED: tuple[Reason, ...] = (Reason.DAILY_CAP, Reason.WEEKLY_CAP, Reason.CAP)
# Held rather than refused: the send goes when the user's quiet hours end.
HELD: tuple[Reason, ...] = (Reason.QUIET_HOURS,)
# Refusals `on_capped: defer` waits out: a slot frees, or the user's quiet hours end.
# A reservation's hold ends when its job starts.
DEFERRABLE: tuple[Reason, ...] = (*CAPPED, *HELD, Reason.RESERVED)
# Decided by what a draft of rules, quiet hours and caps cannot change, or by state the ledger
# does not keep (whom a reservation held): a backtest keeps the ledger's answer under both
# policies (worker/backtest.py).
NOT_REPLAYED: tuple[Reason, ...] = (
    Reason.SUPPRESSED,
    Reason.PREFERENCE,
    Reason.PAUSED,
    Reason.HOLDOUT,
    Reason.EXEMPT,
    Reason.UNAVAILABLE,
    Reason.RESERVED,
    Reason.OUTRANKED,
    *JOB_OWN,
)

# How the admin's charts colour each reason (the same colour on every chart).
COLOURS: dict[Reason, str] = {
    Reason.ALLOWED: "#3a9b5c",
    Reason.DUPLICATE: "#8fc9a1",
    Reason.EXEMPT: "#5b8bd0",
    Reason.DAILY_CAP: "#e0a030",
    Reason.WEEKLY_CAP: "#d0662b",
    Reason.CAP: "#c4883a",
    Reason.BLOCKED: "#b23b3b",
    Reason.RESERVED: "#d98b8b",
    Reason.OUTRANKED: "#b58fb8",
    Reason.QUIET_HOURS: "#8a63c9",
    Reason.SUPPRESSED: "#3d3d3d",
    Reason.PREFERENCE: "#2f6f73",
    Reason.PAUSED: "#6fa3a6",
    Reason.HOLDOUT: "#9c7a54",
    Reason.UNAVAILABLE: "#777777",
    Reason.EXPIRED: "#a0a0a0",
    Reason.CANCELLED: "#c0c0c0",
    Reason.WARMING_UP: "#e6c86e",
    Reason.BRAKED: "#7a2e2e",
}


class Outcome(StrEnum):
    """What became of an admitted send, as the worker tells the ledger."""

    SENT = "sent"
    FAILED = "failed"  # never went out: its quota was given back
    AMBIGUOUS = "ambiguous"  # may have gone out: kept, never sent again
    RELEASED = "released"  # its quota was given back (a failed send is released too)


OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)
# The ledger's rows of sends that did not count against caps (a rebuild leaves them out).
GIVEN_BACK: tuple[Outcome, ...] = (Outcome.FAILED, Outcome.RELEASED)


class JobOutcome(StrEnum):
    """How a send job counts each recipient: its counts always add up to its recipients (with
    those still waiting)."""

    SENT = "sent"
    FAILED = "failed"
    CAPPED = "capped"  # refused by the gate (any reason but unavailable), or dropped
    AMBIGUOUS = "ambiguous"
    DUPLICATE = "duplicate"  # a message id the job repeats, or another job sends
    INVALID = "invalid"  # a row that broke the rules (on_invalid: skip)
    EXPIRED = "expired"
    CANCELLED = "cancelled"


JOB_OUTCOMES: tuple[JobOutcome, ...] = tuple(JobOutcome)


class Category(StrEnum):
    """A send's category: marketing is gated; transactional (receipts, one-time codes) is never
    refused and never counted."""

    MARKETING = "marketing"
    TRANSACTIONAL = "transactional"


CATEGORIES: tuple[Category, ...] = tuple(Category)


def validate_category(value: str, *, field: str | None = None) -> None:
    """The one rule for a send's category. With `field`, the ValidationError names it (the
    REST API's base answers it as that field's 400)."""
    if value not in CATEGORIES:
        message = f"Unknown category '{value}'. Choose one of: {', '.join(CATEGORIES)}."
        if field is not None:
            raise ValidationError({field: [message]})
        raise ValidationError(message, code="category")
