"""Deliverability's settings in the admin: a marketer adds and changes mailbox providers and
warm-up plans (each form's problems on their fields, nothing saved; each save in the settings'
history, via admin), reads rates in words and a plan's ramp and day; a paused group stands out
in a banner with the brake's figures and the email waiting, and its Resume button hands that
email out; a send job's page says what its held sends wait for."""

import json
import re
from datetime import UTC, timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gatekeeper.lib.groups import VIEWER
from limits.models.policy import SettingChange
from tests.support.admin import PASSWORD
from tests.support.mailboxes import waiting_chunk
from tests.support.sends import recipients, run_all
from worker.delivery.mailbox_reads import plan_of
from worker.delivery.mailbox_settings import mailbox_pause, warmup_create
from worker.delivery.warmup import DEFAULT_RAMP, warmup_plans, warmup_take
from worker.models import MailboxProvider, SendChunk, WarmupPlan
from worker.services import send_job_create

pytestmark = pytest.mark.django_db

GROUPS = reverse("admin:worker_mailboxprovider_changelist")
ADD_GROUP = reverse("admin:worker_mailboxprovider_add")
ADD_PLAN = reverse("admin:worker_warmupplan_add")
WHY = {
    "complaints": 12,
    "delivered": 3_400,
    "complaint_rate": 0.0035,
    "bounces": 3,
    "bounce_rate": 0.0009,
    "words": "Complaints reached 0.3 % of the last 24 hours' delivered mail.",
}
GOOD_GROUP = {
    "slug": "proton",
    "name": "Proton",
    "domains": "proton.me\nprotonmail.*\n",
    "mx_hosts": "protonmail.ch",
    "rates": '[{"dispatcher": "smtp", "per_second": 5}]',
}


def form_errors(answer) -> dict[str, str]:
    form = answer.context["adminform"].form
    return {name: " ".join(errors) for name, errors in form.errors.items()}


def text(answer) -> str:
    return re.sub(r"\s+", " ", answer.content.decode())


def changes(kind: str) -> list[tuple[str, str, str]]:
    return [
        (c.action, c.via, c.by.username if c.by else "")
        for c in SettingChange.objects.filter(kind=kind).order_by("at", "pk")
    ]


def test_a_marketer_adds_and_changes_a_group_its_problems_shown_on_their_fields(marketer_client):
    for change, field, words in (
        ({"domains": "gmail.com"}, "domains", "is in the group 'gmail' already"),
        ({"domains": "Proton.me"}, "domains", "Write it in lowercase: proton.me"),
        ({"rates": '[{"dispatcher": "smtp", "per_second": -3}]'}, "rates", "more than 0"),
        ({"rates": '[{"dispatcher": "smtp"}]'}, "rates", "give per_second"),
        ({"rates": "[{dispatcher: smtp}"}, "rates", "valid JSON"),
        ({"mx_hosts": "not a host"}, "mx_hosts", "has a space in it"),
        ({"slug": "gmail"}, "slug", "already exists"),
        ({"name": "  "}, "name", "required"),
    ):
        answer = marketer_client.post(ADD_GROUP, {**GOOD_GROUP, **change})
        assert answer.status_code == 200, change  # the form again, with its problem
        errors = form_errors(answer)
        assert words in errors.get(field, ""), (change, errors)
    assert not MailboxProvider.objects.filter(slug="proton").exists()
    assert changes("mailbox_provider") == []

    assert marketer_client.post(ADD_GROUP, GOOD_GROUP).status_code == 302
    proton = MailboxProvider.objects.get(slug="proton")
    assert (proton.domains, proton.mx_hosts) == (["proton.me", "protonmail.*"], ["protonmail.ch"])
    listed = text(marketer_client.get(GROUPS))
    assert "5 a second through smtp" in listed
    assert "every domain no group names" in listed  # other's domains

    page = reverse("admin:worker_mailboxprovider_change", args=[proton.pk])
    shown = marketer_client.get(page)
    assert shown.status_code == 200 and "5 a second through smtp" in text(shown)
    rates = '[{"dispatcher": "*", "per_minute": 600, "per_hour": 20000}]'
    bad = marketer_client.post(page, {**GOOD_GROUP, "rates": rates, "domains": "live.*"})
    assert "is in the group 'microsoft' already" in form_errors(bad)["domains"]
    saved = marketer_client.post(page, {**GOOD_GROUP, "rates": rates})
    assert saved.status_code == 302
    proton.refresh_from_db()
    assert proton.rates == [
        {"dispatcher": "*", "per_second": None, "per_minute": 600, "per_hour": 20000}
    ]
    assert "600 a minute and 20000 a hour through every dispatcher" in text(
        marketer_client.get(page)
    )
    assert changes("mailbox_provider") == [("created", "admin", "mia"), ("changed", "admin", "mia")]


