"""Scheduled send jobs: a job with a start_at waits as `scheduled` (nothing handed out), can be
edited, rescheduled, started early, paused or cancelled until then, and is started by beat's
task once its time has come; over REST, from a file, and from send_campaign."""

import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.utils import timezone

from gatekeeper.lib.conflicts import Conflict
from tests.support import broker
from tests.support.api import call
from worker import tasks
from worker.chunks import send_chunk_run
from worker.models import SendChunk, SendJob
from worker.preparing import send_job_prepare_run
from worker.scheduling import jobs_start_due
from worker.services import (
    send_job_cancel,
    send_job_create,
    send_job_edit,
    send_job_from_file,
    send_job_pause,
    send_job_resume,
    send_job_start,
)

JOB: dict[str, Any] = {"channel": "push", "campaign": "launch", "template": "welcome"}
RECIPIENTS = [{"user_id": u, "address": f"token-{u}"} for u in (1, 2, 9)]


@pytest.fixture
def push(published, settings):
    published(vip=(10, [1, 2], {"push": (5, 10)}))
    settings.GATEKEEPER_DISPATCHERS = {"push": "null"}
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2


def ahead(**delta: float) -> datetime:
    return timezone.now() + timedelta(**delta)


def chunk_states(job: SendJob) -> list[str]:
    return list(SendChunk.objects.filter(job=job).order_by("pk").values_list("status", flat=True))


def adds_up(job: SendJob) -> bool:
    return job.processed + job.pending == job.total


@pytest.mark.django_db
def test_a_scheduled_job_waits_staged_and_beat_starts_it_at_its_time(push):
    start = ahead(hours=3)
    job = send_job_create(recipients=RECIPIENTS, start_at=start, queue=False, **JOB)
    assert (job.status, job.total, job.start_at, job.started_at) == ("scheduled", 3, start, None)
    assert job.expires_at == start + timedelta(hours=24)  # the default counts from the start
    assert chunk_states(job) == ["staged", "staged"]  # nothing a worker could take
    assert job.progress == 0 and adds_up(job)

    assert jobs_start_due(now=start - timedelta(seconds=1)) == []  # not yet
    job.refresh_from_db()
    assert job.status == "scheduled"
    ids = jobs_start_due(now=start)
    job.refresh_from_db()
    assert (job.status, job.started_at) == ("queued", start)
    assert chunk_states(job) == ["queued", "queued"]
    assert ids == list(
        SendChunk.objects.filter(job=job).order_by("pk").values_list("pk", flat=True)
    )
    assert jobs_start_due(now=start + timedelta(seconds=2)) == []  # started once
    for chunk_id in ids:
        send_chunk_run(chunk_id=chunk_id, now=start)
    job.refresh_from_db()
    assert (job.status, job.sent) == ("done", 3)


@pytest.mark.django_db
def test_beats_task_queues_the_started_jobs_chunks(push):
    broker.clear("sends")
    start = ahead(minutes=10)
    job = send_job_create(recipients=RECIPIENTS, start_at=start, **JOB)
    assert broker.queued("sends") == []  # a scheduled job queues nothing when handed over
    assert tasks.send_jobs_start_due(now=start.isoformat()) == 2
    queued = broker.queued("sends")
    assert [name for name, _ in queued] == ["worker.tasks.send_chunk"] * 2
    job.refresh_from_db()
    assert job.status == "queued"


@pytest.mark.postgres
@pytest.mark.django_db
def test_until_it_starts_a_job_is_edited_rescheduled_and_its_expiry_moves_with_it(push):
    start = ahead(days=2)
    job = send_job_create(
        recipients=RECIPIENTS, start_at=start, expires_at=start + timedelta(hours=6), **JOB
    )
    later = start + timedelta(days=1)
    edited = send_job_edit(job=job, changes={"start_at": later, "priority": 8, "tags": ["promo"]})
    assert (edited.start_at, edited.priority, edited.tags) == (later, 8, ["promo"])
    assert edited.expires_at == later + timedelta(hours=6)  # kept its distance from the start
    # The old time comes and goes: nothing starts; the new one starts it.
    assert jobs_start_due(now=start + timedelta(minutes=1)) == []
    assert jobs_start_due(now=later) != []
    edited.refresh_from_db()
    with pytest.raises(Conflict, match=r"started at .* can no longer be edited"):
        send_job_edit(job=edited, changes={"priority": 2})


