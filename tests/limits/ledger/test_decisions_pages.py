"""The dashboard's chart of refused sends over the last 30 days (by reason, by campaign) and its
CSV download, read from the ledger's hourly counts; an empty ledger leaves the page working."""

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from gatekeeper.lib.groups import MARKETER
from limits.ledger.drain import ledger_drain_all
from limits.models.ledger import LedgerCount
from limits.reasons import REFUSED
from tests.support.browser import Page
from worker.gate import gate_check

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def midnight(days_ago: int) -> datetime:
    return datetime.now(tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0) - days_ago * DAY


def chart_data(response) -> dict:
    page = response.content.decode()
    found = re.search(r'id="dashboard-data" type="application/json">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def add(hours_ago_midnight: int, n: int, *, campaign: str, reason: str, days_ago: int = 0):
    LedgerCount.objects.create(
        hour=midnight(days_ago) + timedelta(hours=hours_ago_midnight),
        channel="email",
        campaign=campaign,
        segment="vip",
        reason=reason,
        count=n,
    )


def test_an_empty_ledger_leaves_the_dashboard_working(marketer_client, redis_client):
    response = marketer_client.get(reverse("admin:dashboard"))
    assert response.status_code == 200
    assert chart_data(response)["refused"] is None
    page = response.content.decode()
    assert "No refused sends in the send ledger in the last 30 days." in page
    assert 'id="decisions-csv"' in page


@pytest.mark.postgres
def test_the_chart_shows_refused_sends_per_day_by_reason_and_by_campaign(
    marketer_client, redis_client
):
    # Ten campaigns refused on different days; admitted sends are no part of the chart.
    for n in range(10):
        add(3, 10 - n, campaign=f"c{n}", reason="daily_cap", days_ago=n)
    add(5, 4, campaign="c0", reason="quiet_hours")
    add(5, 6, campaign="", reason="unavailable", days_ago=1)
    add(5, 1000, campaign="c0", reason="allowed")
    add(5, 1000, campaign="c0", reason="exempt")
    add(5, 99, campaign="c0", reason="blocked", days_ago=30)  # 31 days ago: outside
    data = chart_data(marketer_client.get(reverse("admin:dashboard")))["refused"]
    today = midnight(0).date()
    assert len(data["days"]) == 30
    assert (data["days"][0], data["days"][-1]) == (str(today - 29 * DAY), str(today))
    assert data["total"] == 55 + 4 + 6
    reasons = {s["label"]: s["values"] for s in data["reasons"]}
    assert list(reasons) == ["daily_cap", "quiet_hours", "unavailable"]  # REFUSED's order
    assert reasons["daily_cap"][-1] == 10 and reasons["daily_cap"][-10] == 1
    assert reasons["quiet_hours"][-1] == 4 and reasons["unavailable"][-2] == 6
    campaigns = [s["label"] for s in data["campaigns"]]
    # The seven with the most refused sends, the rest together.
    assert campaigns == ["c0", "c1", "c2", "c3", "(no campaign)", "c4", "c5", "other campaigns"]
    assert data["campaigns"][0]["values"][-1] == 14
    assert sum(data["campaigns"][-1]["values"]) == 4 + 3 + 2 + 1  # c6 to c9


@pytest.mark.postgres
def test_decisions_of_the_gate_reach_the_chart_through_the_ledger(marketer_client, published):
    published(vip=(10, [1, 2], {"email": (1, None)}))
    now = datetime.now(tz=UTC)
    gate_check(channel="email", requests=[(1, "a"), (1, "b"), (1, "c")], campaign="spring", now=now)
    ledger_drain_all()
    data = chart_data(marketer_client.get(reverse("admin:dashboard")))["refused"]
    assert data["total"] == 2
    assert [(s["label"], s["values"][-1]) for s in data["reasons"]] == [("daily_cap", 2)]
    assert [(s["label"], s["values"][-1]) for s in data["campaigns"]] == [("spring", 2)]


@pytest.mark.postgres
def test_the_csv_download_is_the_reports_rows(marketer_client, redis_client):
    add(1, 3, campaign="spring", reason="daily_cap", days_ago=2)
    add(2, 5, campaign="=cmd", reason="weekly_cap", days_ago=2)
    add(2, 50, campaign="spring", reason="allowed", days_ago=2)
    page = marketer_client.get(reverse("admin:dashboard")).content.decode()
    link = re.search(r'id="decisions-csv" href="([^"]+)"', page)
    assert link is not None
    href = link.group(1).replace("&amp;", "&")
    assert "".join(f"&reason={reason}" for reason in REFUSED) in href
    response = marketer_client.get(href)
    assert response.status_code == 200 and response["Content-Type"] == "text/csv; charset=utf-8"
    day = str(midnight(2).date())
    first, last = str(midnight(29).date()), str(midnight(0).date())
    assert response["Content-Disposition"] == f'attachment; filename="decisions-{first}-{last}.csv"'
    assert list(csv.reader(io.StringIO(response.content.decode()))) == [
        ["day", "campaign", "segment", "channel", "reason", "count"],
        [day, "'=cmd", "vip", "email", "weekly_cap", "5"],
        [day, "spring", "vip", "email", "daily_cap", "3"],
    ]
    # The report's query string, the report's rules.
    url = reverse("admin:decisions_csv")
    total = marketer_client.get(url, {"group_by": "", "from": day, "to": day})
    assert total.content.decode() == "count\r\n58\r\n"
    bad = marketer_client.get(url, {"group_by": "week", "to": "yesterday"})
    assert bad.status_code == 400
    assert "group_by: Unknown field 'week'" in bad.content.decode()
    assert "to: 'yesterday' is not a day" in bad.content.decode()


def test_the_csv_download_needs_the_dashboards_right(client, staff, viewer_client):
    assert viewer_client.get(reverse("admin:decisions_csv")).status_code == 200
    staff("sam")
    client.login(username="sam", password="a-long-test-password")
    assert client.get(reverse("admin:decisions_csv")).status_code == 403
    client.logout()
    # Logged out: the admin's login page.
    assert client.get(reverse("admin:decisions_csv")).status_code == 302


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_refused_charts_are_drawn(browser, live_server, staff, redis_client):
    staff("mia", MARKETER)
    for n in range(12):
        for reason in ("daily_cap", "weekly_cap", "quiet_hours"):
            add(
                n,
                5 + (n * 7 + len(reason)) % 20,
                campaign=f"spring-{n % 9}",
                reason=reason,
                days_ago=n * 2,
            )
    page = Page(browser, live_server.url, prefix="refused-")
    page.log_in("mia", "/admin/dashboard/")
    page.wait_for_charts()
    assert "Refused sends, the last 30 days (UTC)" in page.text()
    drawn = browser.execute_script(
        "return ['chart-refused-reasons', 'chart-refused-campaigns']"
        ".map((id) => Chart.getChart(document.getElementById(id)).data.datasets.length)"
    )
    assert drawn == [3, 8]
    page.find("#refused").location_once_scrolled_into_view  # noqa: B018
    page.shot("dashboard")
