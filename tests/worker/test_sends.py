"""Send jobs chunk by chunk: a real SMTP server, a real HTTP push relay, real Redis."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import TestCase
from django.utils import timezone

from bench.servers import free_port
from limits.engine.limiter import get_limiter
from tests.support import broker
from tests.support.sends import (
    Inbox,
    chunk_states,
    earlier_run,
    make_job,
    make_rule,
    recipients,
    recorded,
    run_all,
    smtp_serving,
    smtp_settings,
)
from worker.chunks import ChunkBusy, chunks_due, send_chunk_fail, send_chunk_run
from worker.claims import claim_key
from worker.delivery.base import OneAtATime
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.services import send_job_create


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_a_job_sends_the_admitted_and_counts_every_reason(campaign, smtp, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    first = make_job(1, 3, 9, campaign="spring")
    run_all(first)
    second = make_job(1, campaign="summer")
    run_all(second)
    first.refresh_from_db()
    second.refresh_from_db()
    assert smtp.per_recipient() == {"u1@example.com": 1, "u9@example.com": 1}
    assert (
        "Hello User 1" in smtp.messages[0][1]
        and "Subject: Welcome aboard, User 1" in smtp.messages[0][1]
    )
    assert (first.status, first.progress, first.sent) == ("done", 100, 2)
    assert first.reasons == {"allowed": 2, "blocked": 1}
    assert first.segments == {"vip": 1, "dormant": 1, "default": 1}
    assert (second.reasons, second.sent) == ({"daily_cap": 1}, 0)


def test_a_redelivered_chunk_sends_nothing_twice(campaign, smtp):
    job = make_job(1, 9, campaign="spring")
    chunk = job.chunks.get()
    send_chunk_run(chunk_id=chunk.pk)
    # The worker died after sending, before the chunk was counted: the same chunk comes back,
    # finds the claims of this job's sends and counts them as sent without sending again.
    SendChunk.objects.filter(pk=chunk.pk).update(status=SendChunk.Status.QUEUED)
    outcome = send_chunk_run(chunk_id=chunk.pk)
    assert outcome == {"sent": 2}
    assert smtp.per_recipient() == {"u1@example.com": 1, "u9@example.com": 1}


def test_capped_sends_are_deferred_until_a_slot_frees(campaign, smtp):
    make_job(1, campaign="a")
    run_all(SendJob.objects.get(campaign="a"))
    job = make_job(1, campaign="b", on_capped="defer")
    chunk = job.chunks.get()
    send_chunk_run(chunk_id=chunk.pk)
    deferred = SendChunk.objects.filter(job=job, status=SendChunk.Status.QUEUED).get()
    assert deferred.recipients[0]["user_id"] == 1
    assert deferred.attempts == 0  # waiting for a slot spends no attempt
    assert deferred.not_before is not None
    wait = (deferred.not_before - timezone.now()).total_seconds()
    assert 86000 < wait <= 86400
    # It waits in the database, not in the broker: queued by send_chunks_due when due.
    assert broker.queued("sends") == []
    assert chunks_due(now=deferred.not_before - timedelta(seconds=1)) == []
    assert send_chunk_run(chunk_id=deferred.pk) == {}  # an early delivery does nothing
    assert chunks_due(now=deferred.not_before) == [deferred.pk]
    assert chunks_due(now=deferred.not_before) == []  # queued once
    job.refresh_from_db()
    assert (job.processed, job.status) == (0, "running")


def test_a_permanent_push_failure_gives_the_quota_back(campaign, relay):
    relay.statuses = [400]
    job = make_job(1, channel="push", campaign="p")
    run_all(job)
    job.refresh_from_db()
    assert (job.failed, job.sent, job.status) == (1, 0, "done")
    assert recorded(1, "push") == 0


def test_a_transient_push_failure_is_retried_with_the_same_idempotency_key(campaign, relay):
    relay.statuses = [503]
    job = make_job(1, channel="push", campaign="p")
    run_all(job)
    retry = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert retry.attempts == 1 and retry.not_before is not None
    assert 4 < (retry.not_before - timezone.now()).total_seconds() <= 5  # backoff
    send_chunk_run(chunk_id=retry.pk, now=retry.not_before)
    job.refresh_from_db()
    assert (job.sent, job.failed, job.status) == (1, 0, "done")
    assert relay.keys == ["p:1"]
    assert relay.received[0]["title"] == "Welcome aboard"


def test_redis_down_defers_the_sends_instead_of_dropping_them(campaign, smtp, settings):
    from gatekeeper.lib.redis_client import reset_redis_clients
    from limits.engine.limiter import reset_limiter

    job = make_job(1, 9, campaign="r")
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    reset_redis_clients()
    reset_limiter()
    with TestCase.captureOnCommitCallbacks(execute=True):
        outcome = send_chunk_run(chunk_id=job.chunks.get().pk)
    assert outcome == {}
    assert smtp.messages == []
    deferred = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert [r["user_id"] for r in deferred.recipients] == [1, 9]
    job.refresh_from_db()
    assert job.reasons == {"unavailable": 2}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"channel": "fax"}, "channel"),
        ({"template": "nope"}, "template"),
        ({"on_capped": "later"}, "on_capped"),
        ({"recipients": [{"user_id": -1, "address": "a@example.com"}]}, "recipients[0].user_id"),
        ({"recipients": [{"user_id": 1}]}, "recipients[0].address"),
        ({"recipients": []}, "recipients"),
        ({"template": "../../admin/base"}, "template"),
        ({"template": "Welcome Back"}, "template"),
        ({"recipients": [{"user_id": 1, "address": "a@example.com\x00"}]}, "recipients[0].address"),
        (
            {"recipients": [{"user_id": 1, "address": "a@example.com\nBcc: x@example.com"}]},
            "recipients[0].address",
        ),
        ({"recipients": [{"user_id": 1, "address": ""}]}, "recipients[0].address"),
        ({"recipients": [{"user_id": 1, "address": "sÓáC#"}]}, "recipients[0].address"),
        (
            {
                "recipients": [
                    {"user_id": 1, "address": "a@example.com", "context": {"n": ["x\x00"]}}
                ]
            },
            "recipients[0].context",
        ),
        (
            {
                "recipients": [
                    {"user_id": 1, "address": "a@example.com", "context": {"n": "\ud800"}}
                ]
            },
            "recipients[0].context",
        ),
        (
            {"recipients": [{"user_id": 1, "address": "a@example.com", "context": nested(17)}]},
            "recipients[0].context",
        ),
        (
            {
                "recipients": [
                    *recipients(1),
                    {"user_id": 2, "address": "b@example.com", "message_id": "c:1"},
                ]
            },
            "recipients[1].message_id",
        ),
        (
            {"recipients": [{"user_id": "\u0661\u0662", "address": "a@example.com"}]},
            "recipients[0].user_id",
        ),
        (
            {"recipients": [{"user_id": "12\n", "address": "a@example.com"}]},
            "recipients[0].user_id",
        ),
        ({"tags": ["Promo"]}, "tags"),
        ({"tags": ["promo", "promo"]}, "tags"),
        ({"tags": [f"t{i}" for i in range(9)]}, "tags"),
        ({"tags": "promo"}, "tags"),
        ({"tags": [7]}, "tags"),
        ({"tags": ["promo\n"]}, "tags"),
        ({"priority": 10}, "priority"),
        ({"priority": -1}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": "5"}, "priority"),
        *(
            (
                {"recipients": [{"user_id": 1, "address": "a@example.com", "time_zone": zone}]},
                "recipients[0].time_zone",
            )
            for zone in ("Mars/Olympus_Mons", "", "Europe/Paris ", "/etc/localtime", 1, ["UTC"])
        ),
    ],
)
def test_bad_jobs_are_refused_naming_the_field(db, kwargs, field):
    # One bad row refuses the whole job (on_invalid="reject", the default): nothing is stored.
    args = {
        "channel": "email",
        "campaign": "c",
        "template": "welcome",
        "recipients": recipients(1),
        **kwargs,
    }
    with pytest.raises(ValidationError) as caught:
        send_job_create(**args, queue=False)
    assert field in caught.value.message_dict
    assert not SendJob.objects.exists()


def test_send_campaign_sends_a_csv_and_prints_the_reasons(campaign, smtp, tmp_path):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    csv_file = tmp_path / "recipients.csv"
    csv_file.write_text(
        "user_id,address\n1,one@example.com\n3,three@example.com\n9,nine@example.com\n"
    )
    out = io.StringIO()
    call_command(
        "send_campaign",
        "--channel",
        "email",
        "--template",
        "offer",
        "--recipients",
        str(csv_file),
        "--wait",
        stdout=out,
    )
    assert smtp.per_recipient() == {"one@example.com": 1, "nine@example.com": 1}
    assert "blocked" in out.getvalue() and "sent" in out.getvalue()
    for rows, problem in (
        ("1,one@example.com\nx,y@example.com\n", "line 2 \\(user_id\\)"),
        ("1,one@example.com\n\u0661\u0662,y@example.com\n", "line 2 \\(user_id\\)"),
        ("1,one@example.com\n+2,y@example.com\n", "line 2 \\(user_id\\)"),
        ("1,one@example.com\n2,not an address\n", "line 2 \\(address\\)"),
        ("user_id,address\n1,one@example.com\n\n2\n", "line 4: expected user_id,address"),
    ):
        bad = tmp_path / "bad.csv"
        bad.write_text(rows)
        with pytest.raises(CommandError, match=problem):
            call_command(
                "send_campaign",
                *("--channel", "email", "--template", "offer", "--recipients", str(bad)),
            )
    with pytest.raises(CommandError, match="No email template 'nope'"):
        call_command(
            "send_campaign",
            "--channel",
            "email",
            "--template",
            "nope",
            "--recipients",
            str(csv_file),
        )


def test_a_send_cut_off_by_a_dead_worker_is_not_sent_again(campaign, smtp):
    job = make_job(1, 9, campaign="k")
    # The previous run gated both, marked user 9's send and died during the SMTP exchange.
    earlier_run(job, sending=(9,))
    outcome = send_chunk_run(chunk_id=job.chunks.get().pk)
    assert outcome == {"sent": 1, "ambiguous": 1}
    assert smtp.per_recipient() == {"u1@example.com": 1}
    assert recorded(1, "email") == recorded(9, "email") == 1  # charged once


def test_the_ledger_keeps_what_became_of_a_send_an_earlier_run_admitted(campaign, smtp):
    from limits.ledger.drain import ledger_drain_all
    from limits.ledger.table import decisions

    job = make_job(1, 9, campaign="k")
    # A run gated both and died before handing either over; the chunk runs again a minute
    # later: its gate call answers `duplicate` (this job's own sends), and it sends both.
    earlier_run(job)
    later = timezone.now() + timedelta(minutes=1)
    assert send_chunk_run(chunk_id=job.chunks.get().pk, now=later) == {"sent": 2}
    ledger_drain_all()
    rows = decisions().order_by("at", "user_id").values_list("user_id", "reason", "outcome")
    # The outcome is on the decision that admitted each send, the earlier run's.
    assert list(rows) == [(1, "allowed", "sent"), (9, "allowed", "sent"),
                          (1, "duplicate", ""), (9, "duplicate", "")]  # fmt: skip


def test_a_send_the_previous_version_cut_off_is_not_sent_again(campaign, smtp, redis_client):
    job = make_job(1, 2, 9, campaign="k")
    # A run of the previous version gated all three (its entries name no job), sent user 2's
    # and claimed user 9's, and died during the SMTP exchange: its claims still decide.
    earlier_run(job, holder=0)
    redis_client.set(claim_key("email", "k:2"), f"sent:{job.pk}")
    redis_client.set(claim_key("email", "k:9"), f"sending:{job.pk}:dead-run")
    outcome = send_chunk_run(chunk_id=job.chunks.get().pk)
    assert outcome == {"sent": 2, "ambiguous": 1}
    assert smtp.per_recipient() == {"u1@example.com": 1}
    assert [recorded(u, "email") for u in (1, 2, 9)] == [1, 1, 1]  # charged once


def test_a_failed_send_between_two_good_ones_is_unclaimed_and_released(
    campaign, relay, redis_client
):
    # The webhook sends one push per call, so each claim covers one send; the outcome of each
    # send is written to Redis as soon as the relay answers.
    relay.statuses = [200, 400, 200]
    job = make_job(1, 2, 9, channel="push", campaign="m")
    assert send_chunk_run(chunk_id=job.chunks.get().pk) == {"sent": 2, "failed": 1}
    assert chunk_states(job.chunks.get()) == [2, 0, 2]
    assert recorded(2, "push") == 0
    assert [body["user_id"] for body in relay.received] == [1, 9]


def test_a_batch_dispatcher_claims_its_batch_in_one_go(campaign, settings, redis_client):
    from worker.delivery.local import MemoryDispatcher

    settings.GATEKEEPER_DISPATCHERS = {"push": "memory"}
    MemoryDispatcher.outbox.clear()
    job = make_job(1, 2, 9, channel="push", campaign="b")
    # A redelivery: user 2's went out before, user 9's was cut off by a dead worker.
    earlier_run(job, sent=(2,), sending=(9,))
    outcome = send_chunk_run(chunk_id=job.chunks.get().pk)
    assert outcome == {"sent": 2, "ambiguous": 1}
    assert [m.user_id for m in MemoryDispatcher.outbox] == [1]
    assert chunk_states(job.chunks.get()) == [2, 2, 1]


def test_a_chunk_that_keeps_failing_is_counted_failed_not_lost(campaign, smtp):
    from worker.tasks import MAX_RETRIES, send_chunk

    job = make_job(1, 9, campaign="t")
    chunk = job.chunks.get()
    SendJob.objects.filter(pk=job.pk).update(template="removed-since")  # every run now raises
    # Each failed run waits in the database for its backoff (5 s, doubling up to 10 minutes),
    # not in the broker: beat queues it when due. Run as beat would, from 21 minutes ago on.
    at = timezone.now() - timedelta(seconds=1300)
    waits = []
    for _ in range(MAX_RETRIES):
        assert send_chunk.apply(args=(chunk.pk,), kwargs={"now": at.isoformat()}).state == "SUCCESS"
        chunk.refresh_from_db()
        assert (chunk.status, chunk.queued_at) == (SendChunk.Status.QUEUED, None)
        due = chunk.not_before
        assert due is not None
        waits.append((due - at).total_seconds())
        assert chunks_due(now=due - timedelta(seconds=1)) == []
        assert chunks_due(now=due) == [chunk.pk]
        at = due
    assert waits == [5, 10, 20, 40, 80, 160, 320, 600]
    # The ninth failure gives up.
    last = send_chunk.apply(args=(chunk.pk,), kwargs={"now": at.isoformat()})
    assert last.state == "FAILURE"
    # A late redelivery of the given-up chunk does nothing.
    assert send_chunk.apply(args=(chunk.pk,), retries=MAX_RETRIES).state == "SUCCESS"
    chunk.refresh_from_db()
    job.refresh_from_db()
    assert chunk.status == SendChunk.Status.FAILED
    assert "removed-since" in chunk.error
    assert (job.failed, job.processed, job.status) == (2, 2, "done")
    assert smtp.messages == []


def test_a_worker_started_while_the_store_is_unreachable_gates_with_its_cached_snapshot(
    campaign, smtp, settings, tmp_path
):
    from segments.index import get_index, index_status, reset_index
    from worker.startup import load_snapshot

    assert get_index() is not None  # a previous start left the snapshot in the local cache
    reset_index()
    settings.GATEKEEPER_STORE_URL = str(tmp_path / "store-that-is-not-there")
    load_snapshot(role="worker")
    assert index_status()["source"] == "cache"
    job = make_job(1, 3, campaign="s")
    run_all(job)
    job.refresh_from_db()
    assert job.segments == {"vip": 1, "dormant": 1}
    assert job.reasons == {"allowed": 1, "blocked": 1}
    assert smtp.per_recipient() == {"u1@example.com": 1}


def test_two_deliveries_of_one_chunk_never_run_at_once(campaign, smtp):
    job = make_job(1, 9, campaign="l")
    chunk = job.chunks.get()
    now = timezone.now()
    # A first delivery is running it: it holds the lease for a minute.
    SendChunk.objects.filter(pk=chunk.pk).update(lease_until=now + timedelta(seconds=60))
    with pytest.raises(ChunkBusy) as busy:
        send_chunk_run(chunk_id=chunk.pk, now=now)
    assert 60 <= busy.value.retry_in <= 62
    assert smtp.messages == []
    # That run died without finishing: once its lease has run out, the chunk is taken over.
    later = now + timedelta(seconds=61)
    assert chunks_due(now=now + timedelta(seconds=59)) == []  # the run may still be alive
    # Its lease ran out without being given back: beat queues it again at once, not after
    # GATEKEEPER_CHUNK_REQUEUE_SECONDS (the broker gives a killed worker's task back only after
    # its visibility timeout), and once only.
    assert chunks_due(now=later) == [chunk.pk]
    assert chunks_due(now=later + timedelta(seconds=10)) == []
    assert send_chunk_run(chunk_id=chunk.pk, now=later) == {"sent": 2}


def test_a_lost_chunk_is_queued_again(campaign, settings):
    from worker.tasks import send_chunks_due

    with TestCase.captureOnCommitCallbacks(execute=True):
        job = send_job_create(
            channel="email", campaign="q", template="welcome", recipients=recipients(1)
        )
    chunk = job.chunks.get()
    # Queued on commit: the task waits on the broker's `sends` queue.
    assert broker.queued("sends") == [("worker.tasks.send_chunk", [chunk.pk])]
    assert chunk.queued_at is not None
    # Its task never ran (lost by the broker): after GATEKEEPER_CHUNK_REQUEUE_SECONDS it is sent again.
    later = chunk.queued_at + timedelta(seconds=settings.GATEKEEPER_CHUNK_REQUEUE_SECONDS + 1)
    assert chunks_due(now=later - timedelta(seconds=2)) == []
    assert chunks_due(now=later) == [chunk.pk]
    # Beat's task queues what is due (here, the same chunk once its time has come again).
    broker.clear("sends")
    SendChunk.objects.filter(pk=chunk.pk).update(queued_at=timezone.now() - timedelta(hours=1))
    assert send_chunks_due.apply().result == 1
    assert broker.queued("sends") == [("worker.tasks.send_chunk", [chunk.pk])]


@pytest.mark.postgres
def test_a_chunk_given_up_counts_each_recipient_by_its_claim_and_gives_quota_back(
    campaign, redis_client
):
    job = make_job(1, 2, 9, campaign="g")
    earlier_run(job, sent=(1,), sending=(2,))
    send_chunk_fail(chunk_id=job.chunks.get().pk, error="RuntimeError: boom")
    job.refresh_from_db()
    assert (job.sent, job.ambiguous, job.failed, job.status) == (1, 1, 1, "done")
    assert job.processed == job.total == 3
    usage = {u: recorded(u, "email") for u in (1, 2, 9)}
    assert usage == {1: 1, 2: 1, 9: 0}  # only the unclaimed send's slot is given back


def test_an_unexpected_dispatcher_error_is_ambiguous_not_repeated(campaign, redis_client):
    class Broken(OneAtATime):
        def send(self, message):
            raise RuntimeError("the provider's library fell over")

    job = make_job(1, channel="push", campaign="u")
    assert send_chunk_run(chunk_id=job.chunks.get().pk, dispatcher=Broken()) == {"ambiguous": 1}
    assert chunk_states(job.chunks.get()) == [1]  # marked sending: never sent again


def test_a_message_id_another_job_is_sending_is_a_duplicate_and_no_crash_is_reported(
    campaign, smtp, redis_client, caplog
):
    job = make_job(1, 9, campaign="d")
    # A live run of another job has charged user 9's message id right now.
    gate_check(channel="email", requests=[(9, "d:9")], campaign="d", job=999999)
    with caplog.at_level("WARNING", logger="worker.services"):
        assert send_chunk_run(chunk_id=job.chunks.get().pk) == {"sent": 1, "duplicate": 1}
    assert "cut off" not in caplog.text
    assert smtp.per_recipient() == {"u1@example.com": 1}


def test_a_campaign_sent_by_email_and_then_by_push_sends_both(campaign, smtp, settings):
    from worker.delivery.local import MemoryDispatcher

    settings.GATEKEEPER_DISPATCHERS = {"push": "memory"}
    MemoryDispatcher.outbox.clear()
    # The same campaign name, so the same default message ids ("launch:1"), on two channels.
    for channel in ("email", "push"):
        job = make_job(1, channel=channel, campaign="launch")
        run_all(job)
        job.refresh_from_db()
        assert (job.sent, job.duplicate) == (1, 0), channel
    assert smtp.per_recipient() == {"u1@example.com": 1}
    assert [m.user_id for m in MemoryDispatcher.outbox] == [1]


class StagedInbox(Inbox):
    """An SMTP server that answers one message badly: `rcpt_code` at RCPT TO, or at the end of
    DATA it takes the message and then keeps silent (`silent`) or refuses it (`data_code`)."""

    def __init__(self, rcpt_code: str = "", data_code: str = "", silent: bool = False) -> None:
        super().__init__()
        self.rcpt_code, self.data_code, self.silent = rcpt_code, data_code, silent

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.rcpt_code:
            return self.rcpt_code
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if self.silent:
            await super().handle_DATA(server, session, envelope)
            await asyncio.sleep(3)  # took it, and the answer never comes in time
        if self.data_code:
            return self.data_code
        return await super().handle_DATA(server, session, envelope)


@pytest.mark.parametrize(
    ("inbox", "outcome", "retried", "delivered"),
    [
        # Refused before the message went out: nothing delivered, safe to send again later.
        (StagedInbox(rcpt_code="421 Try again later"), {}, True, 0),
        # Refused once the message was complete: not delivered; a 5xx never will be.
        (StagedInbox(data_code="554 Rejected as spam"), {"failed": 1}, False, 0),
        # Taken, but the answer is lost: it may have gone out, so it is not sent again.
        (StagedInbox(silent=True), {"ambiguous": 1}, False, 1),
    ],
    ids=["refused-at-rcpt", "refused-after-data", "no-answer-after-data"],
)
def test_smtp_sends_are_ambiguous_only_when_the_server_may_have_taken_them(
    campaign, settings, inbox, outcome, retried, delivered
):
    with smtp_serving(inbox) as port:
        smtp_settings(settings, port)
        settings.EMAIL_TIMEOUT = 0.5
        job = make_job(1, campaign="s")
        assert send_chunk_run(chunk_id=job.chunks.get().pk) == outcome
        retry = SendChunk.objects.filter(job=job, status=SendChunk.Status.QUEUED)
        assert retry.exists() == retried
        assert len(inbox.messages) == delivered


def test_a_run_whose_lease_was_taken_over_stops_and_leaves_the_chunk_to_the_new_owner(
    campaign, settings, redis_client
):
    import time

    settings.GATEKEEPER_CHUNK_LEASE_SECONDS = 0.3  # renewed every 0.1 s
    job = make_job(1, 2, channel="push", campaign="t")
    chunk = job.chunks.get()

    class Stalling(OneAtATime):
        sent: list[int] = []

        def send(self, message):
            # A stalled provider: meanwhile the lease runs out and another run takes over.
            time.sleep(0.15)
            SendChunk.objects.filter(pk=chunk.pk).update(
                lease_until=timezone.now() + timedelta(minutes=5)
            )
            self.sent.append(message.user_id)

    dispatcher = Stalling()
    assert send_chunk_run(chunk_id=chunk.pk, dispatcher=dispatcher) == {}
    assert dispatcher.sent == [1]  # it stopped before its second send
    chunk.refresh_from_db()
    job.refresh_from_db()
    assert chunk.status == SendChunk.Status.QUEUED and job.pending == 2  # the new owner counts
    assert chunk_states(chunk) == [2, 0]


def test_the_same_user_listed_twice_gets_one_send_and_the_repeat_is_a_duplicate(campaign, smtp):
    job = send_job_create(
        channel="email",
        campaign="twice",
        template="welcome",
        recipients=[*recipients(1, 9), *recipients(1)],
        queue=False,
    )
    assert (job.total, job.duplicate, job.pending) == (3, 1, 2)
    run_all(job)
    job.refresh_from_db()
    assert (job.sent, job.duplicate, job.pending, job.status) == (2, 1, 0, "done")
    assert smtp.per_recipient() == {"u1@example.com": 1, "u9@example.com": 1}


# --- tags, priority and time zones --------------------------------------------------------

# A fixed instant, so that calendar days and rolling windows fall the same way on every run.
NOON = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


@pytest.fixture
def uncapped(published):
    """A snapshot whose segments have no classic caps: only the tests' rules decide."""
    published(vip=(10, [1, 2], {}))


