"""Rounds over REST: a campaign system makes a round, its send jobs join it with a value (the
job's, or each recipient's: a JSON row's or a campaign file's `value` column), leave it or change
their value until it closes, and the round is edited or cancelled while open (its jobs then wait
as plain scheduled jobs, or are cancelled). Bad input is a 400 naming the field, with nothing
stored or changed; what conflicts with a round's state is a 409."""

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

JOB: dict[str, Any] = {"channel": "email", "campaign": "spring", "template": "welcome"}
ROWS = [{"user_id": 1, "address": "a@example.com"}, {"user_id": 7, "address": "b@example.com"}]


def ahead(**delta: float) -> datetime:
    return (timezone.now() + timedelta(**delta)).replace(microsecond=0)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def made_round(s, **fields: Any) -> dict[str, Any]:
    body = {"name": "Friday", "channel": "email", "closes_at": ahead(hours=2).isoformat(), **fields}
    answer = call(s, "POST", "/api/v1/rounds/", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def closed(round_id: int) -> None:
    """The round's close passed (as the clock would have it), still open: not decided yet."""
    from worker.models import Round

    Round.objects.filter(pk=round_id).update(closes_at=timezone.now() - timedelta(seconds=1))


def test_a_round_is_made_listed_read_and_edited_while_open(api, snapshot):
    from worker.models import Round

    s, viewer = api("gate"), api("viewer")
    closes = ahead(hours=2)
    created = call(
        s,
        "POST",
        "/api/v1/rounds/",
        json={"name": "Friday", "channel": "email", "closes_at": closes.isoformat()},
    )
    assert created.status_code == 201, created.text
    made = created.json()
    assert created.headers["Location"] == made["url"]
    assert (made["status"], made["channel"], made["job_count"]) == ("open", "email", 0)
    assert at(made["closes_at"]) == at(made["send_at"]) == closes  # send_at defaults to it
    path = f"/api/v1/rounds/{made['id']}/"

    listed = call(viewer, "GET", "/api/v1/rounds/").json()["results"]
    assert [r["id"] for r in listed] == [made["id"]]
    shown = call(viewer, "GET", path).json()
    assert (shown["jobs"], shown["report"], shown["decided_at"]) == ([], None, None)
    assert call(viewer, "POST", "/api/v1/rounds/", json={}).status_code == 403
    assert call(viewer, "PATCH", path, json={"name": "x"}).status_code == 403
    assert call(s, "GET", "/api/v1/rounds/999999/").status_code == 404

    # A send_at that followed closes_at follows it still; given, it stays where it is put.
    later = ahead(hours=3)
    edited = call(s, "PATCH", path, json={"name": "Friday deals", "closes_at": later.isoformat()})
    assert edited.status_code == 200, edited.text
    assert edited.json()["name"] == "Friday deals"
    assert at(edited.json()["closes_at"]) == at(edited.json()["send_at"]) == later
    send = ahead(hours=5)
    edited = call(s, "PATCH", path, json={"send_at": send.isoformat()}).json()
    assert at(edited["send_at"]) == send
    edited = call(s, "PATCH", path, json={"closes_at": ahead(hours=4).isoformat()}).json()
    assert at(edited["send_at"]) == send

    for body, field in (
        ({"send_at": ahead(hours=1).isoformat()}, "send_at"),  # before closes_at
        ({"closes_at": ahead(hours=-1).isoformat()}, "closes_at"),  # passed
        ({"closes_at": ahead(days=91).isoformat()}, "closes_at"),  # beyond START_MAX
        ({"closes_at": "2030-01-01T09:00:00"}, "closes_at"),  # no UTC offset
        ({"name": ""}, "name"),
        ({"channel": "push"}, "channel"),  # its jobs were checked against it
    ):
        refused = call(s, "PATCH", path, json=body)
        assert refused.status_code == 400 and field in refused.json(), (body, refused.text)
    kept = Round.objects.get(pk=made["id"])
    assert (kept.name, kept.send_at) == ("Friday deals", send)

    before = Round.objects.count()
    for body, field in (
        ({"channel": "fax"}, "channel"),
        ({"channel": "all", "closes_at": ahead(hours=-1).isoformat()}, "closes_at"),
        ({"channel": "all", "send_at": ahead(hours=1).isoformat()}, "send_at"),
        ({"channel": "all", "name": " "}, "name"),
    ):
        full = {"name": "R", "closes_at": ahead(hours=2).isoformat(), **body}
        refused = call(s, "POST", "/api/v1/rounds/", json=full)
        assert refused.status_code == 400 and field in refused.json(), (body, refused.text)
    assert (
        "Unknown channel 'fax'"
        in call(
            s,
            "POST",
            "/api/v1/rounds/",
            json={"name": "R", "channel": "fax", "closes_at": ahead(hours=2).isoformat()},
        ).json()["channel"][0]
    )
    assert Round.objects.count() == before

    closed(made["id"])  # its time has come: it is being decided, not edited
    late = call(s, "PATCH", path, json={"name": "late"})
    assert late.status_code == 409 and late.json()["field"] == "status"


def test_jobs_join_with_a_job_value_or_each_recipients_and_follow_the_rounds_send_at(api, snapshot):
    from worker.models import SendChunk, SendJob

    s = api("gate")
    send = ahead(hours=3)
    made = made_round(s, channel="all", send_at=send.isoformat())
    joined = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**JOB, "recipients": ROWS, "round": made["id"], "value": 2.5},
    )
    assert joined.status_code == 202, joined.text
    job = joined.json()
    assert (job["status"], at(job["start_at"]), job["round"], job["value"]) == (
        "scheduled",
        send,
        made["id"],
        2.5,
    )
    stored = SendJob.objects.get(pk=job["id"])
    assert stored.expires_at == send + timedelta(hours=24)  # from its start, as scheduled jobs
    chunk = SendChunk.objects.get(job=stored)
    assert chunk.status == "staged"  # waits as any scheduled job: nothing handed out
    assert all("value" not in row for row in chunk.recipients)  # the job's value is theirs

    # Without a job value, every recipient carries its own (stored only where given).
    own = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={
            **JOB,
            "channel": "push",
            "campaign": "own",
            "recipients": [
                {"user_id": 1, "address": "token-1", "value": 3},
                {"user_id": 7, "address": "token-7", "value": 0.5},
            ],
            "round": made["id"],
            "start_at": send.isoformat(),
        },
    )
    assert own.status_code == 202, own.text
    assert own.json()["value"] is None
    values = [row["value"] for row in SendChunk.objects.get(job_id=own.json()["id"]).recipients]
    assert values == [3.0, 0.5]

    shown = call(api("viewer"), "GET", f"/api/v1/rounds/{made['id']}/").json()
    assert shown["job_count"] == 2
    assert [
        (j["id"], j["campaign"], j["channel"], j["value"], j["total"]) for j in shown["jobs"]
    ] == [
        (job["id"], "spring", "email", 2.5, 2),
        (own.json()["id"], "own", "push", None, 2),
    ]
    assert {"priority", "created_at", "status"} <= set(shown["jobs"][0])

    # The round's send_at moves: every job in it starts then, its expiry moved by as much.
    later = send + timedelta(hours=1)
    moved = call(s, "PATCH", f"/api/v1/rounds/{made['id']}/", json={"send_at": later.isoformat()})
    assert moved.status_code == 200, moved.text
    for joined_job in SendJob.objects.filter(round_id=made["id"]):
        assert joined_job.start_at == later
        assert joined_job.expires_at == later + timedelta(hours=24)


