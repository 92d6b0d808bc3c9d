"""The request body of an erasure."""

from typing import Annotated

from msgspec import Meta

from gatekeeper.lib.bodies import Body
from gatekeeper.lib.ids import JsonUserId

ERASE_IDS_MAX = 1000


class EraseBody(Body, kw_only=True):
    user_ids: Annotated[
        list[JsonUserId],
        Meta(
            min_length=1,
            max_length=ERASE_IDS_MAX,
            description=f"1 to {ERASE_IDS_MAX:,} user ids (repeats count once); more: "
            "several calls, or `manage.py erase_users FILE`.",
        ),
    ]