def test_a_tagged_job_is_refused_by_its_tag_rule_once_the_limit_is_used(uncapped, smtp):
    make_rule("1 promo a day", match="tag", tag="promo")
    first = make_job(9, campaign="spring", tags=["promo", "sale"])
    run_all(first, now=NOON)
    second = make_job(9, campaign="summer", tags=["sale", "promo"])
    run_all(second, now=NOON + timedelta(hours=1))
    untagged = make_job(9, campaign="news")
    run_all(untagged, now=NOON + timedelta(hours=2))
    for job in (first, second, untagged):
        job.refresh_from_db()
    assert (first.tags, first.reasons, first.sent) == (["promo", "sale"], {"allowed": 1}, 1)
    assert (second.reasons, second.capped, second.status) == ({"daily_cap": 1}, 1, "done")
    assert (untagged.reasons, untagged.sent) == ({"allowed": 1}, 1)  # the rule counts promo only
    assert smtp.per_recipient() == {"u9@example.com": 2}
    # The log keeps each send's tags (hashed): the tag rule counts them later.
    assert [len(entry.tags) for entry in get_limiter().entries(9)] == [2, 0]


def test_a_reserve_keeps_its_slot_from_low_priority_jobs_for_a_high_priority_one(uncapped, smtp):
    make_rule("2 a day, 1 kept for 7+", limit=2, reserve_below_priority=7, reserve_slots=1)
    outcomes = []
    for hour, (campaign, priority) in enumerate(
        [("digest", 3), ("digest-2", 3), ("outage", 8), ("outage-2", 8)]
    ):
        job = make_job(9, campaign=campaign, priority=priority)
        run_all(job, now=NOON + timedelta(hours=hour))
        job.refresh_from_db()
        outcomes.append((job.priority, job.reasons))
    assert outcomes == [
        (3, {"allowed": 1}),  # the one slot a low priority may use
        (3, {"daily_cap": 1}),  # the rule has room, but only in its reserve
        (8, {"allowed": 1}),  # the reserved slot
        (8, {"daily_cap": 1}),  # the rule's limit
    ]
    assert smtp.per_recipient() == {"u9@example.com": 2}