def test_a_bad_join_is_a_400_naming_the_field_and_stores_nothing(api, snapshot):
    from worker.models import Round, SendJob

    s = api("gate")
    made = made_round(s)
    push_round = made_round(s, channel="push")
    gone = made_round(s)
    closed(gone["id"])
    cancelled = made_round(s)
    assert call(s, "POST", f"/api/v1/rounds/{cancelled['id']}/cancel/", json={"jobs": "wait"}).ok
    send_at = made["send_at"]
    joining = {**JOB, "recipients": ROWS, "round": made["id"], "value": 1}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"value": -1}, "value"),
        ({"value": "abc"}, "value"),
        ({"value": True}, "value"),
        ({"round": None}, "value"),  # a value without a round
        ({"round": 999999}, "round"),
        ({"round": "1"}, "round"),
        ({"round": gone["id"]}, "round"),  # a job joining a closed round
        ({"round": cancelled["id"]}, "round"),
        ({"round": push_round["id"]}, "channel"),
        ({"category": "transactional"}, "category"),
        ({"reserve": True}, "reserve"),
        ({"start_at": ahead(hours=5).isoformat()}, "start_at"),
        ({"value": None}, "value"),  # no value: neither the job's nor each row's
        ({"value": None, "recipients": [{**ROWS[0], "value": 1}, ROWS[1]]}, "value"),
        ({"recipients": [{**ROWS[0], "value": -0.5}]}, "recipients[0].value"),
        ({"recipients": [{**ROWS[0], "value": "abc"}]}, "recipients[0].value"),
    ]
    before = SendJob.objects.count()
    for change, field in cases:
        refused = call(s, "POST", "/api/v1/sends/", json={**joining, **change})
        assert refused.status_code == 400, (change, refused.text)
        assert field in refused.json(), (change, refused.json())
    assert SendJob.objects.count() == before
    assert (
        "closed at"
        in call(s, "POST", "/api/v1/sends/", json={**joining, "round": gone["id"]}).json()["round"][
            0
        ]
    )
    # The round's own send time is no other start.
    same = call(s, "POST", "/api/v1/sends/", json={**joining, "start_at": send_at})
    assert same.status_code == 202, same.text
    # A bad row value is an invalid row: skipped when the job says so.
    skipped = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**joining, "on_invalid": "skip", "recipients": [{**ROWS[0], "value": -2}, ROWS[1]]},
    ).json()
    assert (skipped["invalid"], skipped["invalid_rows"][0]["field"]) == (1, "value")
    assert Round.objects.get(pk=made["id"]).jobs.count() == 2


