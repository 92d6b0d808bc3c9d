"""The event stream, pulled: every decision the ledger keeps, every send outcome, and every
suppression and preferences change, in one order, from a resumable cursor; the same id for the
same event read twice; filters; an erased person's events gone; bad input over REST named."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from limits.ledger.drain import ledger_drain, ledger_drain_all, ledger_upkeep
from limits.models.ledger import LedgerEntry
from limits.models.stream import StreamBatch
from limits.people.suppression import suppress, unsuppress
from limits.privacy.erasure import erasure_run
from limits.privacy.services import erasure_start
from limits.stream.events import (
    EVERY,
    LOOK_MAX,
    START,
    Filters,
    Position,
    position_from_text,
    stream_end,
    stream_read,
)
from tests.support.api import call, make_user, token_session
from tests.support.clocks import instant
from worker.gate import gate_check, gate_outcomes, gate_release

NOW = float(int(datetime.now(UTC).timestamp()))  # whole seconds: the ledger keeps ms


@pytest.fixture
def snapshot(published):
    return published(vip=(10, [1, 2], {"email": (1, None)}))


def everything(after: Position = START, filters: Filters = EVERY, limit: int = 1000):
    """Every event after `after`, read `limit` at a time, and where the reads ended."""
    events = []
    while True:
        page = stream_read(after, limit, filters)
        events.extend(page.events)
        assert page.next >= after  # never backwards
        after = page.next
        if not page.more:
            return events, after


@pytest.mark.postgres
def test_decisions_and_their_outcomes_are_streamed_in_order(snapshot):
    ledger_drain_all()  # the stream's first drain: it starts here
    gate_check(
        channel="email", requests=[(1, "a"), (1, "b"), (9, "c")], campaign="spring",
        tags=("promo",), priority=7, now=instant(NOW),
    )  # fmt: skip
    gate_outcomes(
        channel="email", since=instant(NOW - 1), outcomes=[(1, "a", "sent")]
    )  # with its row
    ledger_drain_all()
    gate_outcomes(
        channel="email", since=instant(NOW - 1), outcomes=[(9, "c", "failed")]
    )  # on its row
    ledger_drain_all()
    events, _ = everything()
    assert [(e["type"], e["id"][0], e.get("message_id"), e.get("outcome")) for e in events] == [
        ("decision", "d", "a", None),
        ("decision", "d", "b", None),
        ("decision", "d", "c", None),
        ("outcome", "o", "a", "sent"),
        ("outcome", "o", "c", "failed"),
    ]
    a, b, c, sent, failed = events
    rule = LedgerEntry.objects.get(pk=int(b["id"][1:])).kind.rule_id
    assert a == {
        "id": a["id"], "type": "decision", "at": a["at"], "user_id": 1, "channel": "email",
        "campaign": "spring", "message_id": "a", "reason": "allowed", "rule_id": None,
        "segment": "vip", "tags": ["promo"], "priority": 7, "category": "marketing",
        "topic": "", "zone": "", "snapshot_version": snapshot, "experiment": None,
        "arm": None, "outranked_by": None,
    }  # fmt: skip
    assert (b["reason"], b["rule_id"]) == ("daily_cap", rule)
    assert datetime.fromisoformat(a["at"]) == datetime.fromtimestamp(NOW, tz=UTC)
    assert sent["decision"] == a["id"] and sent["id"] == f"{a['id'].replace('d', 'o')}.sent"
    assert (failed["decision"], failed["user_id"], failed["campaign"]) == (c["id"], 9, "spring")


@pytest.mark.postgres
def test_a_reader_resumes_where_it_stopped_and_a_repeat_has_the_same_ids(snapshot):
    ledger_drain_all()
    for k in range(5):
        gate_check(
            channel="push", requests=[(u, f"m{k}.{u}") for u in range(20, 30)], now=instant(NOW + k)
        )
        ledger_drain_all()
    whole, end = everything()
    assert len(whole) == 50
    assert [e["message_id"] for e in whole] == [
        f"m{k}.{u}" for k in range(5) for u in range(20, 30)
    ]
    # Read 7 at a time, each page from the last one's `next`: the same events, none twice.
    paged, paged_end = everything(limit=7)
    assert [e["id"] for e in paged] == [e["id"] for e in whole]
    assert paged_end == end == stream_end()
    # From a page's position, the same events again (a consumer that lost what it read).
    page = stream_read(START, 12)
    again = stream_read(page.next, 5)
    assert [e["id"] for e in again.events] == [e["id"] for e in whole[12:17]]
    assert position_from_text(str(page.next)) == page.next
    # At the end: nothing, and the position stays.
    last = stream_read(end, 10)
    assert (last.events, last.next, last.more) == ([], end, False)
    gate_check(channel="push", requests=[(31, "later")], now=instant(NOW + 9))
    ledger_drain_all()
    assert [e["message_id"] for e in stream_read(end, 10).events] == ["later"]
    assert stream_read(position_from_text("end"), 10).events == []


@pytest.mark.postgres
def test_suppression_and_preference_changes_after_the_first_drain_are_streamed(
    snapshot, live_server
):
    suppress(channel="sms", user_ids=[3], reason="complained", source="test")  # before: not in
    ledger_drain_all()
    start = stream_end()
    suppress(channel="all", user_ids=[4, 5], reason="unsubscribed", source="api")
    unsuppress(channel="all", user_ids=[4], source="admin")
    session = token_session(live_server.url, make_user("cs", "limits.change_preference"))
    put = call(session, "PUT", "/api/v1/users/6/preferences/", json={"channels": {"push": False}})
    assert put.status_code == 200, put.text
    ledger_drain_all()
    events, _ = everything(start)
    assert [(e["type"], e["user_id"], e.get("action")) for e in events] == [
        ("suppression", 4, "added"),
        ("suppression", 5, "added"),
        ("suppression", 4, "removed"),
        ("preferences", 6, None),
    ]
    assert events[0]["channel"] == "all" and events[0]["reason"] == "unsubscribed"
    assert events[3]["preferences"]["channels"] == {"push": False}
    assert events[3]["source"] == "api"
    assert [e["type"] for e in everything()[0]] == [e["type"] for e in events]  # none before


@pytest.mark.postgres
def test_filters_keep_the_events_asked_for(snapshot):
    ledger_drain_all()
    gate_check(channel="email", requests=[(9, "e1")], campaign="spring", now=instant(NOW))
    gate_check(channel="push", requests=[(9, "p1")], campaign="autumn", now=instant(NOW))
    suppress(channel="all", user_ids=[8], reason="unsubscribed", source="api")
    suppress(channel="push", user_ids=[7], reason="unsubscribed", source="api")
    ledger_drain_all()

    def ids(**wanted):
        filters = Filters(**{k: frozenset(v) for k, v in wanted.items()})
        return [e.get("message_id") or f"{e['type']}:{e['user_id']}" for e in everything(
            filters=filters)[0]]  # fmt: skip

    assert ids() == ["e1", "p1", "suppression:8", "suppression:7"]
    assert ids(types={"decision"}) == ["e1", "p1"]
    assert ids(types={"suppression"}) == ["suppression:8", "suppression:7"]
    assert ids(channels={"email"}) == ["e1", "suppression:8"]  # `all` concerns email too
    assert ids(campaigns={"autumn"}) == ["p1"]
    assert ids(channels={"email"}, campaigns={"autumn"}) == []


@pytest.mark.postgres
def test_a_reader_filtering_out_a_long_run_still_moves_on(snapshot, monkeypatch):
    from limits.stream import events

    monkeypatch.setattr(events, "LOOK_MAX", 30)
    ledger_drain_all()
    gate_check(channel="push", requests=[(u, f"p{u}") for u in range(100, 200)], now=instant(NOW))
    gate_check(channel="email", requests=[(300, "wanted")], now=instant(NOW))
    ledger_drain_all()
    page = stream_read(START, 10, Filters(channels=frozenset({"email"})))
    assert (page.events, page.more) == ([], True)  # looked at 30, kept none: asks again
    events_found, _ = everything(filters=Filters(channels=frozenset({"email"})))
    assert [e["message_id"] for e in events_found] == ["wanted"]
    assert LOOK_MAX >= 10_000


@pytest.mark.postgres
def test_a_send_given_back_streams_released(snapshot):
    ledger_drain_all()
    gate_check(channel="email", requests=[(9, "back")])
    ledger_drain_all()
    assert gate_release(channel="email", requests=[(9, "back")]) == [True]
    ledger_drain()
    events, _ = everything()
    assert [(e["type"], e.get("outcome")) for e in events] == [
        ("decision", None),
        ("outcome", "released"),
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_erased_persons_events_are_gone_and_others_stay(snapshot):
    ledger_drain_all()
    gate_check(channel="email", requests=[(9, "gone"), (2, "kept")], now=instant(NOW))
    gate_outcomes(channel="email", since=instant(NOW - 1), outcomes=[(9, "gone", "sent")])
    suppress(channel="sms", user_ids=[9, 2], reason="complained", source="test")
    ledger_drain_all()
    erasure = erasure_start(user_ids=[9], via="api")
    erasure_run(erasure.pk)
    erasure_run(erasure.pk, now=timezone.now() + timedelta(seconds=31))
    events, _ = everything()
    assert {e["user_id"] for e in events} == {2}
    assert [e["type"] for e in events] == ["decision", "suppression"]


@pytest.mark.postgres
def test_the_upkeep_forgets_batches_as_old_as_the_rows_it_drops(snapshot, settings):
    ledger_drain_all()
    gate_check(channel="email", requests=[(9, "x")], now=instant(NOW))
    ledger_drain_all()
    assert StreamBatch.objects.filter(source=StreamBatch.Source.DECISIONS).count() == 1
    later = datetime.now(UTC) + timedelta(days=int(settings.GATEKEEPER_LEDGER_DAYS) + 2)
    ledger_upkeep(now=later)
    assert not StreamBatch.objects.exists()


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("after=x", "after", "not a position the stream gave"),
        ("after=1.2.3", "after", "not a position"),
        ("after=-1.0", "after", "not a position"),
        ("limit=0", "limit", "limit"),
        ("limit=10001", "limit", "limit"),
        ("type=click", "type", "not an event type"),
        ("channel=fax", "channel", "fax"),
        ("campaign=" + "c" * 300, "campaign", "200 characters"),
    ],
)
def test_bad_input_gets_a_400_naming_it(live_server, query, field, words):
    session = token_session(live_server.url, make_user("loader", "limits.read_stream"))
    response = call(session, "GET", f"/api/v1/stream/?{query}")
    assert response.status_code == 400, response.text
    assert words in response.json()[field][0]


@pytest.mark.postgres
def test_over_rest_with_the_right_and_not_without(snapshot, live_server):
    ledger_drain_all()
    gate_check(channel="email", requests=[(9, "r1"), (9, "r2")], now=instant(NOW))
    ledger_drain_all()
    loader = token_session(live_server.url, make_user("loader", "limits.read_stream"))
    first = call(loader, "GET", "/api/v1/stream/?limit=1").json()
    assert [e["message_id"] for e in first["events"]] == ["r1"] and first["more"] is True
    rest = call(loader, "GET", f"/api/v1/stream/?after={first['next']}").json()
    assert [e["message_id"] for e in rest["events"]] == ["r2"] and rest["more"] is False
    viewer = token_session(live_server.url, make_user("viewer", "limits.view_cap"))
    assert call(viewer, "GET", "/api/v1/stream/").status_code == 403


@pytest.mark.postgres
def test_events_are_valid_json_whatever_the_campaign_and_message_hold(snapshot):
    ledger_drain_all()
    campaign = 'say "hi" \\ \u00e9\u6f22 \t'
    gate_check(
        channel="email",
        requests=[(9, f"{campaign}:9"), (2, 'own "id" \\n')],
        campaign=campaign,
        now=instant(NOW),
    )
    gate_outcomes(channel="email", since=instant(NOW - 1), outcomes=[(9, f"{campaign}:9", "sent")])
    ledger_drain_all()
    events, _ = everything()
    assert [(e["type"], e["campaign"], e["message_id"]) for e in events] == [
        ("decision", campaign, f"{campaign}:9"),
        ("decision", campaign, 'own "id" \\n'),
        ("outcome", campaign, f"{campaign}:9"),
    ]