def test_a_recipients_time_zone_decides_which_calendar_day_a_send_falls_on(uncapped, smtp):
    make_rule("1 a calendar day", window_kind="calendar", window_seconds=None, window_unit="day")

    def job(campaign: str) -> SendJob:
        # The same send to three users; only their time zones differ (the third has none:
        # its segment's, else GATEKEEPER_DEFAULT_TIME_ZONE, UTC).
        return send_job_create(
            channel="email",
            campaign=campaign,
            template="welcome",
            recipients=[
                {"user_id": 7, "address": "tokyo@example.com", "time_zone": "Asia/Tokyo"},
                {"user_id": 8, "address": "ny@example.com", "time_zone": "America/New_York"},
                {"user_id": 9, "address": "utc@example.com"},
            ],
            queue=False,
        )

    first = job("morning")
    assert [r.get("time_zone") for r in first.chunks.get().recipients] == [
        "Asia/Tokyo",
        "America/New_York",
        None,  # left out of the stored row
    ]
    run_all(first, now=NOON)  # 21:00 in Tokyo, 07:00 in New York, noon in UTC
    # Four hours later it is 01:00 the next day in Tokyo, 11:00 the same day in New York.
    second = job("afternoon")
    run_all(second, now=NOON + timedelta(hours=4))
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.reasons == {"allowed": 3}
    assert (second.reasons, second.sent, second.capped) == ({"allowed": 1, "daily_cap": 2}, 1, 2)
    assert smtp.per_recipient() == {
        "tokyo@example.com": 2,
        "ny@example.com": 1,
        "utc@example.com": 1,
    }


