"""Send jobs handed over as a campaign file: read as a stream, staged in chunks handed out as
they are written, a bad line stopping everything after it; paused, resumed and cancelled as one
job."""

import gzip
import io
import json
import tracemalloc
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from gatekeeper.lib.conflicts import Conflict
from segments.store import store_from_settings
from tests.support import broker
from worker import preparing, services, timings
from worker.chunks import chunks_due, send_chunk_run
from worker.models import SendChunk, SendJob
from worker.preparing import send_job_part_run, send_job_prepare_run
from worker.recipients import RecipientRules, SeenUsers, file_cuts, recipient_lines
from worker.services import send_job_cancel, send_job_from_file, send_job_pause, send_job_resume

pytestmark = pytest.mark.django_db

JOB: dict[str, Any] = {"channel": "push", "campaign": "blast", "template": "welcome"}


@pytest.fixture
def push(published, settings):
    published(vip=(10, [1, 2], {"push": (5, 10)}))
    settings.GATEKEEPER_DISPATCHERS = {"push": "null"}


def upload(text: str, *, gz: bool = False, **options) -> SendJob:
    data = text.encode()
    return send_job_from_file(
        fileobj=io.BytesIO(gzip.compress(data) if gz else data),
        name="list.csv.gz" if gz else "list.csv",
        queue=False,
        **{**JOB, **options},
    )


def staged_or_queued(job: SendJob) -> list[SendChunk]:
    return list(SendChunk.objects.filter(job=job).order_by("pk"))


