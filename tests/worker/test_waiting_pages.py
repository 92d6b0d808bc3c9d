"""Waiting sends in the admin: a job's page shows them and cancels them (POST, CSRF, the right to,
audited), the dashboard counts them by hour of release, and the user lookup says whether quiet
hours hold the user now and until when. Real snapshot, rules, Redis; the real clock (the
quiet hours are laid around it)."""

import json
import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from limits.engine.quiet import QuietFields
from limits.models.policy import QuietHours
from limits.policy.services import QUIET_HOURS
from segments.models import Segment
from tests.support.admin import PASSWORD
from tests.support.sends import make_job, run_all
from worker.models import SendJob

pytestmark = pytest.mark.django_db
PARIS = ZoneInfo("Europe/Paris")


def text(response) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


@pytest.fixture
def waiting_job(published, redis_client) -> SendJob:
    """Three VIP users in Paris, quiet from an hour ago to three hours from now (their clock),
    released over 30 minutes; a job to them with on_capped=defer, run now: all three wait."""
    published(vip=(10, [1, 2, 3], {}))
    Segment.objects.filter(slug="vip").update(time_zone="Europe/Paris")
    # Counted in UTC, then read on Paris's clocks: arithmetic on a Paris time would be off by
    # an hour across a change of summer time.
    now = timezone.now()
    QUIET_HOURS.create(
        fields=QuietFields(
            segment="vip",
            channel="email",
            start=f"{(now - timedelta(hours=1)).astimezone(PARIS):%H:%M}",
            end=f"{(now + timedelta(hours=3)).astimezone(PARIS):%H:%M}",
            spread_minutes=30,
        ),
        via="command",
    )
    job = make_job(1, 2, 3, campaign="evening", on_capped="defer")
    run_all(job)
    job.refresh_from_db()
    assert (job.reasons, job.pending) == ({"quiet_hours": 3}, 3)
    return job


def test_a_marketer_sees_a_jobs_waiting_sends_and_cancels_them(marketer_client, waiting_job):
    page_url = reverse("admin:worker_sendjob_change", args=[waiting_job.pk])
    cancel_url = reverse("admin:worker_sendjob_cancel_waiting", args=[waiting_job.pk])
    page = text(marketer_client.get(page_url))
    assert "<strong>3</strong> sends deferred by the gate" in page
    assert f'action="{cancel_url}"' in page and 'id="cancel-waiting"' in page
    assert marketer_client.get(cancel_url).status_code == 405  # a POST only
    # The form's CSRF token is required.
    forged = Client(enforce_csrf_checks=True)
    forged.login(username="mia", password=PASSWORD)
    assert forged.post(cancel_url).status_code == 403
    waiting_job.refresh_from_db()
    assert waiting_job.cancelled == 0

    answer = marketer_client.post(cancel_url, follow=True)
    assert answer.redirect_chain[-1][0] == page_url
    page = text(answer)
    assert "Cancelled 3 waiting sends." in page
    assert "No send of this job is waiting. Its waiting sends were cancelled at" in page
    assert "by mia" in page
    waiting_job.refresh_from_db()
    assert (waiting_job.cancelled, waiting_job.pending, waiting_job.status) == (3, 0, "done")
    assert waiting_job.waiting_cancelled_by.username == "mia"
    entry = LogEntry.objects.get(object_id=str(waiting_job.pk))
    assert (entry.user.username, entry.get_change_message()) == ("mia", "Cancelled 3 waiting sends")
    listing = text(marketer_client.get(reverse("admin:worker_sendjob_changelist")))
    assert '<td class="field-cancelled">3</td>' in listing


def test_a_viewer_sees_waiting_sends_but_cannot_cancel_them(viewer_client, waiting_job):
    page = text(viewer_client.get(reverse("admin:worker_sendjob_change", args=[waiting_job.pk])))
    assert "<strong>3</strong> sends deferred by the gate" in page
    assert 'id="cancel-waiting"' not in page
    cancel_url = reverse("admin:worker_sendjob_cancel_waiting", args=[waiting_job.pk])
    assert viewer_client.post(cancel_url).status_code == 403
    waiting_job.refresh_from_db()
    assert (waiting_job.cancelled, waiting_job.pending) == (0, 3)


@pytest.mark.postgres
def test_the_dashboard_counts_waiting_sends_by_hour_of_release(marketer_client, waiting_job):
    page = text(marketer_client.get(reverse("admin:dashboard")))
    assert '<strong id="waiting-total">3</strong>' in page
    table = re.search(r'<table class="gk-table" id="waiting-by-hour">(.*?)</table>', page).group(1)
    rows = re.findall(r'<td>(\w{3} [\d-]+ \d\d:00)</td><td class="num">(\d+)</td>', table)
    assert sum(int(n) for _, n in rows) == 3
    release = waiting_job.chunks.filter(kind="deferred").order_by("not_before").first().not_before
    assert f"{release:%Y-%m-%d %H}:00" in table
    data = json.loads(
        re.search(r'id="dashboard-data" type="application/json">(.*?)</script>', page).group(1)
    )
    assert len(data["waiting"]["values"]) == 48 and sum(data["waiting"]["values"]) == 3


def test_the_user_lookup_says_whether_quiet_hours_hold_the_user_now(marketer_client, waiting_job):
    page = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": "1"}))
    assert "Time zone <strong>Europe/Paris</strong> (their segment&#x27;s)" in page
    table = re.search(r'<table class="gk-table" id="quiet-hours">(.*?)</table>', page).group(1)
    email, push, sms = re.findall(r"<tr><td>(.*?)</tr>", table)
    end = QuietHours.objects.get().end  # three hours from when the fixture laid it out
    assert email.startswith("email") and '<span class="gk-badge gk-warn">quiet</span>' in email
    assert re.search(rf"until [\d-]+ {end:%H:%M} their time \(\d\d:\d\d UTC, in 2 h 5\d min", email)
    assert "(their own place in the spread)" in email
    assert "Vip users: no marketing emails from" in email
    assert push.startswith("push") and "<td>now</td>" in push and "none" in push
    assert sms.startswith("sms") and "<td>now</td>" in sms and "none" in sms