def test_a_job_refused_by_a_rule_that_is_neither_a_day_nor_a_week_waits_for_its_slot(
    uncapped, smtp
):
    make_rule("4 hours apart", window_seconds=4 * 3_600)
    run_all(make_job(9, campaign="first"), now=NOON)
    job = make_job(9, campaign="second", on_capped="defer")
    run_all(job, now=NOON + timedelta(hours=1))
    job.refresh_from_db()
    assert (job.reasons, job.capped, job.pending) == ({"cap": 1}, 0, 1)
    deferred = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    # Until the first send is four hours old, counted from the run's clock.
    assert deferred.not_before == NOON + timedelta(hours=4)
    assert deferred.attempts == 0
    assert chunks_due(now=NOON + timedelta(hours=4)) == [deferred.pk]
    send_chunk_run(chunk_id=deferred.pk, now=deferred.not_before)
    job.refresh_from_db()
    assert (job.reasons, job.sent, job.status) == ({"cap": 1, "allowed": 1}, 1, "done")
    assert smtp.per_recipient() == {"u9@example.com": 2}


def test_a_refusal_that_can_never_have_room_is_capped_not_deferred(uncapped, smtp):
    # The whole limit is kept for priority 7 and above: a priority-3 send never fits.
    make_rule("kept for alerts", limit=2, reserve_below_priority=7, reserve_slots=2)
    job = make_job(9, campaign="digest", priority=3, on_capped="defer")
    run_all(job, now=NOON)
    job.refresh_from_db()
    assert (job.reasons, job.capped, job.pending, job.status) == ({"daily_cap": 1}, 1, 0, "done")
    assert not SendChunk.objects.filter(job=job, status=SendChunk.Status.QUEUED).exists()
    assert smtp.messages == []


