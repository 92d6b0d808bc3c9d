"""An experiment's result page in the admin, and the control group's, through Django's test
client (and once in headless Chromium): the verdict in words, the charts' figures and the same
figures in a table, the period asked by a small form (a bad day is told on its field, never a
500), the REST report's CSV behind the download link; linked from the experiment's page and the
control group's; read by whoever may read experiments, and by nobody else.

The study's days are written directly (limits.models.studies.StudyDay / StudyEvent), as the ledger's
drain and the events API would: a row per day, arm and bucket."""

import json
import re
from datetime import UTC, date, datetime, timedelta
from html import escape
from typing import Any

import pytest
from django.urls import reverse

from gatekeeper.lib.groups import MARKETER
from limits.engine.assignment import CONTROL_GROUP
from limits.models.policy import Holdout
from limits.models.studies import Experiment, StudyDay, StudyEvent
from limits.policy.holdout import holdout_read
from limits.studies.experiments import ArmFields, ExperimentFields, experiment_create
from limits.studies.report import today_utc
from segments.models import Segment
from tests.support.admin import PASSWORD
from tests.support.browser import Page

pytestmark = pytest.mark.django_db

DAY = {"kind": "rolling", "seconds": 86_400}
BUCKETS = range(8)
HOLDOUT = reverse("admin:limits_holdout_report")


def make(*, starts_in: timedelta = timedelta(0)) -> Experiment:
    """'One or three' on every segment: arm 'one' (1 email a day, the reference) and arm
    'three' (3 a day), half each."""
    Segment.objects.get_or_create(slug="vip", defaults={"name": "VIP", "priority": 10})
    now = datetime.now(UTC)
    rule = {"channel": "email", "window": DAY}
    return experiment_create(
        ExperimentFields(
            name="One or three",
            segment="vip",
            arms=[
                ArmFields("one", 0.5, [{**rule, "name": "1 a day", "limit": 1}]),
                ArmFields("three", 0.5, [{**rule, "name": "3 a day", "limit": 3}], "add"),
            ],
            starts_at=now + starts_in,
            ends_at=now + starts_in + timedelta(days=14),
        ),
        via="api",
        now=now,
    )


def fill(study: int, day: date, *, users: tuple[int, int] = (50, 50)) -> None:
    """A day of a study: per bucket, arm 0's users had 1 send each and arm 1's 3 (a clear lift);
    purchases a little more often in arm 1, and a few unsubscribes in both."""
    for bucket in BUCKETS:
        for arm, entered in enumerate(users):
            StudyDay.objects.create(
                study=study,
                day=day,
                arm=arm,
                bucket=bucket,
                entered=entered,
                sends=entered * (1 if arm == 0 else 3) + bucket % 3,
                unsubscribes=(bucket + arm) % 2,
                complaints=0,
            )
            count = 4 + bucket % 3 + 3 * arm
            StudyEvent.objects.create(
                study=study, day=day, arm=arm, bucket=bucket, name="purchase",
                count=count, value=25.0 * count,
            )  # fmt: skip


def report_of(row: Experiment) -> str:
    return reverse("admin:limits_experiment_report", args=[row.pk])


def text(response: Any) -> str:
    return response.content.decode()


def chart_data(response: Any) -> dict[str, Any]:
    """What the page's script draws, as the page embeds it."""
    found = re.search(r'<script id="report-data" type="application/json">(.*?)</script>',
                      text(response), re.S)  # fmt: skip
    assert found is not None
    return json.loads(found.group(1))


@pytest.mark.postgres
def test_the_result_shows_the_verdict_charts_table_and_csv(admin_client):
    row = make()
    today = today_utc()
    fill(row.pk, today)
    shown = admin_client.get(report_of(row))
    assert shown.status_code == 200
    page, report = text(shown), shown.context["report"]
    # The verdict first, in words: arm 'three' against 'one'.
    verdict = report["verdict"]
    assert "'three' brought" in verdict and "more marketing sends per user" in verdict
    assert "than 'one'" in verdict
    assert escape(verdict) in page and page.index('id="report-verdict"') < page.index(
        'id="report-table"'
    )
    assert 'id="report-split-off"' not in page
    # Chart.js as the dashboard has it, from the app's own static files.
    assert "worker/vendor/chartjs/chart.umd.min.js" in page and "cdn" not in page.lower()
    # The table: every measure, each arm's users and mean; the lift of the second.
    assert [g["per_user"] for g in shown.context["table"]] == [
        "marketing sends", "unsubscribes", "complaints", "purchase (conversions)",
        "purchase value",
    ]  # fmt: skip
    sends = shown.context["table"][0]["rows"]
    assert sends[0]["reference"] and sends[0]["users"] == 400 and sends[0]["mean"] == "1.02"
    assert (sends[1]["mean"], sends[1]["significant"]) == ("3.02", "yes")
    assert sends[1]["change"] == "+196.6 %" and sends[1]["p_value"] == "< 0.001"
    assert ">the reference</td>" in page and "<strong>yes</strong>" in page
    # The charts' figures: a chart of means per measure, each with its interval; the changes
    # of arm 'three' on the events' conversions and the base measures, in percent.
    data = chart_data(shown)
    assert data["arms"] == ["one", "three"] and len(data["means"]) == 5
    means = data["means"][0]
    assert means["axis"] == "marketing sends per user" and means["canvas"] == "chart-mean-0"
    assert means["values"] == pytest.approx([1.0175, 3.0175])
    assert all(low < mean < high for low, mean, high in
               zip(means["lows"], means["values"], means["highs"], strict=True))  # fmt: skip
    changes = data["changes"]
    assert changes["labels"] == [
        "purchase (conversions)", "marketing sends", "unsubscribes", "complaints",
    ]  # fmt: skip
    (three,) = changes["arms"]
    assert three["name"] == "three" and three["values"][1] == pytest.approx(100 * (1207 / 407 - 1))
    assert three["values"][3] is None  # no complaints in 'one': no change to tell
    assert 'id="chart-changes"' in page and 'id="chart-mean-4"' in page
    # The CSV: the REST report of the same period, read with the admin's session.
    csv_url = shown.context["csv_url"]
    assert csv_url == (f"/api/v1/reports/experiments/{row.pk}/?format=csv&from={today}&to={today}")
    assert escape(csv_url) in page
    csv = admin_client.get(csv_url)
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    assert len(csv.content.decode().splitlines()) == 1 + 2 * 5


