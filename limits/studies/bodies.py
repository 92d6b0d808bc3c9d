"""Request bodies of cap experiments and of the outcome events."""

from datetime import datetime
from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from gatekeeper.lib.bodies import Body
from gatekeeper.lib.ids import JsonUserId
from limits.policy.bodies import ArmRuleBody, Tag
from segments.bodies import Slug

# --- experiments --------------------------------------------------------------------------------
# As for rules, what limits.studies.experiments.experiment_problems checks (2 to 5 arms, shares
# adding up to at most 1, at least one rule an arm, no overlap) is only described here, so that a
# refusal comes from the one rule, in its words.

Aware = Annotated[datetime, Meta(tz=True, description="ISO 8601 with its offset (Z for UTC).")]


ExperimentName = Annotated[
    str, Meta(max_length=100, description='In your words: "3 or 5 a week for Active".')
]


class ArmBody(Body, kw_only=True):
    name: Annotated[str, Meta(max_length=100, description='"3 a week".')]
    share: Annotated[
        float,
        Meta(description="Its share of the experiment's users: above 0; the arms' together "
             "at most 1 (the rest are in no arm).", extra_json_schema={"maximum": 1}),
    ]  # fmt: skip
    mode: Annotated[
        Literal["replace", "add"],
        Meta(description="replace: its rules replace the segment's own rules on the channels "
             "they name; add: they apply besides them."),
    ] = "replace"  # fmt: skip
    rules: Annotated[
        list[ArmRuleBody], Meta(description="At least one: the rules the arm tries.")
    ] = []


ExperimentArms = Annotated[
    list[ArmBody], Meta(description="2 to 5 arms, split by a keyed hash of the user id.")
]


ExperimentSegment = Annotated[
    Slug | None, Meta(description="A segment's slug; null: every segment.")
]


ExperimentSalt = Annotated[
    str, Meta(max_length=64, description="What the arms are drawn from; left out: a new one.")
]


class ExperimentCreateBody(Body, kw_only=True):
    name: ExperimentName
    segment: ExperimentSegment  # required: null is an explicit "every segment"
    arms: ExperimentArms
    starts_at: Annotated[Aware, Meta(description="Left out: now.")] | UnsetType = UNSET
    ends_at: Aware
    salt: ExperimentSalt | UnsetType = UNSET


class ExperimentChangeBody(Body, kw_only=True):
    """Any of its fields; checked whole after the change. Once it has started, only the name
    and the end."""

    name: ExperimentName | UnsetType = UNSET
    segment: ExperimentSegment | UnsetType = UNSET
    arms: ExperimentArms | UnsetType = UNSET
    starts_at: Aware | UnsetType = UNSET
    ends_at: Aware | UnsetType = UNSET
    salt: ExperimentSalt | UnsetType = UNSET


EVENTS_MAX = 10_000  # outcome events per request


class EventBody(Body, kw_only=True):
    """One outcome event: a user's conversion (an order, a sign-up) from the company's
    systems."""

    event_id: Annotated[
        str,
        Meta(min_length=1, max_length=200, description="Its id in your systems: an event sent "
             "again (a retry) with the same id counts once."),
    ]  # fmt: skip
    user_id: JsonUserId
    name: Annotated[Tag, Meta(description='What happened: "order", "signup" (a tag\'s form).')]
    at: Annotated[Aware, Meta(description="When it happened.")]
    value: Annotated[
        float,
        Meta(ge=-1e12, le=1e12, description="What it was worth (an order's amount), 0 when "
             "left out; within +/- 10^12."),
    ] = 0.0  # fmt: skip


class EventsBody(Body, kw_only=True):
    events: Annotated[
        list[EventBody],
        Meta(min_length=1, max_length=EVENTS_MAX, description=f"1 to {EVENTS_MAX:,} events."),
    ]


class ConcludeBody(Body, kw_only=True):
    arm: Annotated[str, Meta(max_length=100, description="The arm whose rules are promoted.")]
