"""Decisions a round outranked, through the ledger as any gate decision goes: appended with the
send job that won each user's slot and what its send was worth to them, drained (SQLite, and
PostgreSQL's day partitions by COPY), and read back from the table, a user's history (REST,
validated against the served schema, and the admin's timeline), the decisions report and the
event stream (pulled and over REST). An entry an older writer packed still drains."""

import re
from datetime import UTC, datetime

import msgspec
import pytest
import requests
from django.urls import reverse
from openapi_schema_validator import OAS30ReadValidator, oas30_format_checker

from limits.engine.limiter import Decision
from limits.ledger.drain import ledger_drain, ledger_drain_all
from limits.ledger.stream import DECIDED, Decided, ledger_append, ledger_entry, stream_key
from limits.ledger.table import decisions
from limits.models.ledger import LedgerEntry, LedgerKind
from limits.reasons import Reason
from limits.stream.events import START, stream_read
from tests.support.api import call, make_user, token_session
from tests.support.clocks import instant
from worker.gate import gate_check

pytestmark = pytest.mark.postgres

NOW = float(int(datetime.now(UTC).timestamp()))  # whole seconds (the report's days are today)


@pytest.fixture
def vip(published):
    return published(vip=(10, [1, 2, 3], {"email": (1, None)}))


def refused(user_id: int, reason: str = Reason.OUTRANKED, segment: str = "vip") -> Decision:
    """A send refused before the gate (worker/rounds.py's), as the gate's stages build one."""
    return Decision(
        user_id=user_id, message_id=f"spring:{user_id}", allowed=False, reason=reason,
        counts={}, limits={}, retry_after=None, rule=None, segment=segment,
    )  # fmt: skip


def round_decided(version: str, at: float = NOW + 1) -> None:
    """A round's refusals, appended as one call: users 1 and 2 outranked by job 12 (worth 3.5
    and 2 to them), user 3 by job 13 (worth 0.25), and user 9 held out (no job)."""
    assert ledger_append(
        at_ms=round(at * 1000), channel="email", campaign="spring", tags=("promo",), priority=5,
        category="marketing", snapshot_version=version,
        decisions=[refused(1), refused(2), refused(3), refused(9, Reason.HOLDOUT, "default")],
        outranked=[(12, 3.5), (12, 2), (13, 0.25), None],
    )  # fmt: skip


def test_each_outranked_decision_keeps_the_job_and_what_it_was_worth(vip):
    gate_check(channel="email", requests=[(1, "a")], campaign="other", now=instant(NOW))
    round_decided(vip)
    assert ledger_drain_all() == 5  # a call without outranked sends in the same drain
    assert list(
        decisions().order_by("id").values_list("user_id", "message", "reason", "outranked_by")
    ) == [
        (1, "a", "allowed", None),
        (1, "spring:1", "outranked", {"job": 12, "value": 3.5}),
        (2, "spring:2", "outranked", {"job": 12, "value": 2.0}),
        (3, "spring:3", "outranked", {"job": 13, "value": 0.25}),
        (9, "spring:9", "holdout", None),
    ]
    # A kind per winning job (the users' decisions alike but for it); the value on the row,
    # NULL on every other decision.
    rows = list(LedgerEntry.objects.order_by("id").select_related("kind"))
    assert [(r.kind.outranked_by, r.value) for r in rows] == [
        (None, None), (12, 3.5), (12, 2.0), (13, 0.25), (None, None),
    ]  # fmt: skip
    assert rows[1].kind_id == rows[2].kind_id != rows[3].kind_id
    assert LedgerKind.objects.filter(outranked_by__isnull=False).count() == 2
    # Found again, not made again, the next time the same job outranks.
    round_decided(vip, at=NOW + 2)
    assert ledger_drain_all() == 4
    assert LedgerKind.objects.filter(outranked_by__isnull=False).count() == 2


def test_an_entry_an_older_writer_packed_still_drains(vip, redis_client):
    class BeforeRounds(msgspec.Struct, array_like=True, tag=DECIDED, frozen=True):
        """Decided as the gate packed it before rounds."""

        at_ms: int
        channel: str
        campaign: str
        tags: list[str]
        priority: int
        category: str
        version: str
        users: list[int]
        messages: list[str]
        segments: list[str]
        reasons: list[str]
        rules: list[int | None]
        topic: str = ""
        arms: list[int] = []
        zones: list[str] = []

    old = BeforeRounds(
        at_ms=round(NOW * 1000), channel="email", campaign="c", tags=["t"], priority=5,
        category="marketing", version=vip, users=[4, 5], messages=["old-a", "old-b"],
        segments=["", "vip"], reasons=["allowed", "daily_cap"], rules=[None, 7],
        zones=["Europe/London", ""],
    )  # fmt: skip
    packed = msgspec.msgpack.encode(old)
    entry = ledger_entry(packed)
    assert isinstance(entry, Decided) and (entry.by, entry.values) == ([], [])
    redis_client.xadd(stream_key(), {"d": packed})
    assert ledger_drain().rows == 2
    assert list(decisions().order_by("id").values_list("message", "zone", "outranked_by")) == [
        ("old-a", "Europe/London", None),
        ("old-b", "", None),
    ]
    assert not LedgerEntry.objects.filter(value__isnull=False).exists()