def test_the_period_and_event_are_asked_by_get_and_kept_on_the_form(admin_client):
    row = make()
    today = today_utc()
    fill(row.pk, today)
    asked = admin_client.get(report_of(row), {"from": str(today), "to": str(today),
                                              "event": "purchase"})  # fmt: skip
    assert asked.status_code == 200
    page = text(asked)
    assert f'type="date" name="from" value="{today}"' in page
    assert '<option value="purchase" selected>purchase</option>' in page
    assert "more purchases per user" in asked.context["report"]["verdict"]
    assert asked.context["csv_url"].endswith("&event=purchase")
    # Emptied date fields ask for the default period, as a browser sends them.
    emptied = admin_client.get(report_of(row), {"from": "", "to": "", "event": ""})
    assert emptied.status_code == 200 and emptied.context["report"]["from"] == today


def test_a_bad_period_is_told_on_its_field_with_no_figures(admin_client):
    row = make()
    fill(row.pk, today_utc())
    bad = admin_client.get(report_of(row), {"from": "yesterday"})
    assert bad.status_code == 200
    assert bad.context["form"].errors["from"] == [
        "'yesterday' is not a day: write YYYY-MM-DD (UTC)."
    ]
    page = text(bad)
    assert "&#x27;yesterday&#x27; is not a day" in page and 'id="report-problems"' in page
    assert "report" not in bad.context and 'id="report-table"' not in page
    assert 'value="yesterday"' in page  # what was typed, to correct
    backwards = admin_client.get(report_of(row), {"from": "2030-01-02", "to": "2030-01-01"})
    assert backwards.status_code == 200
    assert backwards.context["form"].errors["to"] == ["On or after `from`."]


def test_the_experiments_page_links_to_its_result_and_a_scheduled_one_has_none_yet(admin_client):
    row = make(starts_in=timedelta(days=2))
    page = text(admin_client.get(reverse("admin:limits_experiment_change", args=[row.pk])))
    assert f'href="{report_of(row)}"' in page and 'id="experiment-result"' in page
    waiting = admin_client.get(report_of(row))
    assert waiting.status_code == 200
    assert "It starts on" in text(waiting) and "report" not in waiting.context
    missing = admin_client.get(reverse("admin:limits_experiment_report", args=[99_999]))
    assert missing.status_code == 302


def test_a_split_that_is_off_is_said_before_the_figures(admin_client):
    row = make()
    fill(row.pk, today_utc(), users=(50, 80))
    shown = admin_client.get(report_of(row))
    assert shown.context["report"]["split_off"] is True
    page = text(shown)
    assert 'id="report-split-off"' in page and "sample ratio mismatch" in page
    assert page.index('id="report-split-off"') < page.index('id="report-table"')


@pytest.mark.postgres
def test_the_control_groups_result_and_its_link_from_its_page(admin_client):
    Holdout.objects.update_or_create(pk=1, defaults={"share": 0.05, "salt": "report"})
    holdout_read()
    for days_ago in (0, 1, 2):
        fill(CONTROL_GROUP, today_utc() - timedelta(days=days_ago))
    shown = admin_client.get(HOLDOUT)
    assert shown.status_code == 200
    report = shown.context["report"]
    assert report["reference"] == "control group (held out)" and report["arms"][0]["users"] == 1200
    assert "'treatment sample' brought" in report["verdict"]
    page = text(shown)
    assert "The global control group" in page and 'id="report-table"' in page
    assert shown.context["csv_url"].startswith("/api/v1/reports/experiments/holdout/?format=csv")
    assert text(admin_client.get(HOLDOUT, {"to": "soon"})).count("is not a day") == 1
    holdout_page = text(admin_client.get(reverse("admin:limits_holdout_change", args=[1])))
    assert f'href="{HOLDOUT}" id="holdout-result"' in holdout_page


def test_only_who_may_read_experiments_reads_results(client, staff, viewer_client):
    row = make()
    fill(row.pk, today_utc())
    assert viewer_client.get(report_of(row)).status_code == 200
    assert viewer_client.get(HOLDOUT).status_code == 200
    viewer_client.logout()
    assert client.get(report_of(row)).status_code == 302  # to the login page
    staff("sam")
    client.login(username="sam", password=PASSWORD)
    assert client.get(report_of(row)).status_code == 403
    assert client.get(HOLDOUT).status_code == 403


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_result_charts_are_drawn(browser, live_server, staff):
    staff("mia", MARKETER)
    row = make()
    fill(row.pk, today_utc())
    page = Page(browser, live_server.url, prefix="experiment-result-")
    page.log_in("mia", report_of(row))
    page.wait_for_charts()
    assert "'three' brought" in page.text() and "Download CSV" in page.text()
    drawn = browser.execute_script(
        "return ['chart-changes', 'chart-mean-0', 'chart-mean-3'].map((id) => Chart.getChart("
        "document.getElementById(id)).data.datasets.map((d) => d.data.length))"
    )
    assert drawn == [[4], [2], [2]]
    page.shot("report")