def test_other_cannot_be_deleted_nor_a_group_a_plan_names(marketer_client):
    other = MailboxProvider.objects.get(slug="other")
    refused = marketer_client.get(
        reverse("admin:worker_mailboxprovider_delete", args=[other.pk]), follow=True
    )
    assert "&#x27;other&#x27; takes every domain no group names: it cannot be deleted" in text(
        refused
    )
    assert refused.redirect_chain[-1][0].endswith(f"/{other.pk}/change/")
    assert 'class="deletelink"' not in text(refused)  # no Delete link on its page
    warmup_create({"domain": "mail.example.com", "volumes": {"apple": [5, 10]}})
    apple = MailboxProvider.objects.get(slug="apple")
    answer = marketer_client.post(
        reverse("admin:worker_mailboxprovider_delete", args=[apple.pk]), {"post": "yes"}
    )
    assert answer.status_code == 302
    assert MailboxProvider.objects.filter(slug="apple").exists()
    shown = text(marketer_client.get(answer["Location"]))
    assert "The warm-up plan of mail.example.com names &#x27;apple&#x27;" in shown
    assert [c[0] for c in changes("mailbox_provider")] == []


@pytest.fixture
def braked(published, smtp):
    """Yahoo paused by its brake, a job's email to it waiting (held by a real chunk run)."""
    published(vip=(10, list(range(1, 20)), {}))
    yahoo = MailboxProvider.objects.get(slug="yahoo")
    mailbox_pause(yahoo, WHY, now=timezone.now() - timedelta(hours=2))
    job = send_job_create(
        channel="email",
        campaign="spring",
        template="welcome",
        recipients=recipients(1, 2, 3, domain="yahoo.com"),
        queue=False,
        on_capped="defer",
    )
    run_all(job)
    held = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED, held="brake:yahoo")
    assert held.size == 3
    return job, held


def test_a_paused_group_stands_out_with_its_figures_and_is_resumed_by_its_button(
    braked, marketer_client, staff
):
    _, held = braked
    staff("vic", VIEWER)
    viewer_client = Client()
    viewer_client.login(username="vic", password=PASSWORD)
    for page in (reverse("admin:index"), GROUPS, reverse("admin:dashboard")):
        shown = text(marketer_client.get(page))
        assert 'id="mailbox-banner"' in shown, page
        assert "Yahoo and AOL (yahoo) is paused by its brake" in shown
        assert "12 complaints of 3,400 delivered (0.35 %); 3 hard bounces (0.09 %)" in shown
        assert "Complaints reached 0.3 %" in shown
        assert "<strong>3</strong> emails wait for it" in shown
        assert 'id="resume-yahoo"' in shown
    # A viewer sees why, and has no button; a resume of theirs is refused.
    seen = text(viewer_client.get(reverse("admin:index")))
    assert "Yahoo and AOL (yahoo) is paused" in seen and 'id="resume-yahoo"' not in seen
    resume = reverse("admin:worker_mailboxprovider_resume", args=["yahoo"])
    assert viewer_client.post(resume).status_code == 403
    assert MailboxProvider.objects.get(slug="yahoo").paused_at is not None
    assert marketer_client.get(resume).status_code == 405

    asked = timezone.now()
    answer = marketer_client.post(resume, {"next": GROUPS})
    assert (answer.status_code, answer["Location"]) == (302, GROUPS)
    yahoo = MailboxProvider.objects.get(slug="yahoo")
    assert yahoo.paused_at is None and yahoo.resumed_at is not None
    assert yahoo.resumed_at >= asked
    held.refresh_from_db()
    assert held.not_before is not None
    assert asked <= held.not_before <= timezone.now()
    after = text(marketer_client.get(GROUPS))
    assert "Resumed Yahoo and AOL: 3 waiting recipients handed out now" in after
    assert 'id="mailbox-banner"' not in after
    assert changes("mailbox_provider") == [("paused", "brake", ""), ("resumed", "admin", "mia")]
    again = text(marketer_client.post(resume, {"next": GROUPS}, follow=True))
    assert "is not paused: there is nothing to resume" in again
    assert len(changes("mailbox_provider")) == 2


