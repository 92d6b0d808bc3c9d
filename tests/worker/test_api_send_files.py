"""Campaign files over HTTP: an upload (multipart/form-data) or a key in the store, one job with
one progress, paused, resumed and cancelled by a campaign system."""

import gzip

import pytest

from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = {"channel": "push", "campaign": "blast", "template": "welcome"}


def test_a_campaign_system_uploads_a_gzip_file_and_follows_one_job(api, snapshot, settings):
    from tests.support import broker
    from worker.chunks import send_chunk_run
    from worker.preparing import send_job_prepare_run

    settings.GATEKEEPER_SEND_CHUNK_SIZE = 1000
    broker.clear("sends")
    s = api("gate")
    text = "user_id,address\n" + "".join(f"{i},token-{i}\n" for i in range(1, 2501))
    created = call(
        s,
        "POST",
        "/api/v1/sends/",
        data={**FIELDS, "tags": "promo, spring", "priority": "7"},
        files={"recipients_file": ("blast.csv.gz", gzip.compress(text.encode()))},
    )
    assert created.status_code == 202, created.text
    job = created.json()
    assert created.headers["Location"] == job["url"]
    assert (job["status"], job["source"], job["tags"], job["priority"]) == (
        "preparing",
        "blast.csv.gz",
        ["promo", "spring"],
        7,
    )
    # The file is read by a worker's task: nothing else is queued before it.
    ((task, (job_id,)),) = broker.queued("sends")
    assert (task, job_id) == ("worker.tasks.send_job_prepare", job["id"])
    chunk_ids = send_job_prepare_run(job_id=job_id)
    assert len(chunk_ids) == 3  # chunks of 1,000
    path = f"/api/v1/sends/{job_id}/"
    followed = call(api("viewer"), "GET", path).json()
    assert (followed["status"], followed["total"], followed["progress"]) == ("queued", 2500, 0)
    assert followed["read_bytes"] == followed["source_bytes"] > 0
    for chunk_id in chunk_ids:
        send_chunk_run(chunk_id=chunk_id)
    done = call(api("viewer"), "GET", path).json()
    assert (done["status"], done["progress"], done["sent"] + done["capped"]) == ("done", 100, 2500)


def test_a_bad_upload_is_refused_naming_the_field_or_the_line(api, snapshot):
    from worker.models import SendJob

    s = api("gate")
    good = ("list.csv", b"1,token-1\n")
    for data, files, field, words in (
        (FIELDS, {"recipients_file": ("l.csv", b"1,token-1\n2,not a token\n")}, "recipients_file", "line 2 (address)"),
        (FIELDS, {"recipients_file": ("l.csv", b"user_id,adress\n")}, "recipients_file", "unknown column 'adress'"),
        ({**FIELDS, "priority": "high"}, {"recipients_file": good}, "priority", "integer"),
        ({**FIELDS, "tags": "Promo"}, {"recipients_file": good}, "tags[0]", "Lowercase letters"),
        ({**FIELDS, "channel": "fax"}, {"recipients_file": good}, "channel", ""),
        ({**FIELDS, "colour": "red"}, {"recipients_file": good}, "colour", "Unknown field"),
        (FIELDS, {"other": good}, "recipients_file", "Attach the recipients file"),
    ):  # fmt: skip
        answer = call(s, "POST", "/api/v1/sends/", data=data, files=files)
        assert answer.status_code == 400, (data, answer.text)
        assert field in answer.json() and words in str(answer.json()[field]), answer.json()
    both = call(
        s, "POST", "/api/v1/sends/", json={**FIELDS, "recipients_key": "a.csv", "recipients": [{"user_id": 1, "address": "t"}]}
    )  # fmt: skip
    assert both.status_code == 400 and "Give the recipients once" in str(both.json())
    assert not SendJob.objects.exists()


def test_a_file_in_the_store_is_named_by_its_key(api, snapshot):
    from segments.store import store_from_settings

    store_from_settings().put("campaigns/blast.csv", b"1,token-1\n7,token-7\n")
    s = api("gate")
    created = call(
        s, "POST", "/api/v1/sends/", json={**FIELDS, "recipients_key": "campaigns/blast.csv"}
    )
    assert created.status_code == 202 and created.json()["source"] == "store:campaigns/blast.csv"
    missing = call(
        s, "POST", "/api/v1/sends/", json={**FIELDS, "recipients_key": "campaigns/nope.csv"}
    )
    assert missing.status_code == 400
    assert "There is no object 'campaigns/nope.csv'" in missing.json()["recipients_key"][0]


def test_a_campaign_system_pauses_resumes_and_cancels_its_job(api, snapshot, settings):
    from tests.support import broker
    from worker.chunks import send_chunk_run
    from worker.preparing import send_job_prepare_run

    settings.GATEKEEPER_SEND_CHUNK_SIZE = 1000
    s = api("gate")
    text = "".join(f"{i},token-{i}\n" for i in range(1, 3001))
    job = call(
        s, "POST", "/api/v1/sends/", data=FIELDS, files={"recipients_file": ("l.csv", text)}
    ).json()
    first, second, third = send_job_prepare_run(job_id=job["id"])
    send_chunk_run(chunk_id=first)
    url = f"/api/v1/sends/{job['id']}"
    assert call(api("viewer"), "POST", f"{url}/pause/").status_code == 403
    paused = call(s, "POST", f"{url}/pause/").json()
    assert (paused["status"], paused["paused_at"] is not None) == ("paused", True)
    assert send_chunk_run(chunk_id=second) == {}
    broker.clear("sends")
    resumed = call(s, "POST", f"{url}/resume/").json()
    assert resumed["status"] == "running"
    assert sorted(args[0] for _, args in broker.queued("sends")) == [second, third]
    cancelled = call(s, "POST", f"{url}/cancel/").json()
    assert (cancelled["status"], cancelled["cancelled"], cancelled["pending"]) == (
        "cancelled",
        2000,
        0,
    )
    again = call(s, "POST", f"{url}/pause/")
    assert again.status_code == 409 and again.json() == {
        "detail": "The job is cancelled: it cannot be paused.",
        "field": "status",
    }
    assert call(s, "POST", "/api/v1/sends/999999/cancel/").status_code == 404
