"""Rounds in the admin: a marketer makes one (the services' problems shown on their fields),
reads its jobs with their values and, once decided, its report; edits it while open and cancels
it, letting its jobs wait or cancelling them. A send job's form takes a round and a value."""

import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gatekeeper.lib.groups import VIEWER
from tests.support.admin import PASSWORD
from worker.models import Round, SendChunk, SendJob
from worker.round_services import round_create
from worker.rounds import round_project, rounds_close_due
from worker.services import send_job_create

pytestmark = pytest.mark.django_db

ROWS = [{"user_id": u, "address": f"token-{u}"} for u in (1, 2, 9)]
JOB: dict[str, Any] = {"channel": "push", "campaign": "launch", "template": "welcome"}


@pytest.fixture
def push(published, settings):
    published(vip=(10, [1, 2], {"push": (5, 10)}))
    settings.GATEKEEPER_DISPATCHERS = {"push": "null"}


def ahead(**delta: float) -> datetime:
    return (timezone.now() + timedelta(**delta)).replace(microsecond=0)


def form_errors(answer) -> dict[str, list[str]]:
    return {name: list(errors) for name, errors in answer.context["form"].errors.items()}


def test_a_marketer_makes_a_round_and_its_problems_show_on_their_fields(marketer_client, staff):
    add = reverse("admin:worker_round_add")
    assert marketer_client.get(add).status_code == 200
    closes = ahead(hours=2)
    good = {"name": "Friday", "channel": "all", "closes_at": closes.isoformat(), "send_at": ""}
    for change, field, words in (
        ({"closes_at": ahead(hours=-1).isoformat()}, "closes_at", "has passed"),
        ({"closes_at": ahead(days=91).isoformat()}, "closes_at", "At most 90 days ahead"),
        ({"closes_at": "tomorrow"}, "closes_at", ""),
        ({"send_at": ahead(hours=1).isoformat()}, "send_at", "At or after closes_at"),
        ({"name": "  "}, "name", ""),
        ({"channel": "fax"}, "channel", ""),
    ):
        answer = marketer_client.post(add, {**good, **change})
        assert answer.status_code == 200, change  # the form again, with its problem
        errors = form_errors(answer)
        assert field in errors and words in " ".join(errors[field]), (change, errors)
    assert not Round.objects.exists()

    answer = marketer_client.post(add, good)
    made = Round.objects.get()
    assert answer.status_code == 302
    assert answer["Location"] == reverse("admin:worker_round_change", args=[made.pk])
    assert (made.name, made.channel, made.closes_at, made.send_at, made.status) == (
        "Friday",
        "all",
        closes,
        closes,
        "open",
    )
    assert made.created_by.username == "mia"
    listed = marketer_client.get(reverse("admin:worker_round_changelist"))
    assert listed.status_code == 200 and "Friday" in listed.content.decode()

    # A viewer reads rounds, and makes, edits or cancels none.
    staff("vic", VIEWER)
    viewer_client = Client()
    viewer_client.login(username="vic", password=PASSWORD)
    assert viewer_client.get(reverse("admin:worker_round_changelist")).status_code == 200
    assert (
        viewer_client.get(reverse("admin:worker_round_change", args=[made.pk])).status_code == 200
    )
    assert viewer_client.get(add).status_code == 403
    cancel = reverse("admin:worker_round_cancel", args=[made.pk])
    assert viewer_client.post(cancel, {"jobs": "cancel"}).status_code == 403
    assert Round.objects.get().status == "open"


def test_a_rounds_page_lists_its_jobs_with_values_and_the_report_once_decided(
    push, marketer_client
):
    made = round_create(name="Friday", channel="push", closes_at=ahead(hours=2))
    valued = send_job_create(recipients=ROWS, round=made.pk, value=2.5, queue=False, **JOB)
    own = send_job_create(
        recipients=[{**row, "value": 1} for row in ROWS],
        round=made.pk,
        queue=False,
        **{**JOB, "campaign": "own"},
    )
    page = reverse("admin:worker_round_change", args=[made.pk])
    text = marketer_client.get(page).content.decode()
    assert 'id="round-jobs"' in text
    assert f"#{valued.pk}" in text and ">2.5<" in text
    assert f"#{own.pk}" in text and "each recipient&#x27;s own" in text
    assert 'id="round-edit"' in text and 'id="round-cancel"' in text
    assert "Once decided." in text and 'id="round-report"' not in text

    # The job's own page shows its round and value.
    job_page = marketer_client.get(reverse("admin:worker_sendjob_change", args=[valued.pk]))
    assert "Friday" in job_page.content.decode() and "2.5" in job_page.content.decode()

    # Projected: as it is, then with one job's value tried (computed in the background).
    assert "None asked yet" in text and 'id="round-project"' in text
    project = reverse("admin:worker_round_project", args=[made.pk])
    bad = marketer_client.post(project, {"job": valued.pk, "value": ""}, follow=True)
    assert "Give the value to try for the job." in bad.content.decode()
    asked = marketer_client.post(project, {"job": valued.pk, "value": "10"}, follow=True)
    assert f"Projecting the round with job #{valued.pk} worth 10" in asked.content.decode()
    round_project(made.pk, values={valued.pk: 10.0})  # what the worker runs
    text = marketer_client.get(page).content.decode()
    assert f"job #{valued.pk} worth 10" in text and 'id="round-projection"' in text
    # Users 1 and 2 (vip: 5 pushes a day) get both; user 9 (no cap) too.
    assert "Worth 33.00 by value against 33.00 first come, first served" in text

    closes = made.closes_at
    assert rounds_close_due(now=closes) == [made.pk]
    text = marketer_client.get(page).content.decode()
    assert 'id="round-report"' in text and "Worth 10.50 by value" in text
    assert "Of an open round." in text
    assert 'id="round-cancel"' not in text  # only an open round is edited or cancelled


