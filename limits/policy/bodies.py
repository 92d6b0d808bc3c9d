"""Request bodies of the REST API of caps, rules, quiet hours, topics
and the control group, and the parts of a send that the rules read (tags, priority, topic)."""

from collections.abc import Sequence
from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType
from rest_framework.exceptions import ValidationError

from gatekeeper.lib.bodies import NOT_BLANK, Body, schema_fill, words_for_pattern
from gatekeeper.lib.integers import INT32_MAX
from gatekeeper.lib.problems import Problem
from limits.channels import channels, scopes
from limits.engine.quiet import CLOCK, CLOCK_WORDS, SPREAD_MAX
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES, ROLLING_SECONDS
from limits.policy.rules import (
    NAME_MAX,
    TAG,
    TAG_WORDS,
    TAGS_MAX,
    duration_from_text,
    duration_words,
    tags_problem,
)
from segments.bodies import Description as TopicDescription
from segments.bodies import Name as TopicName
from segments.bodies import Slug

Limit = Annotated[int, Meta(ge=0, le=INT32_MAX)] | None


# A channel slug from settings (checked after decoding by `limits.channels.validate_channel`).
Channel = Annotated[
    str,
    Meta(
        description="A channel from settings (GATEKEEPER_CHANNELS).",
        extra_json_schema=schema_fill("channel", lambda: {"type": "string", "enum": channels()}),
    ),
]


# A channel or `all` (every channel together), checked by the rule's validation.
Scope = Annotated[
    str,
    Meta(
        description='A channel from settings (GATEKEEPER_CHANNELS), or "all": every channel '
        "together.",
        extra_json_schema=schema_fill("scope", lambda: {"type": "string", "enum": scopes()}),
    ),
]


class CapBody(Body, kw_only=True):
    # Both required: null is an explicit "no cap", so a forgotten field never lifts one.
    daily: Annotated[Limit, Meta(description="null: no daily cap; 0: none at all")]
    weekly: Annotated[Limit, Meta(description="null: no weekly cap; 0: none at all")]


# --- what a send carries for the rules --------------------------------------------------------

# The schema's form of limits.policy.rules.TAG; `tags_checked` applies the rule itself after
# decoding (a JSON Schema `$` is the end of the string, Python's also matches before a final
# newline).
Tag = Annotated[str, Meta(pattern=words_for_pattern(f"^{TAG.pattern}$", TAG_WORDS))]


Tags = Annotated[
    list[Tag],
    Meta(
        max_length=TAGS_MAX,
        description=f"Up to {TAGS_MAX} distinct tags; tag rules count the sends carrying "
        f"theirs. A tag: {TAG_WORDS}",
        extra_json_schema={"uniqueItems": True},
    ),
]


Priority = Annotated[
    int,
    Meta(
        ge=PRIORITIES[0],
        le=PRIORITIES[1],
        description=f"{PRIORITIES[0]} to {PRIORITIES[1]}, higher is more important (default "
        f"{DEFAULT_PRIORITY}); only a rule's reserve reads it.",
    ),
]


def window_from_text(text: str, *, field: str = "") -> int:
    """A recent interval (`?window=3h`) by limits.policy.rules.duration_from_text: its seconds, from
    1 minute to 90 days. A Problem (a ValueError) saying why otherwise, naming `field`."""
    seconds = duration_from_text(text, field=field)
    low, high = ROLLING_SECONDS
    if not low <= seconds <= high:
        raise Problem(
            f"{text} is {duration_words(seconds)}: a window is 1 minute to 90 days.", field=field
        )
    return seconds


def tags_checked(tags: Sequence[str], *, field: str = "tags") -> tuple[str, ...]:
    """A send's tags by limits.policy.rules.tags_problem; a 400 naming the first bad one (`tags[2]`)
    otherwise."""
    problem = tags_problem(tags)
    if problem is not None:
        at, why = problem
        raise ValidationError({field if at is None else f"{field}[{at}]": [why]})
    return tuple(tags)


# A send's topic: its form for the schema; the gate checks that it exists and is sent on the
# channel (limits.engine.topics.topic_problem), a 400 naming `topic`.
SendTopic = Annotated[
    Slug | None,
    Meta(
        description="What the sends are about: a topic's slug (GET /api/v1/topics/), sent on "
        "this channel; null: none (people's channel preferences govern it)."
    ),
]


# --- rules ------------------------------------------------------------------------------------
# Bounds that limits.policy.rules.rule_problems checks are only stated for the schema here
# (`extra_json_schema`), so that a refusal comes from the one rule, in its words.

RuleName = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=NAME_MAX,
        pattern=NOT_BLANK,
        description='In your words: "1 promo a day", "min gap 4h".',
    ),
]


RuleSegment = Annotated[Slug | None, Meta(description="A segment's slug; null: every segment.")]


