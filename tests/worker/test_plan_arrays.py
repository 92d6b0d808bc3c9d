"""What a staged chunk keeps for the forward plan (SendChunk.plan, worker/planned.py): made when a
scheduled job is staged, over REST or from a campaign file, kept right when its recipients
change (repeats across a file's parts, an erasure), let go when the job starts; read by the plan
as the same users, messages and zones the chunks' JSON gives, and the JSON read instead for a
chunk without arrays (an older release's) or with arrays this release cannot read."""

import io
import struct
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from limits.engine.log import message_hash
from limits.engine.model import message_int
from tests.support.api import call
from worker.chunks import chunk_withdraw
from worker.models import SendChunk, SendJob
from worker.plan import _recipients_read
from worker.planned import VALUED, VERSION, packed_read, recipients_packed
from worker.preparing import send_job_prepare_run
from worker.scheduling import job_started
from worker.services import send_job_create, send_job_from_file

ZONES = ["Europe/London", "America/New_York", "Asia/Kathmandu"]
JOB: dict[str, Any] = {"channel": "push", "campaign": "launch", "template": "welcome"}


@pytest.fixture
def push(published, settings):
    published(vip=(10, [1, 2], {}))
    settings.GATEKEEPER_DISPATCHERS = {"push": "null"}
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 3


def staged(job: SendJob) -> list[SendChunk]:
    return list(SendChunk.objects.filter(job=job, status=SendChunk.Status.STAGED).order_by("pk"))


def from_the_json(job: SendJob) -> tuple[list[int], list[int], list[str | None] | None]:
    """What the plan is to read of a job: its staged recipients as their JSON holds them."""
    rows = [r for chunk in staged(job) for r in chunk.recipients]
    zones = [r.get("time_zone") for r in rows]
    return (
        [r["user_id"] for r in rows],
        [message_int(message_hash(r["message_id"])) for r in rows],
        zones if any(zones) else None,
    )


def as_read(job: SendJob) -> tuple[list[int], list[int], list[str | None] | None]:
    read = _recipients_read(job)
    assert read.users.dtype == np.uint64 and read.messages.dtype == np.uint64
    return read.users.tolist(), read.messages.tolist(), read.zones


def read_both_ways(job: SendJob) -> tuple[list[int], list[int], list[str | None] | None]:
    """The job's recipients as the plan reads them from the arrays, checked against the JSON and
    against the plan's own read of the JSON (every chunk's arrays let go)."""
    arrays = as_read(job)
    assert arrays == from_the_json(job)
    kept = dict(SendChunk.objects.filter(job=job).values_list("pk", "plan"))
    SendChunk.objects.filter(job=job).update(plan=None)
    assert as_read(job) == arrays
    for pk, blob in kept.items():
        SendChunk.objects.filter(pk=pk).update(plan=blob)
    return arrays


def _blob(chunk: SendChunk) -> bytes:
    """A staged chunk's arrays (it has them)."""
    assert chunk.plan is not None
    return bytes(chunk.plan)


recipient: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "user_id": st.integers(1, 2**64 - 1),
        "address": st.just("a@example.com"),
        "message_id": st.text(st.characters(exclude_categories=["Cs"]), min_size=1),
    },
    optional={
        "time_zone": st.sampled_from(ZONES),
        "value": st.floats(0, 1e12, allow_nan=False, allow_infinity=False),
    },
)


@given(st.lists(recipient, max_size=40))
def test_the_arrays_are_the_recipients_users_messages_and_zones(rows):
    blob = recipients_packed(rows)
    read = packed_read(blob, len(rows))
    assert read is not None
    assert read.users.tolist() == [r["user_id"] for r in rows]
    assert read.messages.tolist() == [message_int(message_hash(r["message_id"])) for r in rows]
    assert read.zones() == [r.get("time_zone") for r in rows]
    assert (read.codes is None) == (not any("time_zone" in r for r in rows))
    # A round's values: version 2, NaN for a row without its own; version 1 without any.
    assert blob[0] == (VALUED if any("value" in r for r in rows) else VERSION)
    if read.values is None:
        assert not any("value" in r for r in rows)
    else:
        assert [None if np.isnan(v) else v for v in read.values.tolist()] == [
            r.get("value") for r in rows
        ]
    # Anything else is not read: another count, version or length.
    assert packed_read(blob, len(rows) + 1) is None
    assert packed_read(bytes([VALUED + 1]) + blob[1:], len(rows)) is None
    assert packed_read(blob[:-1], len(rows)) is None
    assert packed_read(blob + b"\0", len(rows)) is None


def test_a_blob_that_is_not_the_layout_is_not_read():
    rows = [{"user_id": 7, "message_id": "m", "time_zone": ZONES[0]}]
    blob = recipients_packed(rows)
    for bad in (
        b"",
        blob[:7],
        blob[:-1],  # the names' JSON cut
        blob[: -len(b'["Europe/London"]')] + b'["Europe/London","UTC"]',  # two names, one said
        blob[:24] + struct.pack("<H", 2) + blob[26:],  # a code past the names
    ):
        assert packed_read(bad, 1) is None, bad


