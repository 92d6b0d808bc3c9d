"""Request bodies of the event stream's webhook endpoints
(limits/stream/webhooks.py checks them whole)."""

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from gatekeeper.lib.bodies import Body, words_for_pattern
from gatekeeper.lib.weburls import HTTP_URL, HTTP_URL_WORDS, URL_MAX
from limits.policy.bodies import Channel
from limits.policy.rules import CAMPAIGN_MAX
from limits.stream.events import POSITION_PATTERN, POSITION_WORDS

# --- the event stream's webhook endpoints (limits/stream/webhooks.py checks them whole) --------

EventType = Annotated[
    Literal["decision", "outcome", "suppression", "preferences"],
    Meta(description="An event type of the stream."),
]


WebhookUrl = Annotated[
    str,
    Meta(
        max_length=URL_MAX,
        pattern=words_for_pattern(HTTP_URL, HTTP_URL_WORDS),
        description="Where the events are POSTed: an http or https URL.",
    ),
]


WebhookDescription = Annotated[str, Meta(max_length=500, description="What it is, for people.")]


WebhookTypes = Annotated[
    list[EventType],
    Meta(
        max_length=4,
        description="Only these event types, each once; empty: every one.",
        extra_json_schema={"uniqueItems": True},
    ),
]


WebhookChannels = Annotated[
    list[Channel],
    Meta(
        max_length=100,
        description="Only the events of these channels, each once (suppressions of every "
        "channel and preference changes too); empty: every channel.",
        extra_json_schema={"uniqueItems": True},
    ),
]


WebhookCampaigns = Annotated[
    list[Annotated[str, Meta(max_length=CAMPAIGN_MAX)]],
    Meta(
        max_length=100,
        description="Only the decisions and outcomes of these campaigns, each once; empty: any.",
        extra_json_schema={"uniqueItems": True},
    ),
]


WebhookStart = Annotated[
    str,
    Meta(
        pattern=words_for_pattern(POSITION_PATTERN, POSITION_WORDS),
        description="Where in the stream its deliveries start: `end` (only what comes next), "
        "`0` (everything the stream keeps), or a position (`next` of GET /api/v1/stream/).",
    ),
]


class WebhookCreateBody(Body, kw_only=True):
    url: WebhookUrl
    description: WebhookDescription = ""
    types: WebhookTypes = []
    channels: WebhookChannels = []
    campaigns: WebhookCampaigns = []
    start: WebhookStart = "end"


class WebhookChangeBody(Body, kw_only=True):
    """Any of an endpoint's fields; `active` pauses or resumes it; `start` moves its position
    (replay or skip); `new_secret` signs from now on with a new secret."""

    url: WebhookUrl | UnsetType = UNSET
    description: WebhookDescription | UnsetType = UNSET
    types: WebhookTypes | UnsetType = UNSET
    channels: WebhookChannels | UnsetType = UNSET
    campaigns: WebhookCampaigns | UnsetType = UNSET
    active: (
        Annotated[
            bool,
            Meta(
                description="false: paused; true: active again (a failing endpoint resumes "
                "from where it stopped)."
            ),
        ]
        | UnsetType
    ) = UNSET
    start: WebhookStart | UnsetType = UNSET
    new_secret: Annotated[
        bool, Meta(description="true: a new secret; the old one signs nothing more.")
    ] = False