def test_a_job_changes_its_value_leaves_and_joins_until_the_round_closes(api, snapshot):
    from worker.models import SendChunk, SendJob

    s = api("gate")
    made = made_round(s, send_at=ahead(hours=4).isoformat())
    other = made_round(s, send_at=ahead(hours=6).isoformat())
    job = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**JOB, "recipients": ROWS, "round": made["id"], "value": 1},
    ).json()
    path = f"/api/v1/sends/{job['id']}/"
    start = at(job["start_at"])

    changed = call(s, "PATCH", path, json={"value": 5})
    assert changed.status_code == 200 and changed.json()["value"] == 5.0, changed.text
    # It follows the round's send_at: no start of its own, no early start.
    moved = call(s, "PATCH", path, json={"start_at": ahead(hours=8).isoformat()})
    assert moved.status_code == 400 and "start_at" in moved.json()
    early = call(s, "POST", f"{path}start/")
    assert early.status_code == 409 and "leave the round first" in early.json()["detail"]
    # Without a job value, each recipient would need one: these have none.
    assert "value" in call(s, "PATCH", path, json={"value": None}).json()
    for bad in (-1, "abc"):
        assert "value" in call(s, "PATCH", path, json={"value": bad}).json()
    assert SendJob.objects.get(pk=job["id"]).value == 5.0

    # It leaves: still scheduled at its start, its value gone with the round.
    left = call(s, "PATCH", path, json={"round": None})
    assert left.status_code == 200, left.text
    assert (left.json()["round"], left.json()["value"], left.json()["status"]) == (
        None,
        None,
        "scheduled",
    )
    assert at(left.json()["start_at"]) == start
    assert "value" in call(s, "PATCH", path, json={"value": 2}).json()  # no round, no value

    # It joins another: its start (and expiry, by as much) moves to that round's send_at.
    rejoined = call(s, "PATCH", path, json={"round": other["id"], "value": 3})
    assert rejoined.status_code == 200, rejoined.text
    assert at(rejoined.json()["start_at"]) == at(other["send_at"])
    assert at(rejoined.json()["expires_at"]) == at(other["send_at"]) + timedelta(hours=24)
    assert SendChunk.objects.get(job_id=job["id"]).status == "staged"

    # Once the round closed, nothing of the job changes (the decision reads it).
    closed(other["id"])
    for body in ({"value": 4}, {"round": None}, {"priority": 8}, {"round": made["id"]}):
        late = call(s, "PATCH", path, json=body)
        assert late.status_code == 409 and late.json()["field"] == "round", (body, late.text)
    assert (
        SendJob.objects.get(pk=job["id"]).value,
        SendJob.objects.get(pk=job["id"]).round_id,
    ) == (
        3.0,
        other["id"],
    )
    # Nor does a job outside join a closed round.
    outside = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**JOB, "campaign": "out", "recipients": ROWS, "start_at": ahead(hours=1).isoformat()},
    ).json()
    late = call(
        s, "PATCH", f"/api/v1/sends/{outside['id']}/", json={"round": other["id"], "value": 1}
    )
    assert late.status_code == 409 and late.json()["field"] == "round"


