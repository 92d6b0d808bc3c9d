"""Send jobs over HTTP, as a campaign system hands them over."""

from typing import Any

import pytest

from tests.api.conftest import call

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_campaign_system_hands_over_a_send_job_and_follows_it(api, snapshot):
    from tests import broker
    from worker.chunks import send_chunk_run

    broker.clear("sends")
    s = api("gate")
    body = {
        "channel": "email",
        "campaign": "spring",
        "template": "welcome",
        "recipients": [
            {"user_id": 1, "address": "a@example.com"},
            {"user_id": 7, "address": "b@example.com"},
        ],
    }
    created = call(s, "POST", "/api/v1/sends/", json=body)
    assert created.status_code == 202
    job = created.json()
    assert (job["status"], job["total"], job["progress"]) == ("queued", 2, 0)
    ((task, (chunk_id,)),) = broker.queued("sends")  # one chunk, queued for the worker
    assert task == "worker.tasks.send_chunk"
    send_chunk_run(chunk_id=chunk_id)
    followed = call(api("viewer"), "GET", f"/api/v1/sends/{job['id']}/").json()
    assert (followed["status"], followed["progress"], followed["sent"]) == ("done", 100, 2)
    bad = call(s, "POST", "/api/v1/sends/", json={**body, "recipients": [{"user_id": 1}]})
    assert bad.status_code == 400 and "recipients[0].address" in bad.json()
    assert call(api("viewer"), "POST", "/api/v1/sends/", json=body).status_code == 403


def test_a_send_job_carries_tags_priority_and_each_recipients_time_zone(api, snapshot):
    from tests import broker
    from worker.models import SendChunk

    broker.clear("sends")
    s = api("gate")
    recipients = [
        {"user_id": 1, "address": "token-1", "time_zone": "Asia/Tokyo"},
        {"user_id": 7, "address": "token-7"},
    ]
    body = {
        "channel": "push",
        "campaign": "spring",
        "template": "welcome",
        "tags": ["promo", "spring"],
        "priority": 8,
        "recipients": recipients,
    }
    job = call(s, "POST", "/api/v1/sends/", json=body).json()
    assert (job["tags"], job["priority"]) == (["promo", "spring"], 8)
    rows = SendChunk.objects.get(job_id=job["id"]).recipients
    assert [row.get("time_zone") for row in rows] == ["Asia/Tokyo", None]

    bad_zone = [{"user_id": 1, "address": "t", "time_zone": "Asia/Tokio"}]
    refused = call(s, "POST", "/api/v1/sends/", json={**body, "recipients": bad_zone})
    assert refused.status_code == 400
    assert "Unknown time zone 'Asia/Tokio'" in refused.json()["recipients[0].time_zone"][0]
    skipped = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**body, "on_invalid": "skip", "recipients": [*bad_zone, recipients[1]]},
    ).json()
    assert (skipped["invalid"], skipped["invalid_rows"][0]["field"]) == (1, "time_zone")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tags": ["promo", "promo"]}, "tags[1]"),
        ({"tags": ["Promo"]}, "tags[0]"),
        ({"priority": 10}, "priority"),
    ]
    for extra, field in cases:
        refused = call(s, "POST", "/api/v1/sends/", json={**body, **extra})
        assert refused.status_code == 400 and field in refused.json(), (extra, refused.text)