@pytest.mark.postgres
def test_a_gzip_file_is_read_into_chunks_handed_out_as_they_are_written(push, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    text = (
        "time_zone,address,user_id,context\n"
        'Asia/Tokyo,token-1,1,"{""name"": ""Ann""}"\n'
        ",token-2,2,\n"
        "\n"
        ",token-again,1,\n"  # user 1 again: one send, the repeat a duplicate
        "Europe/Paris,token-9,9,\n"
        ",token-10,10,\n"
    )
    job = upload(text, gz=True)
    assert (job.status, job.total, job.source, job.progress) == ("preparing", 0, "list.csv.gz", 0)
    assert job.file and not staged_or_queued(job)  # nothing staged, nothing queued yet
    seen = []
    ids = send_job_prepare_run(job_id=job.pk, progress=lambda read, size: seen.append(read))
    job.refresh_from_db()
    assert (job.status, job.total, job.duplicate, job.invalid) == ("queued", 5, 1, 0)
    assert seen[-1] == job.read_bytes == job.source_bytes
    assert not job.file  # the upload is removed once read
    chunks = staged_or_queued(job)
    assert ids == [c.pk for c in chunks] and {c.status for c in chunks} == {"queued"}
    first = chunks[0].recipients
    assert first[0] == {
        "user_id": 1,
        "address": "token-1",
        "message_id": "blast:1",
        "context": {"name": "Ann"},
        "time_zone": "Asia/Tokyo",
    }
    assert [r["user_id"] for c in chunks for r in c.recipients] == [1, 2, 9, 10]
    for chunk_id in ids:
        send_chunk_run(chunk_id=chunk_id)
    job.refresh_from_db()
    assert (job.status, job.sent, job.duplicate, job.pending) == ("done", 4, 1, 0)


@pytest.mark.postgres
def test_a_bad_line_before_anything_was_handed_out_fails_the_job_and_nothing_is_sent(
    push, monkeypatch
):
    monkeypatch.setattr(services, "HEAD_LINES", 5)
    lines = [f"{i},token-{i}" for i in range(1, 60)]
    lines[48] = "49,not a token"
    lines[52] = "x,token-x"
    job = upload("\n".join(lines) + "\n")  # the first five lines are fine: the job is stored
    assert send_job_prepare_run(job_id=job.pk) == []
    job.refresh_from_db()
    assert job.status == "failed" and not job.file
    assert "line 49 (address)" in job.error and "line 53 (user_id)" in job.error
    assert job.error.endswith("Nothing was sent.")
    assert [(r["line"], r["field"]) for r in job.invalid_rows] == [(49, "address"), (53, "user_id")]
    assert not SendChunk.objects.filter(job=job).exists()
    assert job.total == job.processed == 0

    skipping = upload("\n".join(lines) + "\n", on_invalid="skip", campaign="again")
    assert len(send_job_prepare_run(job_id=skipping.pk)) == 1
    skipping.refresh_from_db()
    assert (skipping.status, skipping.total, skipping.invalid) == ("queued", 59, 2)
    assert skipping.invalid_rows[0] == {
        "row": 48,
        "line": 49,
        "field": "address",
        "message": "'not a token' is not a push token (visible ASCII characters, no spaces).",
    }


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"user_id,adress\n1,token-1\n", "line 1: (the header) unknown column 'adress'"),
        (b"user_id,message_id,address\n", "message id <campaign>:<user_id>"),
        (b"user_id,time_zone\n1,UTC\n", "no address column"),
        (b"1,token-1\n2\n", "line 2: expected user_id,address[,time_zone]"),
        (b"1,token-1,UTC,{},extra\n", "got 5 fields"),
        (b"1,token-1,Mars/Olympus\n", "line 1 (time_zone): Unknown time zone"),
        (b'1,token-1,,"[1]"\n', "line 1 (context): Must be a JSON object"),
        (b'1,token-1,,"{nope"\n', "line 1 (context): Not JSON"),
        (b"1,token-1\n2,tok\xe9n\n", "line 2: The file is not UTF-8 text"),
        (gzip.compress(b"1,token-1\n" * 1000, mtime=0)[:-30], "could not be read to its end"),
        (b'1,"token\n', "Not CSV"),
    ],
)
def test_the_head_of_a_file_is_checked_before_the_job_is_stored(push, data, problem):
    with pytest.raises(ValidationError) as caught:
        send_job_from_file(fileobj=io.BytesIO(data), name="bad.csv", queue=False, **JOB)
    (messages,) = caught.value.message_dict.values()
    assert "recipients_file" in caught.value.message_dict
    assert problem in " ".join(messages)
    assert not SendJob.objects.exists()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_file_in_the_store_is_read_where_a_pipeline_left_it(push, store, request):
    if store == "s3":
        request.getfixturevalue("s3_settings")
    key = "campaigns/2026-11-25/blast.csv.gz"
    store_from_settings().put(key, gzip.compress(b"user_id,address\n1,token-1\n9,token-9\n"))
    job = send_job_from_file(key=key, queue=False, **JOB)
    assert (job.source, job.status) == (f"store:{key}", "preparing")
    assert len(send_job_prepare_run(job_id=job.pk)) == 1
    job.refresh_from_db()
    assert (job.status, job.total) == ("queued", 2)
    assert store_from_settings().get(key)  # the pipeline's object stays
    for bad, words in (
        ("campaigns/missing.csv", "There is no object 'campaigns/missing.csv'"),
        ("../etc/passwd", "without . or .. parts"),
        ("/campaigns/x.csv", "without . or .. parts"),
    ):
        with pytest.raises(ValidationError) as caught:
            send_job_from_file(key=bad, queue=False, **JOB)
        assert words in caught.value.message_dict["recipients_key"][0]