def test_a_marketer_edits_a_round_and_cancels_it_letting_its_jobs_wait_or_cancelling_them(
    push, marketer_client
):
    made = round_create(name="Friday", channel="push", closes_at=ahead(hours=2))
    job = send_job_create(recipients=ROWS, round=made.pk, value=1, queue=False, **JOB)
    edit = reverse("admin:worker_round_edit", args=[made.pk])
    form = marketer_client.get(edit)
    assert form.status_code == 200 and "channel" not in form.context["form"].fields
    send = ahead(hours=5)
    fields = {"name": "Friday deals", "closes_at": made.closes_at.isoformat()}
    refused = marketer_client.post(edit, {**fields, "send_at": ahead(hours=1).isoformat()})
    assert "send_at" in form_errors(refused)
    assert Round.objects.get(pk=made.pk).name == "Friday"
    saved = marketer_client.post(edit, {**fields, "send_at": send.isoformat()})
    assert saved.status_code == 302
    job.refresh_from_db()
    assert (job.start_at, job.expires_at) == (send, send + timedelta(hours=24))
    assert Round.objects.get(pk=made.pk).name == "Friday deals"

    cancel = reverse("admin:worker_round_cancel", args=[made.pk])
    asked = marketer_client.get(cancel).content.decode()
    assert 'value="wait"' in asked and 'value="cancel"' in asked
    assert "jobs" in form_errors(marketer_client.post(cancel, {"jobs": "maybe"}))
    done = marketer_client.post(cancel, {"jobs": "cancel"}, follow=True)
    assert "Cancelled round" in done.content.decode()
    job.refresh_from_db()
    assert (job.status, job.cancelled, job.round_id) == ("cancelled", 3, made.pk)
    assert not SendChunk.objects.filter(job=job).exists()
    again = marketer_client.post(cancel, {"jobs": "wait"}, follow=True)
    assert "only an open round can be cancelled" in again.content.decode()
    assert (
        "only while it is open"
        in marketer_client.post(
            edit, {**fields, "send_at": send.isoformat()}, follow=True
        ).content.decode()
    )

    waiting = round_create(name="Saturday", channel="all", closes_at=ahead(hours=3))
    stays = send_job_create(recipients=ROWS, round=waiting.pk, value=1, queue=False, **JOB)
    marketer_client.post(reverse("admin:worker_round_cancel", args=[waiting.pk]), {"jobs": "wait"})
    stays.refresh_from_db()
    assert (stays.status, stays.round_id, stays.value) == ("scheduled", None, None)
    assert stays.start_at == waiting.send_at
    assert Round.objects.get(pk=waiting.pk).status == "cancelled"


def test_a_campaign_file_joins_a_round_from_the_send_job_form(push, marketer_client):
    made = round_create(name="Friday", channel="push", closes_at=ahead(hours=2))
    add = reverse("admin:worker_sendjob_add")
    assert f'<option value="{made.pk}">' in marketer_client.get(add).content.decode()

    def upload(text: str, **extra: Any):
        fields = {
            "channel": "push",
            "campaign": "launch",
            "template": "welcome",
            "priority": "5",
            "on_capped": "drop",
            "on_invalid": "reject",
            "round": str(made.pk),
            **extra,
        }
        file = io.BytesIO(text.encode())
        file.name = "launch.csv"
        return marketer_client.post(add, {**fields, "recipients_file": file})

    no_value = upload("user_id,address\n1,token-1\n")
    assert "`value` column" in " ".join(form_errors(no_value)["value"])
    assert "value" in form_errors(upload("user_id,address\n1,token-1\n", value="-1"))
    assert "start_at" in form_errors(
        upload("user_id,address\n1,token-1\n", value="2", start_at=ahead(hours=9).isoformat())
    )
    assert not SendJob.objects.exists()
    sent = upload("user_id,address,value\n1,token-1,3\n2,token-2,0.5\n")
    assert sent.status_code == 302
    job = SendJob.objects.get()
    assert (job.round_id, job.value, job.start_at, job.status) == (
        made.pk,
        None,
        made.send_at,
        "preparing",
    )


