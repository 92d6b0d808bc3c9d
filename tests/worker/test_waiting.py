"""Waiting sends: what the gate defers (quiet hours, caps) waits in the database grouped by the
minute of its release, goes out at its own release and not before, and ends as expired or
cancelled when its job says so; a job's counts add up at every step. Real snapshot, rules,
Redis and SMTP server; the clock is passed as `now`."""

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tests.support.sends import make_job, recorded, run_all
from tests.support.waiting import MORNING, NIGHT, SPREAD, USERS, adds_up, paris, release
from worker.chunks import chunks_due, release_groups, send_chunk_run, waiting_close
from worker.claims import SENDING_STATE, SENT_STATE, ChunkRecord
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.selectors import send_job_waiting, waiting_by_hour
from worker.services import send_job_cancel_waiting, send_job_create
from worker.tasks import send_chunks_due


def due_at(chunk: SendChunk) -> datetime:
    """A waiting chunk's `not_before` (it always has one)."""
    assert chunk.not_before is not None
    return chunk.not_before


def release_of_group(chunks: list[SendChunk], user_id: int) -> datetime:
    (chunk,) = [c for c in chunks if any(r["user_id"] == user_id for r in c.recipients)]
    return due_at(chunk)


def waiting_chunks(job: SendJob) -> list[SendChunk]:
    return list(
        SendChunk.objects.filter(
            job=job, kind=SendChunk.Kind.DEFERRED, status=SendChunk.Status.QUEUED
        ).order_by("not_before")
    )


def night_job(**options) -> SendJob:
    options.setdefault("expires_at", MORNING + timedelta(hours=2))
    return make_job(*USERS, campaign="night", on_capped="defer", **options)