Match = Annotated[
    Literal["any", "tag", "campaign"],
    Meta(
        description="any: every marketing send; tag: the sends carrying `tag`; campaign: each "
        "campaign counted on its own."
    ),
]


RuleTag = Annotated[
    Tag | None, Meta(description="The tag a tag rule counts: required for one, refused otherwise.")
]


RuleLimit = Annotated[
    int,
    Meta(
        description="Most sends in the window; 0 blocks them all.",
        extra_json_schema={"minimum": 0, "maximum": INT32_MAX},
    ),
]


class RollingWindow(Body, tag_field="kind", tag="rolling", kw_only=True):
    """The last `seconds` before each send."""

    seconds: Annotated[
        int,
        Meta(
            description=f"{ROLLING_SECONDS[0]:,} (1 minute) to {ROLLING_SECONDS[1]:,} (90 days).",
            extra_json_schema={"minimum": ROLLING_SECONDS[0], "maximum": ROLLING_SECONDS[1]},
        ),
    ]


class CalendarWindow(Body, tag_field="kind", tag="calendar", kw_only=True):
    """The current calendar period in the user's time zone."""

    unit: Annotated[Literal["day", "week", "month"], Meta(description="Weeks start on Monday.")]


Window = RollingWindow | CalendarWindow


class Reserve(Body, kw_only=True):
    """Slots of a rule kept for the more important sends."""

    below_priority: Annotated[
        int,
        Meta(
            description="Sends below this priority may use at most limit - slots.",
            extra_json_schema={"minimum": 1, "maximum": PRIORITIES[1]},
        ),
    ]
    slots: Annotated[
        int,
        Meta(
            description="The slots kept: at least 1, at most the rule's limit.",
            extra_json_schema={"minimum": 1, "maximum": INT32_MAX},
        ),
    ]


class ArmRuleBody(Body, kw_only=True):
    """A rule's own fields (an experiment's arm's rules have just these: the segment is the
    experiment's)."""

    name: RuleName
    channel: Scope
    match: Match = "any"
    tag: RuleTag = None
    window: Window
    limit: RuleLimit
    reserve: Annotated[Reserve | None, Meta(description="null: no reserve.")] = None


class RuleCreateBody(ArmRuleBody, kw_only=True):
    # Required: null is an explicit "every segment", never a forgotten field.
    segment: RuleSegment
    enabled: bool = True


class RuleChangeBody(Body, kw_only=True):
    """Any of a rule's fields; the rule is checked whole after the change."""

    name: RuleName | UnsetType = UNSET
    segment: RuleSegment | UnsetType = UNSET
    channel: Scope | UnsetType = UNSET
    match: Match | UnsetType = UNSET
    tag: RuleTag | UnsetType = UNSET
    window: Window | UnsetType = UNSET
    limit: RuleLimit | UnsetType = UNSET
    reserve: Annotated[Reserve | None, Meta(description="null: no reserve.")] | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET


# --- quiet hours ------------------------------------------------------------------------------
# As for rules, the bounds limits.engine.quiet.quiet_problems checks (a time of day's form, the
# spread's range, the channels, the segment) are only stated for the schema here, so that a refusal
# comes from the one rule, in its words; quiet_problems also refuses what a schema cannot say (an
# end equal to the start, a spread longer than the day outside the window, a segment that does not
# exist).

# The schema's form of limits.engine.quiet.CLOCK (its `$` is the end of the string, as fullmatch's).
Clock = Annotated[str, Meta(extra_json_schema={"pattern": f"^{CLOCK.pattern}$"})]


QuietSegment = Annotated[Slug | None, Meta(description="A segment's slug; null: every segment.")]


QuietStart = Annotated[
    Clock,
    Meta(
        description=f"When the quiet hours start, on the user's own clock. {CLOCK_WORDS}",
        extra_json_schema={"example": "21:00"},
    ),
]


QuietEnd = Annotated[
    Clock,
    Meta(
        description="When they end; before the start, the quiet hours wrap midnight (21:00 to "
        f"08:00 ends the next morning). Never equal to the start. {CLOCK_WORDS}",
        extra_json_schema={"example": "08:00"},
    ),
]


Spread = Annotated[
    int,
    Meta(
        description=f"Sends held until the end go out over this many minutes after it, each "
        f"user at their own place in it: 0 (at once, the default) to {SPREAD_MAX}, and less "
        "than the part of the day outside the quiet hours.",
        extra_json_schema={"minimum": 0, "maximum": SPREAD_MAX},
    ),
]


class QuietHoursCreateBody(Body, kw_only=True):
    segment: QuietSegment = None
    channel: Scope
    start: QuietStart
    end: QuietEnd
    spread_minutes: Spread = 0
    enabled: bool = True