@pytest.mark.django_db
def test_an_edit_is_checked_as_at_creation_and_changes_nothing_when_refused(push):
    start = ahead(days=1)
    job = send_job_create(recipients=RECIPIENTS, start_at=start, **JOB)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"start_at": ahead(minutes=-1)}, "start_at", "Must be in the future"),
        ({"start_at": ahead(days=91)}, "start_at", "At most 90 days ahead"),
        ({"start_at": None}, "start_at", "to start it now, use start/"),
        ({"expires_at": start - timedelta(minutes=1)}, "expires_at", "after the job's start_at"),
        ({"expires_at": start + timedelta(days=91)}, "expires_at", "90 days after"),
        ({"priority": 12}, "priority", "From 0 to 9"),
        ({"template": "nope"}, "template", "No push template 'nope'"),
        ({"tags": ["Promo"]}, "tags", ""),
        ({"channel": "email"}, "channel", "Cannot change once handed over"),
        ({"campaign": "other"}, "campaign", "Cannot change once handed over"),
    ]
    for changes, field, words in cases:
        with pytest.raises(ValidationError) as refused:
            send_job_edit(job=job, changes=changes)
        assert words in " ".join(refused.value.message_dict[field]), (changes, refused.value)
    job.refresh_from_db()
    assert (job.start_at, job.priority, job.template, job.status) == (
        start,
        5,
        "welcome",
        "scheduled",
    )


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_scheduled_job_started_early_paused_or_cancelled(push):
    start = ahead(hours=5)
    early = send_job_create(recipients=RECIPIENTS, start_at=start, queue=False, **JOB)
    started = send_job_start(job=early, queue=False)
    assert started.status == "queued" and started.started_at is not None
    assert chunk_states(started) == ["queued", "queued"]
    with pytest.raises(Conflict, match="only a scheduled job can be started"):
        send_job_start(job=started)

    paused = send_job_create(recipients=RECIPIENTS, start_at=start, queue=False, **JOB)
    paused = send_job_pause(job=paused)
    assert (paused.status, paused.paused_at is not None) == ("scheduled", True)
    assert jobs_start_due(now=start) == []  # started, but paused: nothing handed out
    paused.refresh_from_db()
    assert (paused.status, chunk_states(paused)) == ("paused", ["queued", "queued"])
    send_job_resume(job=paused, queue=False)
    paused.refresh_from_db()
    assert paused.status == "queued"

    cancelled = send_job_create(recipients=RECIPIENTS, start_at=start, queue=False, **JOB)
    cancelled = send_job_cancel(job=cancelled)
    assert (cancelled.status, cancelled.cancelled, cancelled.pending) == ("cancelled", 3, 0)
    assert chunk_states(cancelled) == [] and adds_up(cancelled)  # recipients not kept
    assert jobs_start_due(now=start) == []
    with pytest.raises(Conflict, match="was cancelled"):
        send_job_edit(job=cancelled, changes={"priority": 1})


@pytest.mark.django_db
def test_a_file_with_a_start_is_read_now_and_waits_scheduled(push):
    start = ahead(hours=2)
    text = b"user_id,address\n1,token-1\n2,token-2\n9,token-9\n"
    job = send_job_from_file(
        fileobj=io.BytesIO(text), name="list.csv", queue=False, start_at=start, **JOB
    )
    assert job.status == "preparing" and job.waits_to_start
    # Editable while it is still read, too.
    job = send_job_edit(job=job, changes={"priority": 7})
    assert send_job_prepare_run(job_id=job.pk) == []  # read, staged, not queued
    job.refresh_from_db()
    assert (job.status, job.total, job.priority) == ("scheduled", 3, 7)
    assert chunk_states(job) == ["staged", "staged"]
    assert len(jobs_start_due(now=start)) == 2


@pytest.mark.django_db
def test_a_file_read_after_its_start_has_passed_starts_at_once(push, monkeypatch):
    start = ahead(minutes=1)
    job = send_job_from_file(
        fileobj=io.BytesIO(b"1,token-1\n"), name="l.csv", queue=False, start_at=start, **JOB
    )
    late = start + timedelta(seconds=30)
    monkeypatch.setattr(timezone, "now", lambda: late)
    ids = send_job_prepare_run(job_id=job.pk)
    job.refresh_from_db()
    assert (job.status, job.started_at, len(ids)) == ("queued", late, 1)