def test_a_cancelled_round_lets_its_jobs_wait_or_cancels_them(api, snapshot):
    from worker.models import SendChunk, SendJob

    s = api("gate")
    waiting = made_round(s)
    job = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**JOB, "recipients": ROWS, "round": waiting["id"], "value": 1},
    ).json()
    bad = call(s, "POST", f"/api/v1/rounds/{waiting['id']}/cancel/", json={"jobs": "maybe"})
    assert bad.status_code == 400 and "jobs" in bad.json()
    assert (
        call(
            api("viewer"), "POST", f"/api/v1/rounds/{waiting['id']}/cancel/", json={"jobs": "wait"}
        ).status_code
        == 403
    )
    answer = call(s, "POST", f"/api/v1/rounds/{waiting['id']}/cancel/", json={"jobs": "wait"})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["jobs"]) == ("cancelled", [])
    assert answer.json()["cancelled_at"] is not None
    left = SendJob.objects.get(pk=job["id"])
    assert (left.round_id, left.value, left.status) == (None, None, "scheduled")
    assert left.start_at == at(waiting["send_at"])  # it starts then, as a plain scheduled job
    assert SendChunk.objects.get(job=left).status == "staged"
    again = call(s, "POST", f"/api/v1/rounds/{waiting['id']}/cancel/", json={"jobs": "wait"})
    assert again.status_code == 409 and again.json()["field"] == "status"
    edit = call(s, "PATCH", f"/api/v1/rounds/{waiting['id']}/", json={"name": "x"})
    assert edit.status_code == 409

    ending = made_round(s)
    job = call(
        s,
        "POST",
        "/api/v1/sends/",
        json={**JOB, "recipients": ROWS, "round": ending["id"], "value": 1},
    ).json()
    answer = call(s, "POST", f"/api/v1/rounds/{ending['id']}/cancel/", json={"jobs": "cancel"})
    assert answer.status_code == 200, answer.text
    assert [(j["id"], j["status"]) for j in answer.json()["jobs"]] == [(job["id"], "cancelled")]
    cancelled = SendJob.objects.get(pk=job["id"])
    assert (cancelled.status, cancelled.cancelled, cancelled.pending) == ("cancelled", 2, 0)
    assert cancelled.cancelled_at is not None
    assert not SendChunk.objects.filter(job=cancelled).exists()