@pytest.mark.postgres
def test_a_job_scheduled_over_rest_is_staged_with_its_arrays_and_starts_without_them(
    api, snapshot, settings
):
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    rows: list[dict[str, Any]] = [
        {"user_id": u, "address": f"u{u}@example.com"} for u in (5, 3, 9, 1, 2)
    ]
    rows[2]["time_zone"] = ZONES[2]
    rows[3]["message_id"] = "their own id"
    body = {
        **JOB,
        "channel": "email",
        "start_at": (timezone.now() + timedelta(hours=2)).isoformat(),
        "recipients": rows,
    }
    created = call(api("gate"), "POST", "/api/v1/sends/", json=body)
    assert created.status_code == 202, created.text
    job = SendJob.objects.get(pk=created.json()["id"])
    assert [c.plan is not None for c in staged(job)] == [True, True, True]
    users, messages, zones = read_both_ways(job)
    assert users == [5, 3, 9, 1, 2]
    assert messages[3] == message_int(message_hash("their own id"))
    assert zones == [None, None, ZONES[2], None, None]

    job_started(job.pk)  # only a staged chunk is planned: the arrays go
    assert list(SendChunk.objects.filter(job=job).values_list("plan", flat=True)) == [None] * 3


@pytest.mark.postgres
def test_a_scheduled_file_read_in_parts_is_staged_with_its_arrays(push, settings):
    settings.GATEKEEPER_SEND_FILE_PART_BYTES = 1000  # some 40 lines a part
    lines = [f"{i},token-{i},{ZONES[i % 3] if i % 4 == 0 else ''}" for i in range(1, 201)]
    lines[149] = "7,token-7-again,"  # user 7 again, parts later: taken out of its chunk
    text = "user_id,address,time_zone\n" + "\n".join(lines) + "\n"
    job = send_job_from_file(
        fileobj=io.BytesIO(text.encode()),
        name="list.csv",
        queue=False,
        start_at=timezone.now() + timedelta(hours=2),
        **JOB,
    )
    assert send_job_prepare_run(job_id=job.pk) == []
    job.refresh_from_db()
    assert job.status == "scheduled" and job.parts.count() >= 3 and job.duplicate == 1
    # Every chunk's arrays are its recipients', the repeat's chunk's made again without it.
    chunks = staged(job)
    packed = [packed_read(_blob(c), c.size) for c in chunks]
    assert len(chunks) > 10 and all(p is not None for p in packed)
    listed = [u for u in range(1, 201) if u != 150]
    assert [u for p in packed if p is not None for u in p.users.tolist()] == listed
    users, _, zones = read_both_ways(job)
    assert users == listed
    assert zones is not None and zones[3] == ZONES[1] and zones[0] is None

    now = send_job_from_file(fileobj=io.BytesIO(b"1,token-1\n"), name="l.csv", queue=False, **JOB)
    send_job_prepare_run(job_id=now.pk)  # starts now: never planned, nothing packed
    assert list(SendChunk.objects.filter(job=now).values_list("plan", flat=True)) == [None]


@pytest.mark.postgres
def test_chunks_without_arrays_or_with_unreadable_ones_are_read_from_their_json(push):
    rows: list[dict[str, Any]] = [{"user_id": u, "address": f"token-{u}"} for u in range(1, 19)]
    rows[16]["time_zone"] = ZONES[0]
    job = send_job_create(
        recipients=rows, start_at=timezone.now() + timedelta(hours=2), queue=False, **JOB
    )
    arrays = read_both_ways(job)
    assert arrays[2] == [None] * 16 + [ZONES[0], None]
    chunks = staged(job)
    assert len(chunks) == 6
    other = recipients_packed(chunks[0].recipients[:2])
    for chunk, blob in zip(
        chunks,
        (
            None,  # staged by an older release
            bytes([VERSION + 1]) + _blob(chunks[1])[1:],  # a later layout
            _blob(chunks[2])[:-8],  # cut short
            other,  # not this chunk's count (an older release took a recipient out)
            b"\x01",
        ),
        strict=False,
    ):
        SendChunk.objects.filter(pk=chunk.pk).update(plan=blob)
    assert as_read(job) == arrays  # the last chunk's arrays, the others' JSON
    SendChunk.objects.filter(pk=chunks[5].pk).update(plan=None)
    assert as_read(job) == arrays  # the zone read from the JSON


@pytest.mark.postgres
def test_a_person_erased_from_a_staged_chunk_is_gone_from_its_arrays(push):
    rows = [{"user_id": u, "address": f"token-{u}", "time_zone": ZONES[0]} for u in (4, 8, 6)]
    job = send_job_create(
        recipients=rows, start_at=timezone.now() + timedelta(hours=2), queue=False, **JOB
    )
    (chunk,) = staged(job)
    assert chunk_withdraw(chunk.pk, {8}) == (1, 0)
    chunk.refresh_from_db()
    read = packed_read(_blob(chunk), chunk.size)
    assert read is not None and read.users.tolist() == [4, 6]
    assert read_both_ways(job) == (
        [4, 6],
        [message_int(message_hash(f"launch:{u}")) for u in (4, 6)],
        [ZONES[0]] * 2,
    )
    assert chunk_withdraw(chunk.pk, {4, 6}) == (2, 0)
    assert SendChunk.objects.get(pk=chunk.pk).plan is None  # nothing left: cancelled
    assert as_read(job) == ([], [], None)