@pytest.mark.django_db(transaction=True)
def test_scheduled_jobs_over_rest(api, snapshot):
    broker.clear("sends")
    s = api("gate")
    start = ahead(hours=1)
    body = {
        "channel": "email",
        "campaign": "launch",
        "template": "welcome",
        "start_at": start.isoformat(),
        "recipients": [{"user_id": 1, "address": "a@example.com"}],
    }
    created = call(s, "POST", "/api/v1/sends/", json=body)
    assert created.status_code == 202, created.text
    job = created.json()
    assert (job["status"], job["started_at"]) == ("scheduled", None)
    assert datetime.fromisoformat(job["start_at"]) == start
    assert broker.queued("sends") == []
    path = f"/api/v1/sends/{job['id']}/"

    later = start + timedelta(hours=2)
    moved = call(s, "PATCH", path, json={"start_at": later.isoformat(), "topic": None})
    assert moved.status_code == 200, moved.text
    assert datetime.fromisoformat(moved.json()["start_at"]) == later
    for patch, field in (
        ({"start_at": "2020-01-01T00:00:00Z"}, "start_at"),
        ({"start_at": "2030-01-01T00:00:00"}, "start_at"),
        ({"expires_at": start.isoformat()}, "expires_at"),
        ({"priority": 10}, "priority"),
        ({"channel": "push"}, "channel"),
    ):
        refused = call(s, "PATCH", path, json=patch)
        assert refused.status_code == 400 and field in refused.json(), (patch, refused.text)
    assert call(api("viewer"), "PATCH", path, json={"priority": 1}).status_code == 403
    refused = call(s, "POST", "/api/v1/sends/", json={**body, "start_at": "2020-01-01T00:00:00Z"})
    assert refused.status_code == 400 and "Must be in the future" in refused.json()["start_at"][0]

    started = call(s, "POST", f"{path}start/")
    assert started.status_code == 200 and started.json()["status"] == "queued"
    assert len(broker.queued("sends")) == 1
    assert call(s, "POST", f"{path}start/").status_code == 409
    too_late = call(s, "PATCH", path, json={"priority": 1})
    assert too_late.status_code == 409 and "can no longer be edited" in too_late.text


@pytest.mark.django_db
def test_send_campaign_schedules_a_file(push, tmp_path):
    csv = tmp_path / "list.csv"
    csv.write_text("user_id,address\n1,token-1\n2,token-2\n")
    start = ahead(days=1).replace(microsecond=0)
    out = io.StringIO()
    call_command(
        "send_campaign",
        "--channel=push",
        "--template=welcome",
        f"--recipients={csv}",
        f"--start-at={start.isoformat()}",
        stdout=out,
    )
    job = SendJob.objects.get()
    assert (job.status, job.start_at, job.total) == ("scheduled", start, 2)
    assert f"scheduled for {start:%Y-%m-%d %H:%M:%S} UTC" in out.getvalue()
    for options, words in (
        ([f"--start-at={start.isoformat()}", "--wait"], "--wait sends in this process now"),
        (["--start-at=soon"], "--start-at: .soon. is not a date and time"),
        (["--start-at=2020-01-01T00:00:00+00:00"], "--start-at: Must be in the future"),
    ):
        with pytest.raises(CommandError, match=words):
            call_command(
                "send_campaign",
                "--channel=push",
                "--template=welcome",
                f"--recipients={csv}",
                *options,
            )
    assert SendJob.objects.count() == 1  # nothing else was stored


@pytest.mark.django_db
def test_a_viewer_sees_a_scheduled_job_but_cannot_edit_or_start_it(push, viewer_client):
    start = timezone.now() + timedelta(hours=4)
    job = send_job_create(
        recipients=[{"user_id": 1, "address": "token-1"}],
        start_at=start,
        queue=False,
        channel="push",
        campaign="launch",
        template="welcome",
    )
    page = viewer_client.get(f"/admin/worker/sendjob/{job.pk}/change/").content.decode()
    assert "Starts at" in page and 'id="job-edit"' not in page and 'id="job-start"' not in page
    assert viewer_client.get(f"/admin/worker/sendjob/{job.pk}/edit/").status_code == 403
    assert viewer_client.post(f"/admin/worker/sendjob/{job.pk}/control/start/").status_code == 403
    job.refresh_from_db()
    assert job.status == "scheduled"
