"""A user's decision history over HTTP: decisions made through the real gate, drained into the
ledger (SQLite, and PostgreSQL's day partitions), read back newest first, a page at a time."""

from datetime import UTC, datetime, timedelta

import pytest

from limits.ledger.drain import ledger_drain_all
from limits.models.ledger import LedgerEntry
from limits.models.policy import Rule
from limits.policy.rules import RuleFields
from limits.policy.services import RULES
from tests.support.api import call
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)
DAY1 = datetime(2026, 11, 23, tzinfo=UTC)
HOUR = timedelta(hours=1)


def history(session, user_id, **params):
    response = call(session, "GET", f"/api/v1/users/{user_id}/history/", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def messages(page) -> list[str]:
    return [d["message_id"] for d in page["results"]]


def every_page(session, user_id, **params) -> tuple[list[str], int]:
    """Every message id, following `next` to the end, and how many pages it took."""
    page = history(session, user_id, **params)
    seen, pages = messages(page), 1
    while page["next"] is not None:
        response = session.get(page["next"], timeout=30)
        assert response.status_code == 200, response.text
        page = response.json()
        seen, pages = seen + messages(page), pages + 1
    return seen, pages


@pytest.mark.postgres
def test_decisions_come_newest_first_with_what_decided_them(api, snapshot):
    gate_check(channel="email", requests=[(1, "a"), (1, "b"), (1, "c")], now=NOW)
    gate_check(
        channel="push",
        requests=[(1, "p")],
        campaign="spring",
        tags=("promo", "news"),
        priority=7,
        now=NOW + timedelta(seconds=60),
    )
    gate_check(
        channel="email",
        requests=[(1, "otp")],
        category="transactional",
        now=NOW + timedelta(seconds=120),
    )
    gate_check(channel="email", requests=[(2, "someone else's")], now=NOW + timedelta(seconds=180))
    gate_check(
        channel="email", requests=[(1, "dry")], dry_run=True, now=NOW + timedelta(seconds=240)
    )
    ledger_drain_all()
    LedgerEntry.objects.filter(message_id="p").update(outcome="sent")  # as the worker would

    page = history(api("viewer"), 1)
    assert page["user_id"] == 1 and page["next"] is None
    # One gate call, one instant: its decisions newest first by their order in the call.
    assert [(d["message_id"], d["reason"]) for d in page["results"]] == [
        ("otp", "exempt"),
        ("p", "allowed"),
        ("c", "daily_cap"),
        ("b", "allowed"),
        ("a", "allowed"),
    ]
    otp, push, capped = page["results"][:3]
    assert push == {
        "at": "2026-11-24T12:01:00.000Z",
        "channel": "push",
        "campaign": "spring",
        "category": "marketing",
        "tags": ["promo", "news"],
        "priority": 7,
        "topic": None,
        "zone": None,
        "segment": "vip",
        "snapshot_version": snapshot,
        "reason": "allowed",
        "rule": None,
        "message_id": "p",
        "outcome": "sent",
        "experiment": None,
        "outranked_by": None,
    }
    assert (otp["category"], otp["outcome"], otp["rule"]) == ("transactional", None, None)
    # The deciding rule as the rules endpoint describes it.
    rule_id = capped["rule"]["id"]
    described = call(api("viewer"), "GET", f"/api/v1/rules/{rule_id}/").json()
    assert capped["rule"] == {
        "id": rule_id,
        "name": "VIP: daily cap on email",
        "description": described["description"],
        "classic": True,
    }
    assert capped["at"] == "2026-11-24T12:00:00.000Z"


def test_a_user_without_decisions_has_an_empty_history(api, snapshot):
    assert history(api("viewer"), 12345) == {"user_id": 12345, "results": [], "next": None}


def test_a_deleted_rule_is_still_named_by_its_id(api, snapshot):
    rule = RULES.create(
        fields=RuleFields(
            name="1 push a day",
            segment=None,
            channel="push",
            match="any",
            tag="",
            window_kind="rolling",
            window_seconds=86_400,
            window_unit="",
            limit=1,
            reserve_below_priority=None,
            reserve_slots=None,
        ),
        via="command",
    )
    gate_check(channel="push", requests=[(7, "first"), (7, "second")], now=NOW)
    ledger_drain_all()
    viewer = api("viewer")
    refused = history(viewer, 7)["results"][0]
    assert refused["reason"] == "daily_cap"
    assert refused["rule"] == {
        "id": rule.pk,
        "name": "1 push a day",
        "description": "Everyone: at most 1 push message in any 24 hours (at least 24 hours apart)",
        "classic": False,
    }
    RULES.delete(row=Rule.objects.get(pk=rule.pk), via="command")
    refused = history(viewer, 7)["results"][0]
    assert refused["rule"] == {"id": rule.pk, "name": None, "description": None, "classic": None}


@pytest.mark.postgres
@pytest.mark.parametrize("limit", [1, 4, 5, 12, 500])
def test_pages_follow_each_other_without_repeats_or_gaps(api, snapshot, limit):
    # Twelve decisions in six gate calls, many sharing their call's instant; another user's
    # decisions in between.
    expected: list[str] = []
    for k in range(6):
        requests = [(9, f"m{k}-{j}") for j in range(k % 3 + 1)]
        gate_check(
            channel="push", requests=[*requests, (8, f"x{k}")], now=NOW + timedelta(seconds=60 * k)
        )
        expected = [m for _, m in reversed(requests)] + expected
    ledger_drain_all()
    viewer = api("viewer")
    seen, pages = every_page(viewer, 9, limit=limit)
    assert seen == expected
    assert pages == max(1, -(-12 // limit))  # no empty last page

    # A decision made while a client pages neither repeats nor shifts what it reads.
    first = history(viewer, 9, limit=5)
    gate_check(channel="push", requests=[(9, "newer")], now=NOW + timedelta(seconds=3_600))
    ledger_drain_all()
    rest, _ = every_page(viewer, 9, before=first["next"].split("before=")[1], limit=5)
    assert messages(first) + rest == expected
    assert messages(history(viewer, 9, limit=1)) == ["newer"]


@pytest.mark.postgres
def test_the_default_page_is_50(api, snapshot):
    gate_check(channel="push", requests=[(9, f"m{i}") for i in range(60)], now=NOW)
    ledger_drain_all()
    viewer = api("viewer")
    page = history(viewer, 9)
    assert messages(page) == [f"m{i}" for i in reversed(range(10, 60))]
    assert "before=" in page["next"]
    rest = viewer.get(page["next"], timeout=30).json()
    assert messages(rest) == [f"m{i}" for i in reversed(range(10))] and rest["next"] is None


@pytest.fixture
def three_days(snapshot):
    """User 1 (vip: 2 emails a day, 3 messages): e1 and p1 on the 23rd, e2 and e3 (refused)
    the next morning, e4 (a receipt) on the 25th."""
    gate_check(
        channel="email",
        requests=[(1, "e1")],
        campaign="spring",
        tags=("promo",),
        now=DAY1 + 10 * HOUR,
    )
    gate_check(channel="push", requests=[(1, "p1")], campaign="spring", now=DAY1 + 11 * HOUR)
    gate_check(channel="email", requests=[(1, "e2"), (1, "e3")], now=DAY1 + 33 * HOUR)
    gate_check(
        channel="email", requests=[(1, "e4")], category="transactional", now=DAY1 + 56 * HOUR
    )
    assert ledger_drain_all() == 5


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, ["e4", "e3", "e2", "p1", "e1"]),
        ({"channel": "push"}, ["p1"]),
        ({"campaign": "spring"}, ["p1", "e1"]),
        ({"campaign": ""}, ["e4", "e3", "e2"]),  # no campaign
        ({"campaign": "summer"}, []),
        ({"reason": "daily_cap"}, ["e3"]),
        ({"reason": "exempt"}, ["e4"]),
        ({"channel": "email", "campaign": "spring"}, ["e1"]),
        # Days are UTC days, `to` included whole.
        ({"from": "2026-11-24"}, ["e4", "e3", "e2"]),
        ({"to": "2026-11-23"}, ["p1", "e1"]),
        ({"from": "2026-11-24", "to": "2026-11-24"}, ["e3", "e2"]),
        # Instants: `from` included, `to` not; any UTC offset.
        ({"from": "2026-11-23T10:30:00Z", "to": "2026-11-24T09:00:00Z"}, ["p1"]),
        ({"from": "2026-11-24T10:00:00+01:00"}, ["e4", "e3", "e2"]),
        (
            {"from": "2026-11-23T11:00:00.000Z", "to": "2026-11-24T09:00:00.001Z"},
            ["e3", "e2", "p1"],
        ),
        ({"to": "2026-11-23T10:00Z"}, []),
        ({"channel": "email", "reason": "allowed", "from": "2026-11-23"}, ["e2", "e1"]),
    ],
)
def test_each_filter(api, three_days, params, expected):
    assert messages(history(api("viewer"), 1, **params)) == expected


