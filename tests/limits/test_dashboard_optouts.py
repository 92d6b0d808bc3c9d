"""The dashboard's topics switched off and back on, per UTC day, counted in the database from
the journal of people's preferences: on and off as the gate reads them (a topic's default where
a person said nothing), a person once a day per topic, only the days shown."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gatekeeper.lib.groups import MARKETER
from limits.engine.topics import TopicFields
from limits.models.people import PreferenceChange
from limits.people.preference_switches import topic_switches
from limits.people.preferences import preferences_patch
from limits.policy.selectors import topics_read
from limits.policy.services import TOPICS
from tests.support.admin import PASSWORD
from tests.support.browser import Page

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 20, 15, 0, tzinfo=UTC)


@pytest.fixture
def topics(db):
    for slug, name, default, channels in (
        ("news", "Product news", "subscribed", ["email", "push"]),
        ("offers", "Offers", "unsubscribed", ["email"]),
        ("terms", "Terms", "required", []),
        ("2024", "Year in review", "subscribed", ["email"]),  # a slug of digits alone
    ):
        TOPICS.create(
            fields=TopicFields(slug=slug, name=name, default=default, channels=channels),
            via="command",
        )


def change(user_id: int, days_ago: int, hour: int = 12, **changes) -> None:
    """A change of a person's preferences, journaled as at `hour` UTC `days_ago` days before
    NOW."""
    preferences_patch(user_id=user_id, changes=changes, topics=topics_read(), source="api")
    at = NOW.replace(hour=hour) - timedelta(days=days_ago)
    latest = PreferenceChange.objects.order_by("-id").first()
    assert latest is not None and latest.user_id == user_id  # the change was journaled
    PreferenceChange.objects.filter(pk=latest.pk).update(changed_at=at)


def by_day(switches, slug: str) -> dict[str, tuple[int, int]]:
    (series,) = [s for s in switches["topics"] if s["slug"] == slug]
    return {
        day.isoformat(): (off, on)
        for day, off, on in zip(switches["days"], series["off"], series["on"], strict=True)
        if off or on
    }


@pytest.mark.postgres
def test_it_counts_people_switching_a_topic_off_and_back_on_per_day(topics):
    change(1, 2, topics={"news": {"email": False}})
    change(1, 2, hour=13, topics={"news": {"push": False}})  # the same day: once
    change(2, 2, topics={"news": {"email": False, "push": False}})
    change(1, 1, topics={"news": {"email": None}})  # back to the default: on
    change(3, 1, topics={"news": {"email": True}})  # on already: no switch
    change(4, 0, channels={"email": False})  # a channel as a whole is no topic's
    change(5, 0, topics={"2024": {"email": False}})
    switches = topic_switches(topics=topics_read(), days=30, now=NOW)
    assert switches is not None
    assert by_day(switches, "news") == {"2026-03-18": (2, 0), "2026-03-19": (0, 1)}
    assert by_day(switches, "2024") == {"2026-03-20": (1, 0)}
    assert [s["slug"] for s in switches["topics"]] == ["2024", "news"]
    assert (switches["off_total"], switches["on_total"]) == (3, 1)
    assert switches["rows"] == [
        {"day": NOW.date(), "slug": "2024", "off": 1, "on": 0},
        {"day": NOW.date() - timedelta(days=1), "slug": "news", "off": 0, "on": 1},
        {"day": NOW.date() - timedelta(days=2), "slug": "news", "off": 2, "on": 0},
    ]


@pytest.mark.postgres
def test_a_topic_people_must_ask_for_is_on_only_once_they_did(topics):
    change(1, 3, topics={"offers": {"email": False}})  # off already: no switch
    change(2, 3, topics={"offers": {"email": True}})
    change(2, 1, topics={"offers": {"email": None}})  # back to the default: off
    switches = topic_switches(topics=topics_read(), days=30, now=NOW)
    assert switches is not None
    assert by_day(switches, "offers") == {"2026-03-17": (0, 1), "2026-03-19": (1, 0)}


@pytest.mark.postgres
def test_only_the_days_shown_are_counted_in_one_query_bounded_by_time(topics):
    change(1, 30, topics={"news": {"email": False}})  # a day before the 30 shown
    change(1, 29, hour=0, topics={"news": {"email": None}})  # the first day shown, at 00:00
    known = topics_read()
    with CaptureQueriesContext(connection) as queries:
        switches = topic_switches(topics=known, days=30, now=NOW)
    assert switches is not None
    assert len(switches["days"]) == 30 and switches["days"][0].isoformat() == "2026-02-19"
    assert by_day(switches, "news") == {"2026-02-19": (0, 1)}
    (query,) = queries.captured_queries
    assert query["sql"].count('"changed_at" >=') == 1 and query["sql"].count('"changed_at" <') == 1
    assert topic_switches(topics=topics_read(), days=30, now=NOW + timedelta(days=30)) is None


@pytest.mark.postgres
def test_nobody_switching_anything_is_none(topics):
    change(1, 0, paused_until=NOW + timedelta(days=400))
    assert topic_switches(topics=topics_read(), days=30, now=NOW) is None
    assert topic_switches(topics={}, days=30, now=NOW) is None


def dashboard(client) -> tuple[str, dict]:
    response = client.get(reverse("admin:dashboard"))
    assert response.status_code == 200
    page = re.sub(r"\s+", " ", response.content.decode())
    data = re.search(r'id="dashboard-data" type="application/json">(.*?)</script>', page)
    assert data is not None
    return page, json.loads(data.group(1))


@pytest.mark.postgres
def test_the_dashboard_charts_and_tables_the_switches_by_topic_name(
    topics, viewer_client, redis_client
):
    page, data = dashboard(viewer_client)
    assert data["switches"] is None and 'id="no-switches"' in page
    change(1, 0, topics={"news": {"email": False}})  # today, as the page's clock has it
    PreferenceChange.objects.update(changed_at=datetime.now(tz=UTC))
    page, data = dashboard(viewer_client)
    switches = data["switches"]
    assert (
        len(switches["days"]) == 30
        and switches["days"][-1] == datetime.now(tz=UTC).date().isoformat()
    )
    assert switches["off"] == [{"label": "Product news", "values": [0] * 29 + [1]}]
    assert switches["on"] == [{"label": "Product news", "values": [0] * 30}]
    assert 'id="chart-switched-off"' in page and 'id="chart-switched-on"' in page
    assert re.search(
        r'id="switches-table">.*<td>Product news</td><td class="num">1</td><td class="num">0</td>',
        page,
    )


def test_the_switches_need_the_right_to_read_preferences(topics, client, staff, redis_client):
    user = staff("sam")
    user.user_permissions.add(Permission.objects.get(codename="view_segment"))  # the dashboard's
    client.login(username="sam", password=PASSWORD)
    change(1, 0, topics={"news": {"email": False}})
    page, data = dashboard(client)
    assert data["switches"] is None and 'id="switches"' not in page


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_switch_charts_are_drawn(browser, live_server, staff, topics, redis_client):
    staff("mia", MARKETER)
    for user_id, choices in ((1, {"news": {"email": False}}), (2, {"offers": {"email": True}})):
        preferences_patch(
            user_id=user_id, changes={"topics": choices}, topics=topics_read(), source="api"
        )
    page = Page(browser, live_server.url, prefix="switches-")
    page.log_in("mia", "/admin/dashboard/")
    page.wait_for_charts()
    assert "Topics switched off and back on, the last 30 days (UTC)" in page.text()
    drawn = browser.execute_script(
        "return ['chart-switched-off', 'chart-switched-on'].map((id) => Chart.getChart("
        "document.getElementById(id)).data.datasets.map((d) => d.label + ':' + d.data.at(-1)))"
    )
    assert drawn == [["Product news:1", "Offers:0"], ["Product news:0", "Offers:1"]]  # by slug
    page.find("#switches").location_once_scrolled_into_view  # noqa: B018
    page.shot("dashboard")
