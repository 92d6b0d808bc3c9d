"""The what-if counts, per channel and topic (and for no topic), the sends of its audience that
people's own preferences would refuse (`preference`, `paused`), scaled like the rest when the
audience is sampled, and shows them as a table."""

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.urls import reverse

from limits.engine.topics import TopicFields
from limits.people.preferences import PreferencesFields, preferences_replace
from limits.policy.selectors import policy_cache, topics_read
from limits.policy.services import TOPICS
from segments.models import Segment
from worker import selectors

pytestmark = pytest.mark.django_db

NOW = datetime.now(tz=UTC).replace(microsecond=0)


@pytest.fixture
def topics(published):
    published(vip=(10, [1, 2, 3, 4], {}))
    for slug, name, default, channels in (
        ("news", "Product news", "subscribed", ["email", "push"]),
        ("offers", "Offers", "unsubscribed", ["email"]),
        ("terms", "Terms", "required", []),
        ("alerts", "Price alerts", "subscribed", ["sms"]),
    ):
        TOPICS.create(
            fields=TopicFields(slug=slug, name=name, default=default, channels=channels),
            via="command",
        )
    policy_cache().invalidate()


def said(user_id: int, **fields) -> None:
    preferences_replace(
        user_id=user_id, prefs=PreferencesFields(**fields), topics=topics_read(), source="api"
    )


def blocked(result) -> dict[tuple[str, str | None], tuple[int, int, bool]]:
    return {
        (row["channel"], row["topic"]): (row["preference"], row["paused"], row["required"])
        for row in result["preferences"]
    }


def what_if(ids, *, channels=("email",), now=NOW):
    return selectors.what_if(
        ids=np.array(ids),
        draft=selectors.draft_table({}),
        only_channels=list(channels),
        now=now,
    )


def test_it_counts_per_topic_what_preferences_and_pauses_would_refuse(topics):
    said(1, topics={"news": {"email": False}})
    said(2, channels={"email": False})
    said(3, paused_until=NOW + timedelta(hours=2))
    said(4, topics={"offers": {"email": True}})
    assert blocked(what_if([1, 2, 3, 4, 5])) == {
        ("email", None): (1, 1, False),  # 2 switched email off; 3 paused
        ("email", "news"): (2, 1, False),  # and 1 switched news off on email
        # Offers go only to those who asked: all but 4 (3 never asked, so not merely paused).
        ("email", "offers"): (4, 0, False),
        ("email", "terms"): (0, 0, True),  # required: nothing blocks it
    }  # alerts are sent by sms only: no email row


def test_a_pause_blocks_only_until_it_ends(topics):
    said(3, paused_until=NOW + timedelta(hours=2))
    later = blocked(what_if([3], now=NOW + timedelta(hours=3)))
    assert later[("email", None)] == (0, 0, False)
    assert blocked(what_if([3]))[("email", None)] == (0, 1, False)


def test_every_channel_is_counted_when_none_is_chosen(topics):
    said(1, topics={"news": {"push": False}, "alerts": {"sms": False}})
    rows = blocked(what_if([1, 2], channels=["email", "push", "sms"]))
    assert set(rows) == {
        ("email", None), ("email", "news"), ("email", "offers"), ("email", "terms"),
        ("push", None), ("push", "news"), ("push", "terms"),
        ("sms", None), ("sms", "alerts"), ("sms", "terms"),
    }  # fmt: skip
    assert rows[("push", "news")] == (1, 0, False) and rows[("email", "news")] == (0, 0, False)
    assert rows[("sms", "alerts")] == (1, 0, False)


def test_a_sampled_audience_is_scaled_up_like_the_rest(topics, monkeypatch):
    for user_id in (1, 2, 3, 4):
        said(user_id, channels={"email": False})
    monkeypatch.setattr(selectors, "WHAT_IF_LIMIT", 2)
    result = what_if([1, 2, 3, 4])
    assert (result["evaluated"], result["sampled"]) == (2, True)
    # Whichever two are drawn, both are refused: 2 of 2, scaled by 4/2.
    assert blocked(result)[("email", "news")] == (4, 0, False)


def table(page: str) -> list[tuple[str, ...]]:
    found = re.search(r'id="what-if-preferences">(.*?)</table>', page)
    assert found is not None
    cells = r"<tr><td>(\w+)</td><td>([^<]+)</td><td[^>]*>([^<]+)</td>(?:<td[^>]*>([^<]+)</td>)?"
    return re.findall(cells, found.group(1))


def test_the_page_shows_what_preferences_would_block(topics, viewer_client):
    said(1, topics={"news": {"email": False}})
    said(2, paused_channels={"push": NOW + timedelta(days=1)})
    vip = Segment.objects.get(slug="vip").pk
    page = re.sub(r"\s+", " ", viewer_client.post(
        reverse("admin:what_if"), {"segment": vip, "channel": "push"}
    ).content.decode())  # fmt: skip
    assert "What people's preferences would block" in page
    assert table(page) == [
        ("push", "(no topic)", "0", "1"),
        ("push", "Product news", "0", "1"),
        ("push", "Terms", "required: no preference blocks it", ""),
    ]
    page = viewer_client.post(reverse("admin:what_if"), {"segment": vip}).content.decode()
    rows = table(re.sub(r"\s+", " ", page))
    assert ("email", "Product news", "1", "0") in rows and ("sms", "Price alerts", "0", "0") in rows