def schema_errors(base_url: str, path: str, body: dict) -> list[str]:
    """What in `body`, the 200 answer of GET `path` (a template of the served schema), the
    schema does not declare."""
    document = requests.get(f"{base_url}/api/schema/?format=json", timeout=30).json()
    schema = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    validator = OAS30ReadValidator(
        {**schema["schema"], "components": document["components"]},
        format_checker=oas30_format_checker,
    )
    return [error.message for error in validator.iter_errors(body)]


def test_a_users_history_says_who_outranked_them(api, vip, live_server):
    gate_check(channel="email", requests=[(1, "a")], campaign="other", now=instant(NOW))
    round_decided(vip)
    ledger_drain_all()
    viewer = api("viewer")
    page = call(viewer, "GET", "/api/v1/users/1/history/").json()
    outranked, allowed = page["results"]
    assert outranked["reason"] == "outranked" and outranked["rule"] is None
    assert outranked["outranked_by"] == {
        "job": 12,
        "value": 3.5,
        "description": "Outranked by job 12, worth 3.5 to them.",
    }
    assert allowed["outranked_by"] is None
    assert schema_errors(live_server.url, "/api/v1/users/{user_id}/history/", page) == []
    two = call(viewer, "GET", "/api/v1/users/2/history/", params={"reason": "outranked"}).json()
    assert [d["outranked_by"]["description"] for d in two["results"]] == [
        "Outranked by job 12, worth 2 to them."
    ]
    held = call(viewer, "GET", "/api/v1/users/9/history/").json()["results"]
    assert [(d["reason"], d["outranked_by"]) for d in held] == [("holdout", None)]


def test_the_timeline_says_who_outranked_them(marketer_client, vip):
    round_decided(vip)
    ledger_drain_all()
    response = marketer_client.get(reverse("admin:user_lookup"), {"user_id": "3"})
    assert response.status_code == 200
    page = re.sub(r"\s+", " ", response.content.decode())
    assert '<span class="gk-badge gk-warn">outranked</span>' in page
    assert "Outranked by job 13, worth 0.25 to them." in page


def test_the_decisions_report_counts_them_by_reason(api, vip):
    gate_check(channel="email", requests=[(1, "a")], campaign="other", now=instant(NOW))
    round_decided(vip)
    ledger_drain_all()
    day = datetime.fromtimestamp(NOW, tz=UTC).date().isoformat()
    report = call(
        api("viewer"), "GET", "/api/v1/reports/decisions/",
        params={"from": day, "to": day, "group_by": "reason"},
    ).json()  # fmt: skip
    assert report["results"] == [
        {"reason": "allowed", "count": 1},
        {"reason": "holdout", "count": 1},
        {"reason": "outranked", "count": 3},
    ]
    only = call(
        api("viewer"), "GET", "/api/v1/reports/decisions/",
        params={"from": day, "to": day, "group_by": "campaign,reason", "reason": "outranked"},
    ).json()  # fmt: skip
    assert only["results"] == [{"campaign": "spring", "reason": "outranked", "count": 3}]


def test_the_event_stream_carries_outranked_by(vip, live_server):
    ledger_drain_all()  # the stream's first drain: it starts here
    gate_check(channel="email", requests=[(1, "a")], campaign="other", now=instant(NOW))
    round_decided(vip)
    ledger_drain_all()
    page = stream_read(START, 100)
    assert [
        (e["user_id"], e["message_id"], e["reason"], e["outranked_by"]) for e in page.events
    ] == [
        (1, "a", "allowed", None),
        (1, "spring:1", "outranked", {"job": 12, "value": 3.5}),
        (2, "spring:2", "outranked", {"job": 12, "value": 2.0}),
        (3, "spring:3", "outranked", {"job": 13, "value": 0.25}),
        (9, "spring:9", "holdout", None),
    ]
    # Over REST, as the served schema declares it.
    loader = token_session(live_server.url, make_user("loader", "limits.read_stream"))
    body = call(loader, "GET", "/api/v1/stream/").json()
    assert [e["outranked_by"] for e in body["events"]] == [e["outranked_by"] for e in page.events]
    assert schema_errors(live_server.url, "/api/v1/stream/", body) == []