def test_quiet_sends_wait_grouped_by_release_minute_and_go_at_their_time_not_before(
    quiet_vip, smtp
):
    job = night_job()
    run_all(job, now=NIGHT)
    assert adds_up(job)["pending"] == 200 and job.reasons == {"quiet_hours": 200}
    assert smtp.messages == []
    chunks = waiting_chunks(job)
    # One chunk per minute of release: the 30-minute spread is kept, not one burst at 08:30.
    minutes = {int(release(u).timestamp() // 60) for u in USERS}
    assert len(chunks) == len(minutes) > 20
    for chunk in chunks:
        releases = [release(r["user_id"]) for r in chunk.recipients]
        assert chunk.not_before == max(releases)  # nobody of the group before their time
        assert chunk.not_before - min(releases) < timedelta(minutes=1)  # nobody a minute late
        assert (chunk.size, chunk.attempts, chunk.runs) == (len(releases), 0, 0)
        assert MORNING <= chunk.not_before < MORNING + timedelta(seconds=SPREAD)
    assert sum(c.size for c in chunks) == 200
    assert send_job_waiting(job.pk) == {
        "sends": 200,
        "next_at": chunks[0].not_before,
        "last_at": chunks[-1].not_before,
    }

    # Before the first release nothing is due; a delivery that comes early does nothing.
    assert chunks_due(now=due_at(chunks[0]) - timedelta(milliseconds=1)) == []
    assert send_chunk_run(chunk_id=chunks[0].pk, now=MORNING) == {}
    # Ten minutes into the morning: the groups released by then go, the rest still waits.
    at = MORNING + timedelta(minutes=10)
    due = chunks_due(now=at)
    assert due == sorted(c.pk for c in chunks if due_at(c) <= at)
    for chunk_id in due:
        send_chunk_run(chunk_id=chunk_id, now=at)
    sent = {int(address[1:].split("@")[0]) for address in smtp.per_recipient()}
    assert sent and all(release(u) <= at for u in sent)
    assert sent == {r["user_id"] for c in chunks if due_at(c) <= at for r in c.recipients}
    assert {u for u in USERS if release(u) < at} - sent == {
        u for u in USERS if release(u) < at <= release_of_group(chunks, u)
    }  # at most the users of the minute of `at` wait for their group's last release
    counts = adds_up(job)
    assert (counts["sent"], counts["pending"]) == (len(sent), 200 - len(sent))
    assert send_job_waiting(job.pk)["sends"] == 200 - len(sent)

    # Everybody else at their own time; nobody twice; the job is done.
    for chunk in waiting_chunks(job):
        send_chunk_run(chunk_id=chunk.pk, now=chunk.not_before)
    assert smtp.per_recipient() == {f"u{u}@example.com": 1 for u in USERS}
    counts = adds_up(job)
    assert (counts["sent"], counts["pending"], job.status) == (200, 0, "done")
    assert job.reasons == {"quiet_hours": 200, "allowed": 200}
    assert send_job_waiting(job.pk) == {"sends": 0, "next_at": None, "last_at": None}


def test_release_groups_keep_each_release_and_its_minute():
    base = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    at = [base + timedelta(seconds=s) for s in (59.9, 0, 61, 30, 119.5, 3600)]
    groups = release_groups((({"n": i}), t) for i, t in enumerate(at))
    assert groups == [
        (at[0], [{"n": 0}, {"n": 1}, {"n": 3}]),
        (at[4], [{"n": 2}, {"n": 4}]),
        (at[5], [{"n": 5}]),
    ]


def test_a_release_after_the_jobs_expiry_is_expired_at_once(quiet_vip, smtp):
    expires_at = MORNING + timedelta(minutes=12)
    job = night_job(expires_at=expires_at)
    run_all(job, now=NIGHT)
    late = {u for u in USERS if release(u) > expires_at}
    assert 0 < len(late) < 200
    counts = adds_up(job)
    assert (counts["expired"], counts["pending"]) == (len(late), 200 - len(late))
    assert job.reasons == {"quiet_hours": 200, "expired": len(late)}
    waiting = {r["user_id"] for c in waiting_chunks(job) for r in c.recipients}
    assert waiting == set(USERS) - late
    assert max(due_at(c) for c in waiting_chunks(job)) <= expires_at


def test_beat_expires_what_still_waits_at_the_expiry_and_sends_none_of_it(quiet_vip, smtp):
    job = night_job(expires_at=MORNING + timedelta(hours=1))
    run_all(job, now=NIGHT)
    # Beat did not run during the morning (down, or late): at the expiry the sends still wait.
    after = MORNING + timedelta(hours=1, seconds=5)
    assert send_chunks_due.apply(kwargs={"now": after.isoformat()}).result == 0
    counts = adds_up(job)
    assert (counts["expired"], counts["sent"], counts["pending"], job.status) == (
        200,
        0,
        0,
        "done",
    )
    assert smtp.messages == []
    assert not waiting_chunks(job)
    statuses = Counter(SendChunk.objects.filter(job=job).values_list("status", flat=True))
    assert statuses["expired"] > 20 and statuses["done"] == 1
    assert recorded(1000, "email") == 0  # nothing charged


def test_beat_expires_waiting_chunks_even_when_their_release_is_later(quiet_vip, smtp):
    # A job deferred before this version kept its deferral; the upgrade gave it an expiry a
    # day after its creation, before its release.
    job = night_job()
    run_all(job, now=NIGHT)
    SendJob.objects.filter(pk=job.pk).update(expires_at=NIGHT + timedelta(hours=1))
    at = NIGHT + timedelta(hours=2)
    assert all(due_at(c) > at for c in waiting_chunks(job))
    assert chunks_due(now=at) == []
    assert waiting_close(now=at) == {"expired": 200}
    assert adds_up(job)["expired"] == 200 and job.status == "done"
    assert waiting_close(now=at) == {}  # once


def test_a_waiting_chunk_run_after_the_expiry_is_expired_not_gated(quiet_vip, smtp):
    job = night_job(expires_at=MORNING + timedelta(minutes=40))
    run_all(job, now=NIGHT)
    chunk = waiting_chunks(job)[0]
    later = MORNING + timedelta(hours=3)
    assert send_chunk_run(chunk_id=chunk.pk, now=later) == {"expired": chunk.size}
    chunk.refresh_from_db()
    assert chunk.status == "expired" and smtp.messages == []
    assert adds_up(job)["expired"] == chunk.size
    # The gate was not asked again: its decisions are the night's only.
    assert job.reasons == {"quiet_hours": 200, "expired": chunk.size}
    assert recorded(chunk.recipients[0]["user_id"], "email") == 0


def test_cancel_ends_every_waiting_send_and_every_later_deferral(quiet_vip, smtp, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 100
    job = night_job()
    first, second = job.chunks.order_by("pk")
    send_chunk_run(chunk_id=first.pk, now=NIGHT)
    assert send_job_waiting(job.pk)["sends"] == 100
    job = send_job_cancel_waiting(job=job, now=NIGHT + timedelta(minutes=1))
    counts = adds_up(job)
    assert (counts["cancelled"], counts["pending"]) == (100, 100)
    assert job.waiting_cancelled_at == NIGHT + timedelta(minutes=1)
    assert send_job_waiting(job.pk)["sends"] == 0
    # The second chunk was not waiting (it had not been gated yet): it runs, and what the gate
    # defers now is cancelled at once instead of waiting.
    send_chunk_run(chunk_id=second.pk, now=NIGHT + timedelta(minutes=2))
    counts = adds_up(job)
    assert (counts["cancelled"], counts["pending"], job.status) == (200, 0, "done")
    assert job.reasons == {"quiet_hours": 200, "cancelled": 200}
    assert not waiting_chunks(job) and smtp.messages == []
    # Idempotent: nothing more to cancel.
    assert adds_up(send_job_cancel_waiting(job=job))["cancelled"] == 200


@pytest.mark.postgres
def test_a_waiting_chunk_a_dead_run_left_is_closed_by_its_claims(quiet_vip, smtp):
    job = night_job()
    run_all(job, now=NIGHT)
    chunk = max(waiting_chunks(job), key=lambda c: c.size)
    assert chunk.size >= 3
    charged_user = chunk.recipients[2]["user_id"]
    # A run took it in the morning, gated it (charging the quota), sent one, was cut off during
    # the next, and died.
    at = due_at(chunk)
    SendChunk.objects.filter(pk=chunk.pk).update(runs=1)
    requests = [(r["user_id"], r["message_id"]) for r in chunk.recipients[:3]]
    decisions = gate_check(channel="email", requests=requests, campaign="night", now=at, job=job.pk)
    assert {d.reason for d in decisions} == {"allowed"} and recorded(charged_user, "email") == 1
    record = ChunkRecord(chunk, "dead-run-0000000")
    record.take()
    record.mark([(0, SENT_STATE), (1, SENDING_STATE)])
    job = send_job_cancel_waiting(job=job, now=at + timedelta(seconds=1))
    counts = adds_up(job)
    assert (counts["sent"], counts["ambiguous"], counts["cancelled"]) == (1, 1, 198)
    assert not waiting_chunks(job) and job.status == "done"
    assert recorded(charged_user, "email") == 0  # the quota the dead run charged is given back
    assert smtp.messages == []


def test_a_waiting_chunk_a_live_run_holds_is_left_to_it(quiet_vip, smtp):
    job = night_job()
    run_all(job, now=NIGHT)
    held = waiting_chunks(job)[0]
    cancel_at = NIGHT + timedelta(minutes=5)
    SendChunk.objects.filter(pk=held.pk).update(lease_until=cancel_at + timedelta(seconds=60))
    job = send_job_cancel_waiting(job=job, now=cancel_at)
    counts = adds_up(job)
    assert counts["cancelled"] == 200 - held.size
    assert send_job_waiting(job.pk)["sends"] == held.size
    # The run holding it gives it back (it raised); the next run finds the job's waiting
    # cancelled and ends it without gating.
    SendChunk.objects.filter(pk=held.pk).update(lease_until=None)
    assert send_chunk_run(chunk_id=held.pk, now=held.not_before) == {"cancelled": held.size}
    assert adds_up(job)["cancelled"] == 200 and job.status == "done"


def test_capped_sends_wait_for_their_own_slot_grouped_by_minute(published, smtp):
    from tests.support.sends import make_rule

    published(vip=(10, [7, 8, 9], {}))
    make_rule("4 hours apart", window_seconds=4 * 3_600)
    noon = paris(2, 12)
    for minutes, user in ((0, 7), (0, 8), (30, 9)):  # 7 and 8 in the same minute
        first = make_job(user, campaign=f"first-{user}")
        run_all(first, now=noon + timedelta(minutes=minutes))
    job = make_job(
        7, 8, 9, campaign="second", on_capped="defer", expires_at=noon + timedelta(days=1)
    )
    run_all(job, now=noon + timedelta(hours=1))
    chunks = waiting_chunks(job)
    assert [(c.not_before, sorted(r["user_id"] for r in c.recipients)) for c in chunks] == [
        (noon + timedelta(hours=4), [7, 8]),
        (noon + timedelta(hours=4, minutes=30), [9]),
    ]
    run_all(job, now=noon + timedelta(hours=4))
    counts = adds_up(job)
    assert (counts["sent"], counts["pending"]) == (2, 1)


@pytest.mark.postgres
def test_the_dashboard_counts_waiting_sends_by_hour_of_release(quiet_vip, smtp):
    job = night_job()
    run_all(job, now=NIGHT)
    waiting = waiting_by_hour(now=NIGHT, hours=48)
    assert waiting["total"] == 200 and waiting["due"] == 0 and waiting["later"] == 0
    hour = MORNING.replace(minute=0)
    by_hour = {row["hour"]: row["sends"] for row in waiting["hours"] if row["sends"]}
    # 08:00 to 08:30 Paris: one UTC hour.
    assert by_hour == {hour: 200}
    assert len(waiting["hours"]) == 48
    assert waiting_by_hour(now=MORNING + timedelta(hours=1), hours=48)["due"] == 200
    assert waiting_by_hour(now=NIGHT - timedelta(days=2), hours=24)["later"] == 200


@pytest.mark.parametrize(
    ("expires_at", "message"),
    [
        (datetime(2020, 1, 1, tzinfo=UTC), "Must be in the future"),
        (datetime(2099, 1, 1, tzinfo=UTC), "At most 90 days ahead"),
        (datetime(2099, 1, 1), "with its UTC offset"),
        ("tomorrow", "with its UTC offset"),
    ],
)
def test_a_bad_expiry_refuses_the_job_naming_it(db, expires_at, message):
    with pytest.raises(ValidationError) as caught:
        send_job_create(
            channel="email",
            campaign="c",
            template="welcome",
            recipients=[{"user_id": 1, "address": "a@example.com"}],
            expires_at=expires_at,
            queue=False,
        )
    assert message in caught.value.message_dict["expires_at"][0]
    assert not SendJob.objects.exists()


def test_a_job_expires_a_day_after_creation_by_default(db):
    job = make_job(1, campaign="c")
    assert abs((job.expires_at - job.created_at) - timedelta(hours=24)) < timedelta(seconds=1)


def test_send_campaign_takes_an_expiry_and_says_what_waits(published, smtp, tmp_path):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from limits.engine.quiet import QuietFields
    from limits.policy.services import QUIET_HOURS

    published(vip=(10, [7, 8, 9], {}))
    # Quiet from an hour ago to three hours from now, on the users' (UTC) clock: the real one.
    local = timezone.now()
    QUIET_HOURS.create(
        fields=QuietFields(
            segment="vip",
            channel="email",
            start=f"{local - timedelta(hours=1):%H:%M}",
            end=f"{local + timedelta(hours=3):%H:%M}",
            spread_minutes=10,
        ),
        via="command",
    )
    csv_file = tmp_path / "recipients.csv"
    csv_file.write_text("7,seven@example.com\n8,eight@example.com\n9,nine@example.com\n")
    options = ("--channel", "email", "--template", "offer", "--recipients", str(csv_file))
    expires_at = local + timedelta(hours=5)
    out = io.StringIO()
    call_command(
        "send_campaign",
        *options,
        "--on-capped",
        "defer",
        "--expires-at",
        expires_at.isoformat(),
        "--wait",
        stdout=out,
    )
    job = SendJob.objects.get()
    assert job.expires_at == expires_at and adds_up(job)["pending"] == 3
    printed = out.getvalue()
    assert re.search(r"expired\s+0\n\s+cancelled\s+0\n\s+pending\s+3\n", printed)
    assert "3 sends waiting for release (a cap or quiet hours)" in printed
    assert f"still waiting at {expires_at:%Y-%m-%d %H:%M} UTC, they expire" in printed
    assert smtp.messages == []
    for value, problem in (
        ("tomorrow", "--expires-at: 'tomorrow' is not a date and time"),
        ("2030-01-01T09:00:00", "--expires-at: The UTC offset is missing"),
        ("2020-01-01T09:00:00+00:00", "--expires-at: Must be in the future"),
    ):
        with pytest.raises(CommandError, match=problem):
            call_command("send_campaign", *options, "--expires-at", value)
    assert SendJob.objects.count() == 1
