"""Erasing people: a person put in every place by the real parts, erased over REST (two passes),
then looked for in every table and in Redis: nothing of them left, the gate refusing them on
every channel and keeping none of it, someone else's data whole, the job's counts adding up; a
chunk being sent waits for its run to end; the command; bad input; the Redis part on a cluster."""

import io
from datetime import UTC, datetime, timedelta

import msgspec
import numpy as np
import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.utils import timezone

from limits.engine import log
from limits.engine.limiter import get_limiter
from limits.engine.reservations import HOLDS_KEY, HeldJob, holds_decode, holds_encode, holds_store
from limits.engine.table import NO_RULES
from limits.ledger.drain import ledger_drain_all
from limits.ledger.stream import stream_key
from limits.models.ledger import LedgerEntry
from limits.models.privacy import Erasure
from limits.people.suppression import erased_keys, erasure_key_forget
from limits.privacy.erasure import erasure_run
from limits.reasons import Reason
from tests.support.api import call, make_user, token_session
from tests.support.personal import ADDRESS, NUMBER, person_everywhere
from worker.gate import gate_check
from worker.models import SendChunk, SendJob

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = 987_654_321
NOW = datetime.now(UTC)
LATER = timedelta(seconds=31)  # past the second pass's wait


@pytest.fixture
def officer(live_server):
    user = make_user("officer", "limits.erase_users", "limits.view_erasure")
    return token_session(live_server.url, user)


def erase(session, *ids) -> dict:
    response = call(session, "POST", "/api/v1/users/erase/", json={"user_ids": list(ids)})
    assert response.status_code == 202, response.text
    return response.json()


def both_passes(erasure_id: int) -> Erasure:
    first = erasure_run(erasure_id)
    assert first is not None and (first.status, first.passes) == ("waiting", 1)
    second = erasure_run(erasure_id, now=timezone.now() + LATER)
    assert second is not None
    return second


def rows_naming(value: str) -> list[str]:
    """Every row of the project's tables whose values, as text, hold `value`."""
    found = []
    for model in apps.get_models():
        if model._meta.app_label not in ("segments", "limits", "worker"):
            continue
        for row in model._default_manager.values_list():
            if value in str(row):
                found.append(f"{model.__name__}: {str(row)[:120]}")
    return found


@pytest.mark.postgres
def test_an_erased_person_is_gone_from_every_place_and_the_gate_refuses_them(
    api, snapshot, officer, redis_client
):
    job = person_everywhere(api("gate"), PERSON, others=(2,), now=NOW)
    (sent,) = gate_check(channel="email", requests=[(PERSON, "autumn:1")], campaign="autumn")
    assert sent.allowed  # their log (a quota reset forgot the earlier one)
    limiter = get_limiter()
    held = HeldJob(id=job.pk, priority=9, start_ms=0, channel="email", campaign="launch", tags=())
    users = np.array([2, PERSON], dtype=np.uint64)
    holds_store(limiter.client, limiter.prefix, holds_encode([(held, users)]), version="t")
    assert limiter.entries(PERSON) and rows_naming(str(PERSON)) and rows_naming(ADDRESS)

    answer = erase(officer, PERSON, PERSON)
    assert (answer["count"], answer["status"], answer["requested_by"]) == (1, "queued", "officer")
    first = erasure_run(answer["id"])
    assert first is not None and first.status == "waiting"
    # From the first pass on, the gate refuses them on every channel and keeps none of it.
    for channel in ("email", "push"):
        (decision,) = gate_check(channel=channel, requests=[(PERSON, f"after:{channel}")])
        assert decision.reason == Reason.SUPPRESSED
    ledger_drain_all()
    assert not LedgerEntry.objects.filter(user_id=PERSON).exists()
    done = erasure_run(answer["id"], now=timezone.now() + LATER)
    assert done is not None and done.status == "done" and done.users is None

    shown = officer.get(answer["url"], timeout=30).json()
    assert (shown["status"], shown["progress"], shown["waiting"]) == ("done", 100.0, 0)
    assert shown["finished_at"] is not None
    removed = shown["removed"]
    for place in ("decisions", "suppression", "preferences", "quota_resets", "studies"):
        assert removed[place] >= 1, place
    assert (removed["send_jobs"], removed["dead_addresses"], removed["sms_numbers"]) == (1, 1, 1)
    assert removed["reservations"] == 1 and removed["send_log"] >= 1

    # Nothing of them in any table (the erasure itself keeps who asked and how many only).
    for value in (str(PERSON), ADDRESS, NUMBER, "old@example.com", "Ana"):
        assert rows_naming(value) == [], value
    # Nor in Redis: their logs, the holds, the ledger's stream, any key's name.
    key = log.bucket_key(limiter.prefix, PERSON)
    assert redis_client.hget(key, log.bucket_field(PERSON)) is None
    assert redis_client.hget(key, log.uncounted_field(PERSON)) is None
    holds = holds_decode(redis_client.get(f"{limiter.prefix}{HOLDS_KEY}"))
    assert holds.users.tolist() == [2]
    for _, fields in redis_client.xrange(stream_key()):
        for value in fields.values():
            assert PERSON not in msgspec.msgpack.decode(value).get("users", [])
    assert not [k for k in redis_client.scan_iter(count=1000) if str(PERSON).encode() in k]

    # Someone else's data whole; the job's counts add up, the erased recipient cancelled.
    export = call(api("viewer"), "GET", "/api/v1/users/2/export/").json()
    assert export["decisions"] and export["suppression"]
    assert [r["address"] for r in export["send_jobs"]] == ["u2@example.com"]
    job.refresh_from_db()
    assert (job.total, job.cancelled, job.status) == (2, 1, "scheduled")
    assert sum(c.size for c in job.chunks.all()) == 1

    # Again: nothing more to remove, done as before.
    again = both_passes(erase(officer, PERSON)["id"])
    assert again.status == "done" and set(again.removed.values()) == {0}


