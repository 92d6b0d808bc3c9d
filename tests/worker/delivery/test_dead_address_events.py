"""Dead addresses as events of the event stream (type `dead_address`, id `a<row>`): read by
`GET /api/v1/stream/` and its filters, posted to a real local endpoint signed (verified by the
Standard Webhooks library), retried after a failure, filtered by type; the deprecated
GATEKEEPER_DEAD_ADDRESS_WEBHOOK warned of once (worker.W004) and still POSTed to, for this
version, beside the stream."""

from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.utils import timezone

from limits.ledger.drain import ledger_drain_all
from limits.models.stream import StreamBatch
from limits.stream.events import (
    EVERY,
    JOURNALS,
    START,
    Filters,
    Journal,
    journal_register,
    stream_read,
)
from limits.stream.webhooks import WebhookFields, retry_in, webhook_create, webhook_deliver
from tests.support.api import call, make_user, token_session
from tests.support.sends import make_job
from tests.worker.delivery.test_dead_addresses import Receiver as OldReceiver
from worker.chunks import send_chunk_run
from worker.delivery.base import PERMANENT, DispatchError, Message, OneAtATime
from worker.delivery.dead_addresses import JOURNAL, dead_addresses_report_due
from worker.models import DeadAddress


class DeadTokenBackend(OneAtATime):
    """A provider to whom the tokens of users 2 and 9 are unregistered."""

    provider = "test-dead"

    def send(self, message: Message) -> None:
        if message.user_id in (2, 9):
            raise DispatchError("UNREGISTERED: token not registered", kind=PERMANENT, invalid=True)


def dead_found(settings, campaign: str = "dead") -> list[DeadAddress]:
    """A push job to users 1, 2 and 9 run through the gate and a provider that says the tokens
    of 2 and 9 are dead; the drain run after. Its dead addresses, in id order."""
    settings.GATEKEEPER_PUSH_BACKEND = f"{__name__}.DeadTokenBackend"
    job = make_job(1, 2, 9, channel="push", campaign=campaign)
    assert send_chunk_run(chunk_id=job.chunks.get().pk) == {"sent": 1, "failed": 2}
    ledger_drain_all()
    return list(DeadAddress.objects.filter(job=job).order_by("id"))


def dead_events(filters: Filters = EVERY) -> list[dict]:
    page = stream_read(START, 1000, filters)
    return [e for e in page.events if e["type"] == "dead_address"]


def test_dead_addresses_are_events_of_the_stream_read_over_rest(campaign, settings, live_server):
    ledger_drain_all()  # the stream's first drain: it starts here
    rows = dead_found(settings)
    events = dead_events()
    assert [e["id"] for e in events] == [f"a{row.pk}" for row in rows]
    first = events[0]
    assert first == {
        "id": f"a{rows[0].pk}",
        "type": "dead_address",
        "at": first["at"],
        "user_id": 2,
        "channel": "push",
        "campaign": "dead",
        "job": rows[0].job_id,
        "address": "u2@example.com",
        "reason": "UNREGISTERED: token not registered",
    }
    assert first["at"].endswith("Z")
    # In stream order after the job's decisions (the same drain round took them).
    every = stream_read(START, 1000, EVERY).events
    assert [e["type"] for e in every][-2:] == ["dead_address", "dead_address"]
    assert dead_events() == events  # read again: the same ids

    loader = token_session(live_server.url, make_user("loader", "limits.read_stream"))
    page = call(loader, "GET", "/api/v1/stream/?type=dead_address").json()
    assert [e["id"] for e in page["events"]] == [f"a{row.pk}" for row in rows]
    assert page["events"][1]["user_id"] == 9
    for query, kept in [
        ("campaign=dead", 2), ("campaign=other", 0), ("channel=push", 2), ("channel=email", 0),
        ("type=decision", 0),
    ]:  # fmt: skip
        found = call(loader, "GET", f"/api/v1/stream/?{query}").json()["events"]
        assert len([e for e in found if e["type"] == "dead_address"]) == kept, query


def test_dead_addresses_reach_an_endpoint_signed_retried_and_filtered(campaign, settings, receiver):
    ledger_drain_all()
    dead = webhook_create(
        fields=WebhookFields(url=receiver.url, types=("dead_address",)), start="0"
    )
    decisions = webhook_create(fields=WebhookFields(url=receiver.url, types=("decision",)))
    rows = dead_found(settings)
    receiver.secret = dead.secret

    # The endpoint fails first: tried again once its backoff has passed, nothing lost.
    receiver.answers = [500]
    at = timezone.now()
    report = webhook_deliver(dead.pk, now=at)
    assert report is not None and report.failed and report.events == 0
    dead.refresh_from_db()
    assert (dead.failures, dead.next_at) == (1, at + retry_in(1))
    assert webhook_deliver(dead.pk, now=at + retry_in(1) - timedelta(seconds=1)) is None
    report = webhook_deliver(dead.pk, now=at + retry_in(1))
    assert report is not None and (report.failed, report.events) == (False, 2)
    failed, taken = receiver.received
    assert (failed.answered, taken.answered) == (500, 200)
    assert failed.verified and taken.verified  # by the Standard Webhooks library
    assert taken.headers["webhook-id"] == failed.headers["webhook-id"]  # the same batch
    # Only the type it takes, though the job's decisions came first in the stream.
    events = receiver.taken()
    assert [(e["type"], e["id"], e["address"]) for e in events] == [
        ("dead_address", f"a{row.pk}", row.address) for row in rows
    ]

    # An endpoint of decisions gets none of them.
    receiver.received.clear()
    receiver.secret = decisions.secret
    webhook_deliver(decisions.pk)
    assert receiver.received and all(r.verified for r in receiver.received)
    assert {e["type"] for e in receiver.taken()} == {"decision"}


def test_the_deprecated_webhook_warns_once_and_still_posts_for_this_version(campaign, settings):
    def warnings() -> list:
        return [m for m in run_checks() if m.id == "worker.W004"]

    settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK = ""
    assert warnings() == []
    old = OldReceiver()
    try:
        settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK = old.url
        (warning,) = warnings()  # once, however many dead addresses there are
        assert "deprecated" in warning.msg and "dead_address" in warning.hint
        assert "GATEKEEPER_DEAD_ADDRESS_WEBHOOK" in warning.msg
        ledger_drain_all()
        rows = dead_found(settings)
        # Both ways for this version: the old POST and the stream's events.
        assert dead_addresses_report_due() == 2
        (body,) = old.bodies
        assert [d["address"] for d in body["dead_addresses"]] == [r.address for r in rows]
        assert [e["id"] for e in dead_events()] == [f"a{row.pk}" for row in rows]
    finally:
        old.server.shutdown()
        old.server.server_close()


def test_the_worker_registers_its_journal_and_a_wrong_one_is_refused(db):
    assert JOURNALS[StreamBatch.Source.DEAD_ADDRESSES] is JOURNAL
    with pytest.raises(ValueError, match="not a journal's source"):
        journal_register(
            Journal(StreamBatch.Source.DECISIONS, "dead_address", DeadAddress, JOURNAL.read)
        )
    with pytest.raises(ValueError, match="not one of EVENT_TYPES"):
        journal_register(Journal(StreamBatch.Source.DEAD_ADDRESSES, "x", DeadAddress, JOURNAL.read))
    assert JOURNALS[StreamBatch.Source.DEAD_ADDRESSES] is JOURNAL