def test_rows_with_unknown_time_zones_are_skipped_when_the_job_says_so(uncapped, smtp):
    job = send_job_create(
        channel="email",
        campaign="zones",
        template="welcome",
        recipients=[
            {"user_id": 7, "address": "a@example.com", "time_zone": "Europe/Paris"},
            {"user_id": 8, "address": "b@example.com", "time_zone": "Europe/Atlantis"},
            {"user_id": 9, "address": "c@example.com"},
        ],
        on_invalid="skip",
        queue=False,
    )
    assert (job.total, job.invalid, job.pending) == (3, 1, 2)
    assert job.invalid_rows == [
        {
            "row": 1,
            "field": "time_zone",
            "message": "Unknown time zone 'Europe/Atlantis'. Use an IANA name such as "
            "Europe/Paris.",
        }
    ]
    assert [r["user_id"] for r in job.chunks.get().recipients] == [7, 9]
    run_all(job, now=NOON)
    job.refresh_from_db()
    assert (job.sent, job.invalid, job.status) == (2, 1, "done")


def test_send_campaign_takes_tags_priority_and_a_time_zone_column(uncapped, smtp, tmp_path):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    make_rule("1 promo a day", match="tag", tag="promo")
    csv_file = tmp_path / "recipients.csv"
    # The header names the columns, in any order; an empty time zone cell is none.
    csv_file.write_text(
        "time_zone,address,user_id\nAsia/Tokyo,seven@example.com,7\n,nine@example.com,9\n"
    )
    options = ("--channel", "email", "--template", "offer", "--recipients", str(csv_file))
    out = io.StringIO()
    call_command(
        "send_campaign", *options, "--tags", "promo, sale", "--priority", "8", "--wait", stdout=out
    )
    job = SendJob.objects.get()
    assert (job.tags, job.priority, job.sent) == (["promo", "sale"], 8, 2)
    assert [r.get("time_zone") for r in job.chunks.get().recipients] == ["Asia/Tokyo", None]
    # Another promo the same day: the tag rule refuses both.
    out = io.StringIO()
    call_command(
        "send_campaign", *options, "--campaign", "again", "--tags", "promo", "--wait", stdout=out
    )
    assert "daily_cap" in out.getvalue()
    assert SendJob.objects.get(campaign="again").capped == 2
    assert smtp.per_recipient() == {"seven@example.com": 1, "nine@example.com": 1}

    for extra, rows, problem in (
        (("--tags", "Promo"), None, "--tags: 'Promo' is not a tag"),
        (("--tags", ",".join(f"t{i}" for i in range(9))), None, "--tags: At most 8 tags"),
        (("--priority", "10"), None, "--priority: at most 9"),
        (("--priority", "high"), None, "--priority: 'high' is not a whole number"),
        (
            (),
            "user_id,address,time_zone\n7,a@example.com,Asia/Tokyo\n8,b@example.com,Asia/Tokio\n",
            "line 3 \\(time_zone\\): Unknown time zone 'Asia/Tokio'",
        ),
        ((), "user_id,address,timezone\n7,a@example.com,UTC\n", "unknown column 'timezone'"),
        ((), "user_id,time_zone\n7,UTC\n", "no address column"),
        ((), "user_id,address,time_zone\n7,a@example.com\n", "line 2: expected user_id,address"),
    ):
        bad = csv_file
        if rows is not None:
            bad = tmp_path / "bad.csv"
            bad.write_text(rows)
        bad_options = ("--channel", "email", "--template", "offer", "--recipients", str(bad))
        with pytest.raises(CommandError, match=problem):
            call_command("send_campaign", *bad_options, *extra)
    assert SendJob.objects.count() == 2  # nothing was queued by the bad ones