@pytest.mark.postgres
def test_a_chunk_being_sent_keeps_their_records_until_its_run_ends(api, snapshot, officer):
    created = call(
        api("gate"),
        "POST",
        "/api/v1/sends/",
        json={
            "channel": "email",
            "campaign": "now",
            "template": "welcome",
            "recipients": [
                {"user_id": PERSON, "address": ADDRESS},
                {"user_id": 2, "address": "u2@example.com"},
            ],
        },
    )
    assert created.status_code == 202, created.text
    (chunk,) = SendChunk.objects.filter(job_id=created.json()["id"])
    # A run holds it, as a worker sending it would.
    SendChunk.objects.filter(pk=chunk.pk).update(
        lease_until=timezone.now() + timedelta(seconds=60), runs=1
    )
    erasure_id = erase(officer, PERSON)["id"]
    first = erasure_run(erasure_id)
    assert first is not None and (first.status, first.waiting) == ("waiting", 1)
    assert "send_jobs" not in first.places_done
    second = erasure_run(erasure_id, now=timezone.now() + LATER)
    assert second is not None and (second.status, second.waiting) == ("waiting", 1)
    # The run ends (the gate refused the erased person); the next pass blanks their record.
    SendChunk.objects.filter(pk=chunk.pk).update(lease_until=None, status="done")
    third = erasure_run(erasure_id, now=timezone.now() + 2 * LATER)
    assert third is not None and (third.status, third.passes) == ("waiting", 1)  # then the second
    last = erasure_run(erasure_id, now=timezone.now() + 3 * LATER)
    assert last is not None and last.status == "done" and last.removed["send_jobs"] == 1
    chunk.refresh_from_db()
    assert [r["user_id"] for r in chunk.recipients] == [0, 2] and chunk.size == 2
    assert rows_naming(ADDRESS) == []


def test_erasures_refuse_bad_input_and_need_their_right(api, snapshot, officer):
    for body, field in (
        ({"user_ids": []}, "user_ids"),
        ({"user_ids": list(range(1001))}, "user_ids"),
        ({"user_ids": [-1]}, "user_ids[0]"),
        ({"user_ids": ["x"]}, "user_ids[0]"),
        ({"ids": [1]}, "ids"),
    ):
        refused = call(officer, "POST", "/api/v1/users/erase/", json=body)
        assert refused.status_code == 400 and field in refused.json(), (body, refused.text)
    assert not Erasure.objects.exists()  # nothing made of a refused request
    assert (
        call(api("viewer"), "POST", "/api/v1/users/erase/", json={"user_ids": [1]}).status_code
        == 403
    )
    assert (
        call(api("gate"), "POST", "/api/v1/users/erase/", json={"user_ids": [1]}).status_code == 403
    )
    assert call(officer, "GET", "/api/v1/erasures/999/").status_code == 404


@pytest.mark.postgres
def test_the_command_erases_a_file_of_ids_both_passes(api, snapshot, tmp_path, monkeypatch):
    person_everywhere(api("gate"), PERSON, others=(2,), now=NOW)
    monkeypatch.setattr("limits.privacy.erasure.RETRY_IN", timedelta(0))
    path = tmp_path / "erase.txt"
    path.write_text(f"user_id\n{PERSON}\n\n{PERSON}\n")
    out = io.StringIO()
    call_command("erase_users", str(path), stdout=out)
    assert "Erasure" in out.getvalue() and "done" in out.getvalue()
    (erasure,) = Erasure.objects.all()
    assert (erasure.count, erasure.via, erasure.status) == (1, "command", "done")
    assert rows_naming(ADDRESS) == []
    path.write_text("12\nnot an id\n")
    with pytest.raises(CommandError, match="line 2"):
        call_command("erase_users", str(path))
    with pytest.raises(CommandError, match="No such file"):
        call_command("erase_users", str(tmp_path / "missing.txt"))


def test_the_logs_are_forgotten_on_every_node(limiter):
    users = [PERSON + n * 7919 for n in range(40)]  # buckets on every node of a cluster
    keep = [u + 1 for u in users]
    for user_id in users + keep:
        (decision,) = limiter.acquire("email", [(user_id, f"m{user_id}")], NO_RULES)
        assert decision.allowed
    assert limiter.forget(users) == len(users)
    assert all(limiter.entries(u) == [] for u in users)
    assert all(len(limiter.entries(u)) == 1 for u in keep)
    assert limiter.forget(users) == 0


def test_an_erasure_waits_while_a_campaign_file_is_being_read(api, snapshot, officer):
    reading = SendJob.objects.create(
        channel="email", campaign="file", template="welcome", status=SendJob.Status.PREPARING
    )
    erasure_id = erase(officer, PERSON)["id"]
    first = erasure_run(erasure_id)
    assert first is not None and (first.status, first.waiting) == ("waiting", 1)
    assert "send_jobs" not in first.places_done
    SendJob.objects.filter(pk=reading.pk).update(status=SendJob.Status.QUEUED)
    assert both_passes(erasure_id).status == "done"


def test_the_erasure_key_is_made_once_kept_and_outlives_a_secret_key_rotation(settings):
    settings.GATEKEEPER_ERASURE_KEY = ""
    keys = erased_keys([5, 6])
    assert len(set(keys)) == 2 and all(0 <= k < 2**63 for k in keys)
    settings.SECRET_KEY = "rotated"
    erasure_key_forget()  # as another process would: read from the database
    assert erased_keys([5, 6]) == keys
    settings.GATEKEEPER_ERASURE_KEY = "the operator's own"
    assert erased_keys([5, 6]) != keys
