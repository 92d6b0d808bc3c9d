"""Send jobs over HTTP, as a campaign system hands them over."""

from typing import Any

import pytest

from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_campaign_system_hands_over_a_send_job_and_follows_it(api, snapshot):
    from tests.support import broker
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
    from tests.support import broker
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


def test_a_send_job_shows_its_waiting_sends_and_they_can_be_cancelled(api, snapshot):
    from datetime import timedelta

    from limits.engine.quiet import QuietFields
    from limits.policy.services import QUIET_HOURS
    from tests.support import broker
    from tests.support.waiting import MORNING, NIGHT
    from worker.chunks import send_chunk_run
    from worker.models import SendChunk

    broker.clear("sends")
    QUIET_HOURS.create(
        fields=QuietFields(
            segment=None, channel="email", start="21:00", end="08:00", spread_minutes=30
        ),
        via="command",
    )
    s = api("gate")
    expires_at = (MORNING + timedelta(hours=1)).isoformat()
    body = {
        "channel": "email",
        "campaign": "night",
        "template": "welcome",
        "on_capped": "defer",
        "expires_at": expires_at,
        "recipients": [
            {"user_id": u, "address": f"u{u}@example.com", "time_zone": "Europe/Paris"}
            for u in (1, 2, 7)
        ],
    }
    created = call(s, "POST", "/api/v1/sends/", json=body).json()
    assert (
        created["expires_at"].replace("Z", "+00:00") == (MORNING + timedelta(hours=1)).isoformat()
    )
    assert created["waiting"] == {"sends": 0, "next_at": None, "last_at": None}
    assert (created["expired"], created["cancelled"], created["waiting_cancelled_at"]) == (
        0,
        0,
        None,
    )
    chunk = SendChunk.objects.get(job_id=created["id"])
    send_chunk_run(chunk_id=chunk.pk, now=NIGHT)  # quiet hours in Paris: all three wait
    path = f"/api/v1/sends/{created['id']}/"
    job = call(api("viewer"), "GET", path).json()
    waits = job["waiting"]
    assert (waits["sends"], job["pending"], job["reasons"]) == (3, 3, {"quiet_hours": 3})
    assert MORNING.isoformat() <= waits["next_at"].replace("Z", "+00:00") <= waits["last_at"]

    # Cancelling needs its right: a viewer may not; the campaign system may.
    assert call(api("viewer"), "DELETE", f"{path}waiting/").status_code == 403
    assert call(s, "DELETE", "/api/v1/sends/999999/waiting/").status_code == 404
    answer = call(s, "DELETE", f"{path}waiting/")
    assert answer.status_code == 200
    job = answer.json()
    assert (job["cancelled"], job["pending"], job["status"]) == (3, 0, "done")
    assert job["waiting"] == {"sends": 0, "next_at": None, "last_at": None}
    assert job["waiting_cancelled_at"] is not None
    counts = [job[o] for o in ("sent", "failed", "capped", "ambiguous", "duplicate", "invalid")]
    assert sum(counts) + job["expired"] + job["cancelled"] + job["pending"] == job["total"]
    again = call(s, "DELETE", f"{path}waiting/").json()  # idempotent
    assert (again["cancelled"], again["waiting_cancelled_at"]) == (3, job["waiting_cancelled_at"])


def test_a_bad_expiry_is_a_400_naming_it(api, snapshot):
    from datetime import UTC, datetime, timedelta

    s = api("gate")
    body = {
        "channel": "email",
        "campaign": "c",
        "template": "welcome",
        "recipients": [{"user_id": 1, "address": "a@example.com"}],
    }
    now = datetime.now(UTC)
    for value, message in (
        ("2030-06-11T09:00:00", "with its UTC offset"),
        ("tomorrow", "Not a date and time. An ISO 8601 date and time with its UTC offset"),
        (17, "Must be a date and time or null, not an integer."),
        ((now - timedelta(minutes=1)).isoformat(), "Must be in the future"),
        ((now + timedelta(days=91)).isoformat(), "At most 90 days ahead"),
        ("9999-12-31T23:59:59-14:00", "At most 90 days ahead"),
        ("0001-01-01T00:00:00+14:00", "Must be in the future"),
    ):
        refused = call(s, "POST", "/api/v1/sends/", json={**body, "expires_at": value})
        assert refused.status_code == 400, (value, refused.text)
        assert message in refused.json()["expires_at"][0], (value, refused.text)
    kept = call(s, "POST", "/api/v1/sends/", json={**body, "expires_at": None}).json()
    created = datetime.fromisoformat(kept["created_at"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(kept["expires_at"].replace("Z", "+00:00"))
    assert abs(expires - created - timedelta(hours=24)) < timedelta(seconds=1)
