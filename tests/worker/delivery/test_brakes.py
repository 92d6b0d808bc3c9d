"""Brakes: a mailbox provider whose complaints or hard bounces reach their limit is paused, its
email waits (nothing dropped), /metrics says so, and a person resumes it. The complaints come
through the real tracking webhook (anymail's Postmark view), as an ESP posts them."""

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.sends import run_all
from worker.chunks import send_chunk_run
from worker.delivery.brakes import (
    COMPLAINED,
    SENT,
    Figures,
    brake_count,
    brake_figures,
    brake_tripped,
)
from worker.delivery.mailbox_settings import brakes_check, mailbox_resume
from worker.delivery.mailboxes import GROUPS_TTL
from worker.models import MailboxProvider, SendChunk, SendJob
from worker.services import send_job_create

NOON = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
SECRET = "hook:s3cret"


@pytest.fixture
def uncapped(published):
    published(vip=(10, list(range(1, 3000)), {}))


@pytest.fixture
def webhook(settings, client):
    settings.ANYMAIL = {**(getattr(settings, "ANYMAIL", None) or {}), "WEBHOOK_SECRET": SECRET}
    auth = "Basic " + base64.b64encode(SECRET.encode()).decode()

    def complaint(address: str, user_id: int) -> int:
        # Postmark's spam complaint, as its tracking webhook posts it.
        body = {
            "RecordType": "SpamComplaint",
            "ID": 42,
            "Type": "SpamComplaint",
            "TypeCode": 512,
            "Email": address,
            "MessageID": f"m-{user_id}",
            "Metadata": {"user_id": str(user_id)},
            "BouncedAt": "2026-05-04T12:00:00Z",
            "Description": "The subscriber explicitly marked this message as spam.",
        }
        answer = client.post(
            "/anymail/postmark/tracking/",
            data=json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=auth,
        )
        return answer.status_code

    return complaint


def job_to(addresses: list[str], campaign: str, first_user: int = 1) -> SendJob:
    return send_job_create(
        channel="email",
        campaign=campaign,
        template="welcome",
        recipients=[
            {"user_id": i, "address": a, "context": {"name": f"U{i}"}}
            for i, a in enumerate(addresses, start=first_user)
        ],
        queue=False,
    )


def test_the_brakes_need_enough_mail_and_trip_at_their_rates(settings):
    assert brake_tripped(Figures(sent=999, complaints=100, bounces=0)) is None  # too few
    assert brake_tripped(Figures(sent=1000, complaints=2, bounces=0)) is None  # 0.2%
    words = brake_tripped(Figures(sent=1000, complaints=3, bounces=0))
    assert words is not None and "0.30%" in words and "spam complaints" in words
    assert "hard bounces" in (brake_tripped(Figures(sent=2000, complaints=0, bounces=100)) or "")
    assert brake_tripped(Figures(sent=2000, complaints=0, bounces=99)) is None
    settings.GATEKEEPER_BRAKE_MIN_DELIVERED = 10
    assert brake_tripped(Figures(sent=10, complaints=1, bounces=0)) is not None


def test_the_figures_keep_24_hours(db, redis_client):
    brake_count(SENT, {"gmail": 500}, at=NOON - timedelta(hours=25))
    brake_count(SENT, {"gmail": 700, "yahoo": 3}, at=NOON - timedelta(hours=23))
    brake_count(COMPLAINED, {"gmail": 2}, at=NOON)
    assert brake_figures("gmail", now=NOON) == Figures(sent=700, complaints=2, bounces=0)
    assert brake_figures("yahoo", now=NOON).sent == 3


def test_a_complaint_stream_pauses_the_group_its_email_waits_and_a_resume_sends_it(
    uncapped, smtp, webhook, client, settings
):
    # 1,000 gmail recipients and 10 yahoo ones get a first campaign.
    addresses = [f"g{i}@gmail.com" for i in range(1000)] + [f"y{i}@yahoo.com" for i in range(10)]
    first = job_to(addresses, "first")
    run_all(first, now=NOON)
    assert brake_figures("gmail", now=NOON).sent == 1000
    # Two complaints: under 0.3%, nothing happens.
    assert [webhook(f"g{i}@gmail.com", i + 1) for i in range(2)] == [200, 200]
    assert brakes_check(now=NOON + timedelta(seconds=15)) == []
    # The third reaches 0.3% of gmail's delivered mail: the next check pauses it. Beat checks
    # every 15 s and the workers read the groups every 5 s: held within 20 s, under a minute.
    assert settings.CELERY_BEAT_SCHEDULE["mailbox-brakes"]["schedule"] + GROUPS_TTL <= 60
    assert webhook("g2@gmail.com", 3) == 200
    assert brakes_check(now=NOON + timedelta(seconds=30)) == ["gmail"]
    gmail = MailboxProvider.objects.get(slug="gmail")
    assert gmail.paused_at == NOON + timedelta(seconds=30)
    why = gmail.paused_why or {}
    assert why["complaints"] == 3 and why["delivered"] == 1000
    assert "0.30%" in why["words"]
    # A second campaign: gmail's email waits, yahoo's goes; nothing is dropped.
    # (Users who complained are suppressed: these are others.)
    second = job_to(["a@gmail.com", "b@yahoo.com", "c@gmail.com"], "second", first_user=2001)
    run_all(second, now=NOON + timedelta(minutes=1))
    second.refresh_from_db()
    assert (second.sent, second.pending, second.capped) == (1, 2, 0)
    assert second.reasons == {"allowed": 1, "braked": 2}
    # /metrics says so, and how much waits.
    metrics = client.get("/metrics").content.decode()
    assert 'gatekeeper_mailbox_provider_paused{group="gmail"} 1.0' in metrics
    assert 'gatekeeper_mailbox_provider_paused{group="yahoo"} 0.0' in metrics
    assert 'gatekeeper_mailbox_provider_waiting{group="gmail",hold="brake"} 2.0' in metrics
    # A person resumes it: the waiting email is handed out, and the count starts again.
    mailbox_resume(gmail, via="admin", now=NOON + timedelta(minutes=30))
    assert brake_figures("gmail", now=NOON + timedelta(minutes=30)).sent == 0
    waiting = SendChunk.objects.get(job=second, status=SendChunk.Status.QUEUED)
    send_chunk_run(chunk_id=waiting.pk, now=NOON + timedelta(minutes=30))
    second.refresh_from_db()
    assert (second.sent, second.status) == (3, "done")
    assert brakes_check(now=NOON + timedelta(minutes=31)) == []  # too few since the resume