def test_a_scheduled_job_joins_a_round_and_leaves_it_on_its_edit_form(push, marketer_client):
    made = round_create(name="Friday", channel="push", closes_at=ahead(hours=2))
    start = ahead(hours=6)
    job = send_job_create(recipients=ROWS, start_at=start, queue=False, **JOB)
    edit = reverse("admin:worker_sendjob_edit", args=[job.pk])
    fields = {
        "template": "welcome",
        "tags": "",
        "priority": "5",
        "topic": "",
        "on_capped": "drop",
        "start_at": start.isoformat(),
        "expires_at": job.expires_at.isoformat(),
    }
    refused = marketer_client.post(edit, {**fields, "round": str(made.pk), "value": "-2"})
    assert "value" in form_errors(refused)
    joined = marketer_client.post(edit, {**fields, "round": str(made.pk), "value": "2"})
    assert joined.status_code == 302
    job.refresh_from_db()
    assert (job.round_id, job.value, job.start_at) == (made.pk, 2.0, made.send_at)
    assert job.expires_at == made.send_at + timedelta(hours=24)  # moved with the start
    form = marketer_client.get(edit).context["form"]
    assert form.initial["round"] == made and form.initial["value"] == 2.0
    left = marketer_client.post(
        edit,
        {
            **fields,
            "start_at": job.start_at.isoformat(),
            "expires_at": job.expires_at.isoformat(),
            "round": "",
            "value": "",
        },
    )
    assert left.status_code == 302
    job.refresh_from_db()
    assert (job.round_id, job.value, job.status, job.start_at) == (
        None,
        None,
        "scheduled",
        made.send_at,
    )


def test_send_campaign_joins_a_round_with_a_value(push, tmp_path):
    made = round_create(name="Friday", channel="push", closes_at=ahead(hours=2))
    csv = tmp_path / "list.csv"
    csv.write_text("user_id,address\n1,token-1\n2,token-2\n")
    out = io.StringIO()
    call_command(
        "send_campaign",
        "--channel=push",
        "--template=welcome",
        f"--recipients={csv}",
        f"--round={made.pk}",
        "--value=2.5",
        stdout=out,
    )
    job = SendJob.objects.get()
    assert (job.status, job.round_id, job.value, job.start_at, job.total) == (
        "scheduled",
        made.pk,
        2.5,
        made.send_at,
        2,
    )
    assert f"joined round #{made.pk} (Friday)" in out.getvalue()
    assert {chunk.status for chunk in SendChunk.objects.filter(job=job)} == {"staged"}

    valued = tmp_path / "valued.csv"
    valued.write_text("user_id,address,value\n1,token-1,3\n2,token-2,0.5\n")
    call_command(
        "send_campaign",
        "--channel=push",
        "--template=welcome",
        "--campaign=own",
        f"--recipients={valued}",
        f"--round={made.pk}",
        stdout=io.StringIO(),
    )
    own = SendJob.objects.get(campaign="own")
    rows = SendChunk.objects.get(job=own).recipients
    assert (own.value, [row["value"] for row in rows]) == (None, [3.0, 0.5])

    gone = round_create(name="Gone", channel="push", closes_at=ahead(hours=1))
    Round.objects.filter(pk=gone.pk).update(status=Round.Status.CANCELLED)
    for options, words in (
        ([f"--round={made.pk}", "--value=abc"], "--value: Must be a number"),
        ([f"--round={made.pk}", "--value=-1"], "--value: Must be a number of at least 0"),
        ([f"--round={made.pk}"], "--value: .*`value` column"),  # no value anywhere
        (["--value=1"], "--value: A value counts only in a round"),
        (["--round=x"], "--round"),
        (["--round=999999", "--value=1"], "--round: No round 999999"),
        ([f"--round={gone.pk}", "--value=1"], "--round: Round .* is cancelled"),
        ([f"--round={made.pk}", "--value=1", "--reserve"], "--reserve"),
        ([f"--round={made.pk}", "--value=1", "--wait"], "--wait sends in this process now"),
    ):
        with pytest.raises(CommandError, match=words):
            call_command(
                "send_campaign",
                "--channel=push",
                "--template=welcome",
                "--campaign=bad",
                f"--recipients={csv}",
                *options,
            )
    assert SendJob.objects.count() == 2  # nothing else was stored
