"""Request bodies of the caps' REST API (msgspec structs, see gatekeeper.lib.bodies)."""

from typing import Annotated

from msgspec import Meta

from gatekeeper.lib.bodies import Body, schema_fill
from gatekeeper.lib.integers import INT32_MAX
from limits.channels import channels

Limit = Annotated[int, Meta(ge=0, le=INT32_MAX)] | None
# A channel slug from settings (checked after decoding by `limits.channels.validate_channel`).
Channel = Annotated[
    str,
    Meta(
        description="A channel from settings (GATEKEEPER_CHANNELS).",
        extra_json_schema=schema_fill("channel", lambda: {"type": "string", "enum": channels()}),
    ),
]


class CapBody(Body, kw_only=True):
    # Both required: null is an explicit "no cap", so a forgotten field never lifts one.
    daily: Annotated[Limit, Meta(description="null: no daily cap; 0: none at all")]
    weekly: Annotated[Limit, Meta(description="null: no weekly cap; 0: none at all")]