def test_a_campaign_file_with_a_value_column_joins_a_round(api, snapshot):
    from worker.models import SendChunk, SendJob
    from worker.preparing import send_job_prepare_run

    s = api("gate")
    made = made_round(s, channel="push")
    fields = {"channel": "push", "campaign": "blast", "template": "welcome", "round": made["id"]}

    def upload(text: str, **extra: str):
        return call(
            s,
            "POST",
            "/api/v1/sends/",
            data={**fields, **extra},
            files={"recipients_file": ("blast.csv", text.encode())},
        )

    valued = "user_id,address,value\n1,token-1,2\n2,token-2,0.25\n3,token-3,\n"
    created = upload(valued, value="1.5")
    assert created.status_code == 202, created.text
    job = created.json()
    assert (job["status"], job["round"], job["value"]) == ("preparing", made["id"], 1.5)
    assert send_job_prepare_run(job_id=job["id"]) == []  # staged until the round's send time
    stored = SendJob.objects.get(pk=job["id"])
    assert (stored.status, stored.start_at, stored.total) == ("scheduled", at(made["send_at"]), 3)
    rows = SendChunk.objects.get(job=stored).recipients
    assert [row.get("value") for row in rows] == [2.0, 0.25, None]  # the job's for the third

    before = SendJob.objects.count()
    for text, extra, field, words in (
        ("user_id,address\n1,token-1\n", {}, "value", "`value` column"),  # no value anywhere
        ("1,token-1\n", {}, "value", "`value` column"),  # by position: no value column
        (valued, {}, "recipients_file", "line 4 (value)"),  # a row without, and no job value
        ("user_id,address,value\n1,token-1,NaN\n", {}, "recipients_file", "not a finite"),
        ("user_id,address,value\n1,token-1,abc\n", {}, "recipients_file", "not a number"),
        ("user_id,address,value\n1,token-1,-1\n", {}, "recipients_file", "below 0"),
        (valued, {"value": "abc"}, "value", ""),
        (valued, {"value": "-1"}, "value", ""),
    ):
        refused = upload(text, **extra)
        assert refused.status_code == 400 and field in refused.json(), (text, refused.text)
        assert words in " ".join(refused.json()[field]), refused.json()
    assert SendJob.objects.count() == before

    # With on_invalid skip, a NaN row is counted invalid and the rest joins.
    skipping = upload(
        "user_id,address,value\n1,token-1,NaN\n2,token-2,4\n", on_invalid="skip"
    ).json()
    send_job_prepare_run(job_id=skipping["id"])
    stored = SendJob.objects.get(pk=skipping["id"])
    assert (stored.status, stored.invalid, stored.invalid_rows[0]["field"]) == (
        "scheduled",
        1,
        "value",
    )
    assert [row["value"] for row in SendChunk.objects.get(job=stored).recipients] == [4.0]


def test_a_rounds_report_projected_before_it_closes_and_decided_after(api, snapshot):
    from worker import tasks
    from worker.models import Round
    from worker.rounds import rounds_close_due

    s, viewer = api("gate"), api("viewer")
    made = made_round(s, channel="all")
    path = f"/api/v1/rounds/{made['id']}/report/"
    jobs = [
        call(s, "POST", "/api/v1/sends/", json={**JOB, "campaign": f"c{value}",
             "recipients": ROWS, "round": made["id"], "value": value}).json()["id"]
        for value in (1, 4)
    ]  # fmt: skip
    empty = call(viewer, "GET", path).json()
    assert empty == {"round": made["id"], "status": "open", "differences": 0, "report": None,
                     "projection": None}  # fmt: skip

    # Bad asks: a job not in the round, a value below 0; nothing is asked.
    for values, words in (({"999999": 1}, "Not a job of round"), ({str(jobs[0]): -1}, "below 0")):
        bad = call(s, "POST", path, json={"values": values})
        assert bad.status_code == 400 and words in bad.json()["values"][0], bad.text
    assert call(viewer, "POST", path, json={}).status_code == 403

    asked = call(s, "POST", path, json={"values": {str(jobs[0]): 10}})
    assert asked.status_code == 202, asked.text
    tasks.round_project_run(made["id"], {str(jobs[0]): 10.0})  # what the worker runs
    projected = call(viewer, "GET", path).json()["projection"]
    assert projected["values"] == {str(jobs[0]): 10.0}
    won = {row["job"]: row["won"] for row in projected["report"]["jobs"]}
    # User 1 (vip: 2 emails a day) gets both; user 7 (everyone else: 1 a day) the one worth
    # 10 as tried, which first come, first served gives them too (the job made first).
    assert won == {jobs[0]: 2, jobs[1]: 1}
    assert projected["report"]["gain"] == 0.0

    closed(made["id"])
    assert rounds_close_due() == [made["id"]]
    decided = call(viewer, "GET", path).json()
    assert (decided["status"], decided["projection"]) == ("decided", None)
    # As they are: user 7's one slot goes to the job worth 4, not to the one made first.
    rows = {row["job"]: row for row in decided["report"]["jobs"]}
    assert (rows[jobs[0]]["won"], rows[jobs[1]]["won"]) == (1, 2)
    assert rows[jobs[0]]["outranked_by"] == [{"job": jobs[1], "count": 1}]
    assert (decided["report"]["value_won"], decided["report"]["gain"]) == (9.0, 3.0)
    assert Round.objects.get(pk=made["id"]).status == "decided"
    late = call(s, "POST", path, json={})
    assert late.status_code == 409 and "open round" in late.text