class QuietHoursChangeBody(Body, kw_only=True):
    """Any of an entry's fields; the entry is checked whole after the change."""

    segment: QuietSegment | UnsetType = UNSET
    channel: Scope | UnsetType = UNSET
    start: QuietStart | UnsetType = UNSET
    end: QuietEnd | UnsetType = UNSET
    spread_minutes: Spread | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET


# --- topics -------------------------------------------------------------------------------------
# The forms are stated for the schema; limits.engine.topics.topic_problems is the one rule (a
# channel from settings, each once; the default's choices).

TopicChannels = Annotated[
    list[Channel],
    Meta(
        max_length=64,
        description="The channels it is sent on, each once; empty: every channel.",
        extra_json_schema={"uniqueItems": True},
    ),
]


TopicDefault = Annotated[
    Literal["subscribed", "unsubscribed", "required"],
    Meta(
        description="subscribed: everyone gets it until they switch it off; unsubscribed: only "
        "those who switch it on; required: no preference can switch it off (notices such as a "
        "change of terms)."
    ),
]


class TopicCreateBody(Body, kw_only=True):
    slug: Annotated[Slug, Meta(description="Never changes: sends and preferences name it.")]
    name: TopicName
    description: TopicDescription = ""
    channels: TopicChannels = []
    default: TopicDefault = "subscribed"


class TopicChangeBody(Body, kw_only=True):
    """Any of a topic's fields but its slug; the topic is checked whole after the change."""

    name: TopicName | UnsetType = UNSET
    description: TopicDescription | UnsetType = UNSET
    channels: TopicChannels | UnsetType = UNSET
    default: TopicDefault | UnsetType = UNSET


# --- the global control group -------------------------------------------------------------------
# Checked after decoding by limits.policy.holdout.holdout_problems, the one rule.


HoldoutSalt = Annotated[
    str,
    Meta(
        max_length=64,
        description="What the group is drawn from; left out: kept. A new salt draws a new group.",
    ),
]


class HoldoutBody(Body, kw_only=True):
    """The global control group, whole."""

    share: Annotated[
        float,
        Meta(description="The share of users held out of all marketing: 0.001 (0.1 %) to 0.2 "
             "(20 %), or 0 for no group.", extra_json_schema={"minimum": 0, "maximum": 0.2}),
    ]  # fmt: skip
    salt: HoldoutSalt | UnsetType = UNSET
    exclude_segments: Annotated[
        list[str], Meta(max_length=64, description="Segments never held out (slugs).")
    ] = []
    exclude_tags: Annotated[
        list[str],
        Meta(max_length=64, description="Sends carrying one of these tags are never held back."),
    ] = []


# --- a draft of the policy (backtests) ------------------------------------------------------------
# Changes that are not saved: each is checked as the one write path would check it
# (limits.policy.drafts), an `op` naming what it does to which row.

DraftRowId = Annotated[int, Meta(ge=1, le=2**63 - 1, description="The row's id.")]


class DraftRuleAdd(RuleCreateBody, tag_field="op", tag="add", kw_only=True):
    """A rule the draft adds (a rule's fields, as POST /api/v1/rules/ takes them)."""


class DraftRuleChange(RuleChangeBody, tag_field="op", tag="change", kw_only=True):
    """Some of a rule's fields changed (as PATCH /api/v1/rules/<id>/ takes them)."""

    id: DraftRowId


class DraftRuleDelete(Body, tag_field="op", tag="delete", kw_only=True):
    id: DraftRowId


class DraftQuietAdd(QuietHoursCreateBody, tag_field="op", tag="add", kw_only=True):
    """Quiet hours the draft adds (as POST /api/v1/quiet-hours/ takes them)."""


class DraftQuietChange(QuietHoursChangeBody, tag_field="op", tag="change", kw_only=True):
    id: DraftRowId


class DraftQuietDelete(Body, tag_field="op", tag="delete", kw_only=True):
    id: DraftRowId


class DraftCap(CapBody, kw_only=True):
    """A segment's classic cap on a channel, set (both limits null: none)."""

    segment: Slug
    channel: Scope


DRAFT_CHANGES_MAX = 200


class DraftBody(Body, kw_only=True):
    rules: Annotated[
        list[DraftRuleAdd | DraftRuleChange | DraftRuleDelete],
        Meta(max_length=DRAFT_CHANGES_MAX, description="Rules added, changed or deleted."),
    ] = []
    quiet_hours: Annotated[
        list[DraftQuietAdd | DraftQuietChange | DraftQuietDelete],
        Meta(max_length=DRAFT_CHANGES_MAX, description="Quiet hours added, changed or deleted."),
    ] = []
    caps: Annotated[
        list[DraftCap],
        Meta(
            max_length=DRAFT_CHANGES_MAX, description="Classic caps set, as the cap grid sets them."
        ),
    ] = []
