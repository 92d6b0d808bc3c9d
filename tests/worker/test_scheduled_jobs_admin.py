"""A marketer schedules a campaign file in the admin, in headless Chromium: the job waits as
scheduled, she moves its start and raises its priority, then starts it at once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gatekeeper.lib.groups import MARKETER
from tests.support import broker
from tests.support.browser import Page
from worker.models import SendChunk, SendJob
from worker.preparing import send_job_prepare_run

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_marketer_schedules_a_file_reschedules_it_and_starts_it_now(
    browser, live_server, published, staff, tmp_path
):
    published(vip=(10, [1, 2], {"push": (5, 10)}))
    staff("mia", MARKETER)
    broker.clear("sends")
    page = Page(browser, live_server.url, prefix="schedule-")
    page.log_in("mia", "/admin/worker/sendjob/add/")
    page.wait_for(lambda: "Send a campaign file" in page.text(), "the upload form")
    launch = tmp_path / "launch.csv"
    launch.write_text("user_id,address\n" + "".join(f"{i},token-{i}\n" for i in range(1, 11)))
    start = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    page.find("#id_recipients_file").send_keys(str(launch))
    page.choose("#id_channel", "push")
    page.type("#id_campaign", "launch")
    page.choose("#id_template", "welcome")
    page.type("#id_start_at", "tomorrow at nine")
    page.click("#send-file")
    page.wait_for(lambda: "is not a date and time" in page.text(), "the refusal")
    assert not SendJob.objects.exists()
    page.shot("refused")

    page.find("#id_recipients_file").send_keys(str(launch))  # a refused form drops the file
    page.find("#id_start_at").clear()
    page.type("#id_start_at", start.isoformat())
    page.click("#send-file")
    page.wait_for(lambda: "its file is being read" in page.text(), "the job's page")
    job = SendJob.objects.get()
    assert send_job_prepare_run(job_id=job.pk) == []  # read as a worker would: nothing queued
    page.open(f"/admin/worker/sendjob/{job.pk}/change/")
    page.wait_for(lambda: page.find("#job-status").text == "scheduled", "the scheduled job")
    assert f"Starts at {start:%Y-%m-%d %H:%M:%S} UTC" in page.find("#job-schedule").text
    assert "nothing goes out before" in page.find("#job-stage").text
    page.shot("scheduled")

    page.click("#job-edit")
    page.wait_for(lambda: "Edit or reschedule" in page.text(), "the edit form")
    later = start + timedelta(days=1)
    page.find("#id_start_at").clear()
    page.type("#id_start_at", later.isoformat())
    page.find("#id_priority").clear()
    page.type("#id_priority", "8")
    page.shot("editing")
    page.click("#job-save")
    page.wait_for(lambda: "changed start at, priority" in page.text(), "the saved edit")
    job.refresh_from_db()
    assert (job.start_at, job.priority, job.status) == (later, 8, "scheduled")
    assert job.expires_at == later + timedelta(hours=24)  # moved with the start
    page.shot("rescheduled")

    page.click("#job-start")
    page.wait_for(lambda: "Started send job" in page.text(), "the start")
    job.refresh_from_db()
    assert job.status == "queued" and job.started_at is not None
    assert set(SendChunk.objects.filter(job=job).values_list("status", flat=True)) == {"queued"}
    assert [name for name, _ in broker.queued("sends")] == [
        "worker.tasks.send_job_prepare",  # the upload's reading (done above, in this process)
        "worker.tasks.send_chunk",
    ]
    assert page.find("#job-status").text == "queued"
    assert not page.driver.find_elements("css selector", "#job-edit")  # too late to edit
    page.shot("started")
