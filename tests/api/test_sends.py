"""Send jobs over HTTP, as a campaign system hands them over."""

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
