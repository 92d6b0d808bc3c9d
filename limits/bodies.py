"""Request bodies of the caps' REST API (msgspec structs, see gatekeeper.lib.bodies)."""

from typing import Annotated

from msgspec import Meta

from gatekeeper.lib.bodies import Body
from gatekeeper.lib.integers import INT32_MAX

Limit = Annotated[int, Meta(ge=0, le=INT32_MAX)] | None


class CapBody(Body, kw_only=True):
    # Both required: null is an explicit "no cap", so a forgotten field never lifts one.
    daily: Annotated[Limit, Meta(description="null: no daily cap; 0: none at all")]
    weekly: Annotated[Limit, Meta(description="null: no weekly cap; 0: none at all")]