def test_a_send_jobs_page_says_what_its_held_sends_wait_for(braked, marketer_client):
    job, _ = braked
    plan = warmup_create(
        {"domain": "mail.example.com", "starts_on": timezone.now().date() - timedelta(days=2)}
    )
    waiting_chunk("warmup:mail.example.com:gmail", 4, job=job)
    page = text(marketer_client.get(reverse("admin:worker_sendjob_change", args=[job.pk])))
    assert 'id="holds-table"' in page
    assert re.search(
        r'data-held="brake:yahoo".*?<strong>yahoo</strong> to be resumed: paused by its brake '
        r'since .*?<td class="num">3</td>',
        page,
    ), page
    following = plan_of(plan).day(timezone.now())[2].astimezone(UTC)
    assert re.search(
        r'data-held="warmup:mail.example.com:gmail">.*?the warm-up of <strong>mail.example.com'
        rf"</strong> for <strong>gmail</strong>: day 3 \(.*?\), its next day starts at "
        rf'{following:%Y-%m-%d %H:%M} UTC</td> <td class="num">4</td>',
        page,
    ), page


def test_a_marketer_adds_a_plan_with_the_default_ramp_and_reads_its_day(marketer_client):
    offered = marketer_client.get(ADD_PLAN)
    assert 'id="default-ramp"' in text(offered)
    prefilled = marketer_client.get(ADD_PLAN + "?ramp=default")
    volumes = json.loads(prefilled.context["adminform"].form.initial["volumes"])
    assert volumes == {g: list(DEFAULT_RAMP) for g in ("apple", "gmail", "microsoft", "yahoo")}

    today = timezone.now().date()
    good = {"domain": "mail.example.com", "time_zone": "UTC", "starts_on": today.isoformat()}
    for change, field, words in (
        ({"volumes": '{"gmial": [5]}'}, "volumes", "'gmial' is no mailbox provider"),
        ({"volumes": '{"gmail": [50, 0, 100]}'}, "volumes", "gmail, day 2: 0"),
        ({"volumes": '{"gmail": [50'}, "volumes", "valid JSON"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "Mars/Olympus"),
        ({"domain": "mail example.com"}, "domain", "has a space in it"),
        ({"starts_on": "someday"}, "starts_on", "valid date"),
    ):
        answer = marketer_client.post(ADD_PLAN, {**good, **change})
        assert answer.status_code == 200, change
        assert words in form_errors(answer).get(field, ""), (change, form_errors(answer))
    assert not WarmupPlan.objects.exists()
    assert changes("warmup") == []

    assert marketer_client.post(ADD_PLAN, {**good, "volumes": ""}).status_code == 302
    plan = WarmupPlan.objects.get()
    assert plan.volumes == volumes  # empty: the default ramp
    warmup_take(warmup_plans(fresh=True)["mail.example.com"], today, {"gmail": (20, 50)})
    waiting_chunk("warmup:mail.example.com:gmail", 7)
    page = reverse("admin:worker_warmupplan_change", args=[plan.pk])
    shown = text(marketer_client.get(page))
    assert f"Day 1, {today:%Y-%m-%d} in UTC" in shown
    assert '<tr><th>gmail</th><td class="num">50</td><td class="num">20</td>' in shown
    assert '<td class="num">7</td>' in shown
    assert "gmail: 50, 100, 200 … 700,000 over 20 days" in shown
    assert "day 1 of 20" in text(marketer_client.get(reverse("admin:worker_warmupplan_changelist")))

    changed = marketer_client.post(page, {**good, "volumes": '{"gmail": [100, 200]}'})
    assert changed.status_code == 302
    assert WarmupPlan.objects.get().volumes == {"gmail": [100, 200]}
    refused = marketer_client.post(page, {**good, "volumes": "{}"})
    assert "volumes" in form_errors(refused)
    assert WarmupPlan.objects.get().volumes == {"gmail": [100, 200]}
    deleted = marketer_client.post(
        reverse("admin:worker_warmupplan_delete", args=[plan.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 302 and not WarmupPlan.objects.exists()
    assert changes("warmup") == [
        ("created", "admin", "mia"),
        ("changed", "admin", "mia"),
        ("deleted", "admin", "mia"),
    ]


def test_a_viewer_reads_the_pages_and_saves_nothing(viewer_client):
    warmup_create({"domain": "mail.example.com"})
    gmail = MailboxProvider.objects.get(slug="gmail")
    assert viewer_client.get(GROUPS).status_code == 200
    page = reverse("admin:worker_mailboxprovider_change", args=[gmail.pk])
    assert viewer_client.get(page).status_code == 200
    assert viewer_client.post(page, {**GOOD_GROUP, "slug": "gmail"}).status_code == 403
    assert viewer_client.post(ADD_GROUP, GOOD_GROUP).status_code == 403
    plan = WarmupPlan.objects.get()
    assert (
        viewer_client.get(reverse("admin:worker_warmupplan_change", args=[plan.pk])).status_code
        == 200
    )
    assert MailboxProvider.objects.get(slug="gmail").name == "Gmail"
    assert not MailboxProvider.objects.filter(slug="proton").exists()
    assert changes("mailbox_provider") == []