def test_a_paused_job_hands_out_nothing_until_resumed_and_a_cancel_ends_the_rest(push, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    job = upload("".join(f"{i},token-{i}\n" for i in range(1, 7)))
    first, second, third = send_job_prepare_run(job_id=job.pk)
    assert send_chunk_run(chunk_id=first) == {"sent": 2}
    job = send_job_pause(job=job)
    assert job.status == "paused"
    assert send_chunk_run(chunk_id=second) == {}  # a delivery while paused does nothing
    assert chunks_due() == []  # and beat does not hand it out either
    broker.clear("sends")
    job = send_job_resume(job=job)
    assert job.status == "running" and job.paused_at is None
    assert send_chunk_run(chunk_id=second) == {"sent": 2}
    job = send_job_cancel(job=job)
    assert (job.status, job.sent, job.cancelled, job.pending) == ("cancelled", 4, 2, 0)
    assert SendChunk.objects.get(pk=third).status == "cancelled"
    assert send_chunk_run(chunk_id=third) == {}
    for control in (send_job_pause, send_job_resume):
        with pytest.raises(Conflict, match="The job is cancelled"):
            control(job=job)
    assert send_job_cancel(job=job).cancelled == 2  # idempotent


def test_a_job_cancelled_while_its_file_is_read_queues_nothing(push, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    text = "".join(f"{i},token-{i}\n" for i in range(1, 200))
    job = upload(text)

    def cancel_midway(read: int, size: int) -> None:
        send_job_cancel(job=job)  # after the first chunks were staged

    assert send_job_prepare_run(job_id=job.pk, progress=cancel_midway) == []
    job.refresh_from_db()
    assert job.status == "cancelled" and 0 < job.total < 199
    assert job.cancelled == job.total and job.pending == 0
    assert not SendChunk.objects.filter(job=job).exists()
    # Cancelled before any run read it: cancelled at once.
    waiting = upload(text, campaign="other")
    assert send_job_cancel(job=waiting).status == "cancelled"
    assert not SendJob.objects.get(pk=waiting.pk).file  # its upload is removed
    assert send_job_prepare_run(job_id=waiting.pk) == []


def test_a_paused_file_is_read_to_the_end_and_waits_for_its_resume(push):
    job = upload("1,token-1\n2,token-2\n")
    send_job_pause(job=job)
    assert send_job_prepare_run(job_id=job.pk) == []
    job.refresh_from_db()
    assert (job.status, job.total) == ("paused", 2)
    assert len(SendChunk.objects.filter(job=job, status="queued")) == 1
    job = send_job_resume(job=job)
    assert job.status == "queued"


def test_a_run_that_died_is_read_again_from_the_start_and_two_runs_never_read_at_once(push):
    job = upload("1,token-1\n2,token-2\n")
    # What a run that died midway left: a staged chunk, and its lease long gone.
    SendChunk.objects.create(job=job, recipients=[{"user_id": 5}], size=1, status="staged")
    SendJob.objects.filter(pk=job.pk).update(prepare_lease_until=None)
    ids = send_job_prepare_run(job_id=job.pk)
    (chunk,) = SendChunk.objects.filter(job=job)
    assert ids == [chunk.pk] and [r["user_id"] for r in chunk.recipients] == [1, 2]
    # A second delivery of a job another run reads (its lease is live) does nothing.
    other = upload("3,token-3\n", campaign="other")
    later = timezone.now() + timedelta(minutes=1)
    SendJob.objects.filter(pk=other.pk).update(prepare_lease_until=later)
    assert send_job_prepare_run(job_id=other.pk) == []
    assert SendJob.objects.get(pk=other.pk).status == "preparing"


def test_reading_a_file_takes_the_same_memory_for_200k_lines_as_for_20k(
    push,
):
    """Lines are never held: a file is read in pieces, and the only thing that grows is the
    bitmap of user ids seen (a few bits per user)."""

    class Lines:
        def __init__(self, n: int) -> None:
            self.left, self.next = n, 0

        def read(self, size: int = -1) -> bytes:
            out: list[bytes] = []
            size, filled = max(size, 1 << 16), 0
            while self.left and filled < size:
                out.append(f"{self.next},token-{self.next}\n".encode())
                filled += len(out[-1])
                self.next, self.left = self.next + 1, self.left - 1
            return b"".join(out)

    rules = RecipientRules(channel="push", campaign="blast")
    peaks = []
    for n in (20_000, 200_000):
        seen = SeenUsers()
        tracemalloc.start()
        read = sum(
            1
            for line in recipient_lines(Lines(n), rules)
            if line.recipient is not None and seen.first_time(line.recipient["user_id"])
        )
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert read == n
    assert peaks[1] < peaks[0] * 1.5 and peaks[1] < 16 * 2**20


def test_the_seconds_of_each_step_are_counted_for_metrics(push, settings):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    job = upload("".join(f"{user},token-{user}\n" for user in range(1, 6)))
    ids = send_job_prepare_run(job_id=job.pk)
    for chunk_id in ids:
        send_chunk_run(chunk_id=chunk_id)
    timings.flush()
    spent = timings.timings_read()
    assert set(spent) == set(timings.STEPS)
    worked = {step for step, seconds in spent.items() if seconds > 0}
    # The null dispatcher's calls are timed too, but take no measurable time.
    assert worked >= {
        "reading", "chunking", "fetch", "gate", "rendering", "claims", "ledger", "settle"
    }  # fmt: skip
    with pytest.raises(ValueError, match="'sleeping' is not a worker step"):
        timings.add("sleeping", 1.0)


def test_a_context_with_numbers_json_cannot_carry_is_a_bad_line() -> None:
    from worker.models import CompactJSONDecoder

    rules = RecipientRules(channel="push", campaign="blast")
    text = (
        'user_id,address,context\n1,token-1,"{""a"": NaN}"\n2,token-2,"{""a"": 1e400}"\n'
        '3,token-3,"{""a"": 1.5}"\n'
    )
    lines = list(recipient_lines(io.BytesIO(text.encode()), rules))
    assert [(line.error.field, "NaN" in line.error.message) for line in lines[:1]] == [
        ("context", True)
    ]
    assert (
        lines[1].error is not None and "beyond the numbers JSON can carry" in lines[1].error.message
    )
    assert lines[2].recipient is not None and lines[2].recipient["context"] == {"a": 1.5}
    # Chunks stored before this rule may hold NaN: they are still read.
    assert json.loads('[{"a": NaN}]', cls=CompactJSONDecoder)[0]["a"] != 0


@pytest.mark.postgres
def test_the_first_chunks_are_sent_while_the_file_is_read_and_a_bad_line_stops_what_follows(
    push, settings, monkeypatch
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    monkeypatch.setattr(services, "HEAD_LINES", 5)
    lines = [f"{i},token-{i}" for i in range(1, 31)]
    lines[20] = "21,not a token"  # line 21: chunks of lines 1-2, then 3-6, then 7-14 went out
    job = upload("\n".join(lines) + "\n")
    sent: list[dict[str, int]] = []
    handed: list[int] = []

    def hand_out(ids: list[int]) -> None:
        handed.extend(ids)
        if not sent:  # the first write is sent before the rest of the file is read
            sent.append(send_chunk_run(chunk_id=ids[0]))

    assert send_job_prepare_run(job_id=job.pk, hand_out=hand_out) == []
    assert sent == [{"sent": 2}]
    job.refresh_from_db()
    assert job.status == "failed" and not job.file
    assert "line 21 (address)" in job.error
    assert "Before it was found, 14 recipients had been handed out" in job.error
    assert "nothing after it was sent" in job.error
    # Handed out and not run yet: cancelled; read and not handed out (lines 15-20): cancelled.
    assert {c.status for c in SendChunk.objects.filter(pk__in=handed[1:])} == {"cancelled"}
    assert (job.total, job.sent, job.invalid, job.cancelled) == (21, 2, 1, 18)
    assert job.pending == 0
    assert {r["user_id"] for c in SendChunk.objects.filter(job=job) for r in c.recipients} == set(
        range(1, 15)
    )  # nothing of lines 15 and after was ever stored
    for chunk_id in handed[1:]:
        assert send_chunk_run(chunk_id=chunk_id) == {}  # a late delivery sends nothing


def test_a_run_that_died_after_handing_out_chunks_makes_them_again_without_storing_them(
    push, settings
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    job = upload("".join(f"{i},token-{i}\n" for i in range(1, 12)))
    first = []

    def die(ids: list[int]) -> None:
        first.extend(ids)
        raise RuntimeError("the worker died")

    with pytest.raises(RuntimeError):
        send_job_prepare_run(job_id=job.pk, hand_out=die)
    assert send_chunk_run(chunk_id=first[0]) == {"sent": 2}
    SendJob.objects.filter(pk=job.pk).update(prepare_lease_until=None)  # its lease ran out
    rest = send_job_prepare_run(job_id=job.pk)
    chunks = list(SendChunk.objects.filter(job=job).order_by("pk"))
    assert [c.pk for c in chunks] == first + rest
    assert [r["user_id"] for c in chunks for r in c.recipients] == list(range(1, 12))
    job.refresh_from_db()
    assert (job.status, job.total, job.sent) == ("running", 11, 2)
    for chunk_id in rest:
        send_chunk_run(chunk_id=chunk_id)
    job.refresh_from_db()
    assert (job.status, job.sent, job.pending) == ("done", 11, 0)


def test_a_job_paused_while_its_file_is_read_hands_out_nothing_more_until_resumed(
    push, settings, django_capture_on_commit_callbacks
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    job = upload("".join(f"{i},token-{i}\n" for i in range(1, 13)))
    handed: list[list[int]] = []

    def hand_out(ids: list[int]) -> None:
        handed.append(ids)
        if len(handed) == 1:
            send_job_pause(job=job)

    assert send_job_prepare_run(job_id=job.pk, hand_out=hand_out) == []
    assert len(handed) == 1 and len(handed[0]) == 1  # the first write only
    job.refresh_from_db()
    assert (job.status, job.total) == ("paused", 12)
    assert SendChunk.objects.filter(job=job, status="queued").count() == 6
    broker.clear("sends")
    with django_capture_on_commit_callbacks(execute=True):
        send_job_resume(job=job)
    assert len(broker.queued("sends")) == 6


def test_after_a_bad_line_the_file_is_read_on_to_name_more_while_the_lease_is_kept(
    push, settings, monkeypatch
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    monkeypatch.setattr(services, "HEAD_LINES", 5)
    monkeypatch.setattr(preparing, "NAMING_RENEW_LINES", 5)
    lines = [f"{i},token-{i}" for i in range(1, 41)]
    lines[9] = lines[29] = "x,token-x"  # lines 10 and 30

    def read(campaign: str) -> SendJob:
        job = upload("\n".join(lines) + "\n", campaign=campaign)
        send_job_prepare_run(job_id=job.pk)
        job.refresh_from_db()
        return job

    job = read("kept")
    assert [r["line"] for r in job.invalid_rows] == [10, 30]
    assert job.status == "failed" and job.pending == 0
    stop = preparing._stopped

    def taken_over(job_id: int) -> None:  # another run takes the job just after the bad line
        stop(job_id)
        SendJob.objects.filter(pk=job_id).update(prepare_lease_until=timezone.now())

    monkeypatch.setattr(preparing, "_stopped", taken_over)
    assert [r["line"] for r in read("lost").invalid_rows] == [10]  # stopped at line 15


def parted(lines: list[str], settings, **options) -> SendJob:
    """A job whose file is cut into parts of about 1,000 bytes (some 60 lines)."""
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 7
    settings.GATEKEEPER_SEND_FILE_PART_BYTES = 1000
    return upload("user_id,address\n" + "\n".join(lines) + "\n", **options)


def test_a_large_file_is_read_in_parts_taken_in_and_sent_in_file_order(push, settings):
    lines = [f"{i},token-{i}" for i in range(1, 301)]
    lines[99] = "100,not a token"  # line 101 of the file (the header is line 1)
    lines[249] = "5,token-5-again"  # user 5 again, three parts later: a repeat
    job = parted(lines, settings, on_invalid="skip")
    handed: list[int] = []
    asked: list[list[int]] = []
    ids = send_job_prepare_run(
        job_id=job.pk, hand_out=handed.extend, read_parts=lambda j, idx: asked.append(idx)
    )
    parts = list(job.parts.order_by("index"))
    assert len(parts) >= 3 and asked == [[p.index for p in parts]]
    assert {p.status for p in parts} == {"taken"}  # read here: no worker took them
    text = "user_id,address\n" + "".join(f"{x}\n" for x in lines)
    for part in parts:  # each starts a line, and knows its number
        assert text[: part.start].endswith("\n")
        assert text[: part.start].count("\n") + 1 == part.first_line
    job.refresh_from_db()
    assert (job.status, job.total, job.invalid, job.duplicate) == ("queued", 300, 1, 1)
    assert not any(bytes(p.users) for p in job.parts.all())  # the ids are let go once read
    assert [(r["line"], r["field"]) for r in job.invalid_rows] == [(101, "address")]
    chunks = list(SendChunk.objects.filter(job=job).order_by("pk"))
    assert [c.pk for c in chunks] == handed + ids
    assert [c.part for c in chunks] == sorted(c.part for c in chunks)  # in file order
    users = [r["user_id"] for c in chunks for r in c.recipients]
    assert users == [u for u in range(1, 301) if u not in (100, 250)]
    for chunk in chunks:
        send_chunk_run(chunk_id=chunk.pk)
    job.refresh_from_db()
    assert (job.status, job.sent, job.pending) == ("done", 298, 0)


@pytest.mark.postgres
def test_parts_read_by_other_workers_are_taken_in_and_a_bad_line_stops_the_rest(
    push, settings, monkeypatch
):
    monkeypatch.setattr(services, "HEAD_LINES", 5)
    lines = [f"{i},token-{i}" for i in range(1, 301)]
    lines[199] = "200,not a token"  # line 201
    job = parted(lines, settings)
    read_elsewhere: list[bool] = []

    def other_workers(job_id: int, indexes: list[int]) -> None:
        for index in reversed(indexes):  # the last parts first, before this run gets there
            read_elsewhere.append(send_job_part_run(job_id=job_id, index=index))

    sent: list[int] = []

    def hand_out(ids: list[int]) -> None:
        for chunk_id in ids:
            sent.append(send_chunk_run(chunk_id=chunk_id)["sent"])

    assert send_job_prepare_run(job_id=job.pk, hand_out=hand_out, read_parts=other_workers) == []
    assert read_elsewhere and all(read_elsewhere)
    assert not send_job_part_run(job_id=job.pk, index=1)  # read already
    job.refresh_from_db()
    assert job.status == "failed" and "line 201 (address)" in job.error
    # Every part before the bad line's went out; nothing of its part or after is left anywhere.
    first = job.parts.filter(first_line__lte=201).order_by("-index")[0].first_line
    assert sum(sent) == job.sent == first - 2
    assert (job.total, job.invalid, job.cancelled, job.pending) == (200, 1, 201 - first, 0)
    kept = {r["user_id"] for c in SendChunk.objects.filter(job=job) for r in c.recipients}
    assert kept == set(range(1, first - 1))


def test_a_run_that_died_while_taking_in_parts_goes_on_from_where_it_was(push, settings):
    job = parted([f"{i},token-{i}" for i in range(1, 301)], settings)
    calls: list[int] = []

    def die_at_the_second_part(ids: list[int]) -> None:
        calls.extend(ids)
        if SendChunk.objects.filter(pk__in=ids, part=2).exists():
            raise RuntimeError("the worker died")

    with pytest.raises(RuntimeError):
        send_job_prepare_run(job_id=job.pk, hand_out=die_at_the_second_part)
    SendJob.objects.filter(pk=job.pk).update(prepare_lease_until=None)  # its lease ran out
    rest = send_job_prepare_run(job_id=job.pk)
    chunks = list(SendChunk.objects.filter(job=job).order_by("part", "pk"))
    assert [r["user_id"] for c in chunks for r in c.recipients] == list(range(1, 301))
    assert set(calls) | set(rest) == {c.pk for c in chunks}
    job.refresh_from_db()
    assert (job.status, job.total, job.duplicate) == ("queued", 300, 0)


def test_a_file_is_cut_only_at_line_ends_outside_quoted_cells():
    record = b'1,token-1,,"{""a"":\n 1}"\n'  # a context over two lines
    data = record * 200
    cuts = file_cuts(io.BytesIO(data), len(data), 500)
    assert len(cuts) >= 5
    for start, line in cuts:
        assert data[start:].startswith(b"1,token-1")  # a record's start, not inside its cell
        assert line == data[:start].count(b"\n") + 1
    assert file_cuts(io.BytesIO(b"1,t-1\r" * 2000), 12000, 1000) == []  # bare CRs: read as one
    small = b"1,t-1\n" * 100
    assert file_cuts(io.BytesIO(small), len(small), 1000) == []  # under two parts


def test_a_gzip_file_is_read_in_one_part(push, settings):
    settings.GATEKEEPER_SEND_FILE_PART_BYTES = 1000
    job = upload("".join(f"{i},token-{i}\n" for i in range(1, 3000)), gz=True)
    assert send_job_prepare_run(job_id=job.pk) and not job.parts.exists()
