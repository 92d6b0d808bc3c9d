"""Snapshots published for real: segments with their lists and caps built and published, and
VIP users in Paris under quiet hours (`quiet_vip`)."""

import io
from collections.abc import Callable

import pytest

from limits.engine.quiet import QuietFields
from limits.policy.services import QUIET_HOURS, cap_set
from segments.models import Segment
from segments.publishing import build_run
from segments.services import build_start, user_list_import

# The users of `quiet_vip`.
QUIET_USERS = list(range(1000, 1200))


@pytest.fixture
def published(db, redis_client) -> Callable[..., str]:
    """Publish a real snapshot: published(vip=(10, [1, 2], {"email": (1, 2)})) -> version."""

    def publish(**spec: tuple[int, list[int], dict[str, tuple[int | None, int | None]]]) -> str:
        # Transactional tests flush the tables, the migration's default segment with them.
        Segment.objects.get_or_create(
            is_default=True,
            defaults={"slug": "default", "name": "Everyone else", "priority": 1_000_000},
        )
        for slug, (priority, ids, caps) in spec.items():
            segment = Segment.objects.create(slug=slug, name=slug.title(), priority=priority)
            body = "".join(f"{i}\n" for i in ids).encode()
            user_list_import(segment=segment, fileobj=io.BytesIO(body), name=f"{slug}.txt")
            for scope, (daily, weekly) in caps.items():
                cap_set(segment=segment, channel=scope, daily=daily, weekly=weekly, via="command")
        return build_run(build_id=build_start(queue=False).pk).version

    return publish


@pytest.fixture
def quiet_vip(published):
    """VIP users (QUIET_USERS) in Paris; no marketing email from 21:00 to 08:00, released over
    30 minutes. Uncapped: only quiet hours hold their sends."""
    published(vip=(10, QUIET_USERS, {}))
    Segment.objects.filter(slug="vip").update(time_zone="Europe/Paris")
    QUIET_HOURS.create(
        fields=QuietFields(
            segment="vip", channel="email", start="21:00", end="08:00", spread_minutes=30
        ),
        via="command",
    )