@pytest.mark.postgres
def test_the_next_page_keeps_the_filters(api, three_days):
    seen, pages = every_page(api("viewer"), 1, channel="email", limit=1)
    assert (seen, pages) == (["e4", "e3", "e2", "e1"], 4)
    seen, _ = every_page(api("viewer"), 1, to="2026-11-24", campaign="", limit=1)
    assert seen == ["e3", "e2"]


@pytest.mark.parametrize(
    ("path_id", "params", "field"),
    [
        ("abc", {}, "user_id"),
        ("-1", {}, "user_id"),
        ("4.0", {}, "user_id"),
        (str(2**32), {}, "user_id"),
        ("1", {"limit": "0"}, "limit"),
        ("1", {"limit": "501"}, "limit"),
        ("1", {"limit": "ten"}, "limit"),
        ("1", {"limit": ""}, "limit"),
        ("1", {"before": "yesterday"}, "before"),
        ("1", {"before": "1763800000000000"}, "before"),
        ("1", {"before": "1.2.3"}, "before"),
        ("1", {"channel": "fax"}, "channel"),
        ("1", {"channel": "all"}, "channel"),
        ("1", {"reason": "nope"}, "reason"),
        ("1", {"campaign": "c" * 201}, "campaign"),
        ("1", {"campaign": "a\x00b"}, "campaign"),
        ("1", {"from": "yesterday"}, "from"),
        ("1", {"from": "2026-13-01"}, "from"),
        ("1", {"from": "2026-02-30"}, "from"),
        ("1", {"from": "2026-11-24T08:00:00"}, "from"),  # no offset: which instant?
        ("1", {"to": "2026-11-24 08:00:00Z"}, "to"),
        ("1", {"to": "0001-01-01T00:00:00+01:00"}, "to"),
        ("1", {"from": "2026-11-24", "to": "2026-11-23"}, "to"),
        ("1", {"from": "2026-11-24T08:00:00Z", "to": "2026-11-24T08:00:00Z"}, "to"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, snapshot, path_id, params, field):
    response = call(api("viewer"), "GET", f"/api/v1/users/{path_id}/history/", params=params)
    assert response.status_code == 400, response.text
    assert list(response.json()) == [field], response.json()


@pytest.mark.postgres
def test_any_position_of_the_documented_form_is_taken(api, snapshot):
    gate_check(channel="push", requests=[(9, "a")], now=NOW)
    ledger_drain_all()
    viewer = api("viewer")
    beyond = "9" * 20 + "." + "9" * 20  # past the year 9999 and any id: the newest there is
    assert messages(history(viewer, 9, before=beyond)) == ["a"]
    assert messages(history(viewer, 9, before="0.0")) == []


def test_it_needs_the_quota_endpoints_right(api, snapshot):
    path = "/api/v1/users/1/history/"
    assert call(api("anonymous"), "GET", path).status_code == 401
    refused = call(api("nobody"), "GET", path)
    assert refused.status_code == 403
    assert "limits.view_cap" in refused.json()["detail"]
    for role in ("viewer", "gate", "marketer"):
        assert call(api(role), "GET", path).status_code == 200, role