def test_the_send_job_admin_shows_tags_and_priority(uncapped, admin_client):
    from django.urls import reverse

    job = make_job(9, campaign="spring", tags=["promo", "sale"], priority=8)
    listing = admin_client.get(reverse("admin:worker_sendjob_changelist")).content.decode()
    assert '<td class="field-tags_shown">promo, sale</td>' in listing
    assert '<td class="field-priority">8</td>' in listing
    page = admin_client.get(reverse("admin:worker_sendjob_change", args=[job.pk]))
    assert "promo" in page.content.decode() and page.status_code == 200


def test_a_transactional_send_that_failed_leaves_its_message_id_to_another_job(campaign, relay):
    relay.statuses = [400, 200]
    first = make_job(1, channel="push", campaign="r", category="transactional")
    assert send_chunk_run(chunk_id=first.chunks.get().pk) == {"failed": 1}
    # Claimed (uncounted) while it was tried, given back once it failed: not a duplicate.
    second = make_job(1, channel="push", campaign="r", category="transactional")
    assert send_chunk_run(chunk_id=second.chunks.get().pk) == {"sent": 1}
    third = make_job(1, channel="push", campaign="r", category="transactional")
    assert send_chunk_run(chunk_id=third.chunks.get().pk) == {"duplicate": 1}
    assert [body["user_id"] for body in relay.received] == [1]
    assert recorded(1, "push") == 0  # never counted
