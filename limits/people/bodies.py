"""Request bodies of people's preferences and of the suppression
list."""

from datetime import datetime
from typing import Annotated

from msgspec import UNSET, Meta, UnsetType

from gatekeeper.lib.bodies import NO_NUL, Body
from gatekeeper.lib.ids import JsonUserId
from gatekeeper.lib.integers import INT32_MAX
from limits.people.suppression import REASONS as SUPPRESSION_REASONS
from limits.policy.bodies import Scope, Window

# --- a person's preferences ----------------------------------------------------------------
# Keys (topics, channels) and instants are checked by
# limits.people.preferences.preferences_problems, the one rule, which names each bad one
# (`topics.news.sms`).

PauseInstant = Annotated[
    datetime,
    Meta(description="An instant in the future with its UTC offset (2026-12-24T00:00:00+01:00)."),
]


TopicChoices = Annotated[
    dict[str, dict[str, bool]],
    Meta(
        max_length=1000,
        description='Per topic, per channel subscribed or not: {"product-news": {"email": '
        "false}}. A topic or channel not named follows the topic's default.",
    ),
]


ChannelChoices = Annotated[
    dict[str, bool],
    Meta(max_length=64, description='Per channel, marketing on or off: {"sms": false}.'),
]


class OwnFrequency(Body, kw_only=True):
    """A person's own frequency on a channel: at most `limit` sends in `window` (a rule's), only
    ever tighter than the rules that apply to everyone."""

    channel: Annotated[str, Meta(max_length=64, description="A channel from settings.")]
    window: Window
    limit: Annotated[
        int,
        Meta(description="At least 1 (for none, switch the channel off).",
             extra_json_schema={"minimum": 1, "maximum": INT32_MAX}),
    ]  # fmt: skip


OwnFrequencies = Annotated[
    list[OwnFrequency],
    Meta(max_length=32, description="Their own frequency, per channel and window."),
]


class PreferencesBody(Body, kw_only=True):
    """A person's preferences, whole (what is left out is the default)."""

    topics: TopicChoices = {}
    channels: ChannelChoices = {}
    paused_until: Annotated[
        PauseInstant | None, Meta(description="No marketing at all until then; null: no pause.")
    ] = None
    paused_channels: Annotated[
        dict[str, PauseInstant],
        Meta(max_length=64, description="Per channel, no marketing on it until then."),
    ] = {}
    frequency: OwnFrequencies = []


class PreferencesChangeBody(Body, kw_only=True):
    """Some of a person's preferences, merged choice by choice into theirs; a null takes a
    choice back to the default (`paused_until`: null ends the pause)."""

    topics: Annotated[dict[str, dict[str, bool | None]], Meta(max_length=1000)] | UnsetType = UNSET
    channels: Annotated[dict[str, bool | None], Meta(max_length=64)] | UnsetType = UNSET
    paused_until: PauseInstant | UnsetType | None = UNSET
    paused_channels: Annotated[dict[str, PauseInstant | None], Meta(max_length=64)] | UnsetType = (
        UNSET
    )
    frequency: OwnFrequencies | UnsetType | None = UNSET


# --- the suppression list -----------------------------------------------------------------------

SUPPRESSION_IDS_MAX = 10_000  # ids per request; a file (PUT .../import/) for more


SuppressionIds = Annotated[
    list[JsonUserId],
    Meta(
        min_length=1,
        max_length=SUPPRESSION_IDS_MAX,
        description=f"1 to {SUPPRESSION_IDS_MAX:,} user ids (repeats count once).",
    ),
]


# Checked after decoding by limits.people.suppression.validate_reason, the one rule for reasons.
SuppressionReason = Annotated[
    str,
    Meta(
        description="Why they get no marketing (default: manual).",
        extra_json_schema={"enum": list(SUPPRESSION_REASONS)},
    ),
]


class SuppressionAddBody(Body, kw_only=True):
    channel: Scope
    user_ids: SuppressionIds
    reason: SuppressionReason = "manual"
    note: Annotated[str, Meta(max_length=300, pattern=NO_NUL)] = ""


class SuppressionRemoveBody(Body, kw_only=True):
    channel: Scope
    user_ids: SuppressionIds
