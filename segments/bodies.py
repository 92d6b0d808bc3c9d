"""Request bodies of the segments' REST API (msgspec structs, see gatekeeper.lib.bodies)."""

from typing import Annotated

from msgspec import UNSET, Meta, UnsetType

from gatekeeper.lib.bodies import NOT_BLANK, Body, words_for_pattern
from gatekeeper.lib.ids import JsonUserId
from gatekeeper.lib.integers import INT32_MAX
from gatekeeper.lib.zones import EXAMPLE

LOOKUP_LIMIT = 100_000
# 100,000 ids, even written as 20-digit strings.
LOOKUP_BODY_BYTES = 4 * 2**20

Slug = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=64,
        pattern=words_for_pattern(
            "^[-a-zA-Z0-9_]+$", "A slug is letters, digits, - and _ only (it names files and keys)."
        ),
    ),
]
Name = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=200,
        pattern=NOT_BLANK,
    ),
]
Priority = Annotated[
    int,
    Meta(
        ge=0,
        le=INT32_MAX,
        description="Lower wins: a user in several lists belongs to the lowest number.",
    ),
]
Description = Annotated[str, Meta(max_length=5000)]
# An IANA time zone name: its form in the schema, while gatekeeper.lib.zones decides (after
# decoding, with a message naming it) whether this machine's zone database has it. The schema
# does not list the names: generated clients cannot name 600 enum members such as Etc/GMT+5 and
# Etc/GMT-5 apart.
ZONE_NAME = r"[A-Za-z][-+A-Za-z0-9_]*(/[-+A-Za-z0-9_]+)*"
ZONE_MAX = 64
TimeZone = Annotated[
    str, Meta(extra_json_schema={"pattern": f"^{ZONE_NAME}$", "maxLength": ZONE_MAX})
]
SegmentTimeZone = Annotated[
    str,
    Meta(
        description=f"Its users' IANA time zone, such as {EXAMPLE}, when a send names none. "
        '"" or null: GATEKEEPER_DEFAULT_TIME_ZONE.',
        extra_json_schema={"pattern": f"^({ZONE_NAME})?$", "maxLength": ZONE_MAX},
    ),
]


class SegmentCreateBody(Body, kw_only=True):
    slug: Slug
    name: Name
    priority: Priority
    description: Description = ""
    time_zone: SegmentTimeZone | None = None


class SegmentChangeBody(Body, kw_only=True):
    # No slug: it never changes (snapshots and caps know the segment by it).
    name: Name | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    description: Description | UnsetType = UNSET
    time_zone: SegmentTimeZone | UnsetType | None = UNSET


class LookupBody(Body, kw_only=True):
    user_ids: Annotated[list[JsonUserId], Meta(min_length=1, max_length=LOOKUP_LIMIT)]
