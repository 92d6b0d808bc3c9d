"""The user lookup's timeline: the user's decisions from the send ledger, newest first, with the
deciding rule linked and an "older" pager; decisions made through the real gate and drained."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from limits.ledger.drain import ledger_drain_all
from limits.models.ledger import LedgerEntry
from limits.models.policy import Rule
from limits.policy.rules import RuleFields
from limits.policy.services import RULES
from worker.gate import gate_check

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)


@pytest.fixture
def vip(published, redis_client):
    return published(vip=(10, [1, 2, 3], {"email": (1, None)}))


def text(response) -> str:
    assert response.status_code == 200
    return re.sub(r"\s+", " ", response.content.decode())


def lookup(client, user_id, **params) -> str:
    return text(client.get(reverse("admin:user_lookup"), {"user_id": str(user_id), **params}))


def rows(page: str) -> list[str]:
    table = re.search(r'<table class="gk-table" id="decisions">(.*?)</table>', page)
    assert table is not None, "no timeline"
    return re.findall(r"<tr><td>(.*?)</tr>", table.group(1))


@pytest.mark.postgres
def test_the_timeline_shows_each_decision_and_links_its_rule(marketer_client, vip):
    gate_check(channel="email", requests=[(1, "a"), (1, "b")], campaign="spring", now=NOW)
    gate_check(channel="push", requests=[(1, "p")], now=NOW + timedelta(seconds=90))
    gate_check(channel="email", requests=[(2, "not theirs")], now=NOW + timedelta(seconds=100))
    ledger_drain_all()
    LedgerEntry.objects.filter(message_id="p").update(outcome="sent")  # as the worker would
    daily = Rule.objects.get(name="Vip: daily cap on email")

    page = lookup(marketer_client, 1)
    push, capped, allowed = rows(page)
    assert "2026-11-24 12:01:30" in push and "<td>push</td>" in push
    assert '<span class="gk-badge gk-ok">allowed</span>' in push and "<td>sent</td>" in push
    assert "2026-11-24 12:00:00" in capped and "<td>spring</td>" in capped
    assert '<span class="gk-badge gk-warn">daily_cap</span>' in capped
    link = reverse("admin:limits_rule_change", args=[daily.pk])
    assert f'<a href="{link}">Vip: daily cap on email</a>' in capped
    assert "Vip users: at most 1 email in any 24 hours" in capped
    assert "<code>b</code>" in capped and "<code>a</code>" in allowed
    assert "not theirs" not in page
    assert 'id="timeline-older"' not in page and 'id="timeline-newest"' not in page


@pytest.mark.postgres
def test_older_decisions_are_a_page_away(marketer_client, vip):
    for k in range(3):
        gate_check(
            channel="push",
            requests=[(1, f"m{k}-{j}") for j in range(40)],
            now=NOW + timedelta(seconds=k),
        )
    ledger_drain_all()
    expected = [f"m{k}-{j}" for k in reversed(range(3)) for j in reversed(range(40))]
    seen, page, pages = [], lookup(marketer_client, 1), 1
    while True:
        seen += [re.search(r"<code>(.*?)</code>", row).group(1) for row in rows(page)]
        older = re.search(r'<a href="([^"]+)" id="timeline-older">', page)
        if older is None:
            break
        assert len(rows(page)) == 50
        page, pages = text(marketer_client.get(older.group(1).replace("&amp;", "&"))), pages + 1
        assert 'id="timeline-newest"' in page
    assert (seen, pages) == (expected, 3)


def test_the_page_works_with_no_decisions_and_without_a_snapshot(marketer_client, db):
    page = lookup(marketer_client, 42)
    assert "No segment snapshot is loaded" in page  # the quota cannot be read...
    assert "Decisions for user 42, newest first" in page  # ...the ledger still can
    assert "No decisions in the ledger for this user." in page


def test_the_timeline_says_when_the_ledger_is_off(marketer_client, db, settings):
    settings.GATEKEEPER_LEDGER = False
    assert "The send ledger is switched off" in lookup(marketer_client, 42)


def test_a_bad_position_shows_the_newest(marketer_client, vip):
    gate_check(channel="push", requests=[(1, "a")], now=NOW)
    ledger_drain_all()
    page = lookup(marketer_client, 1, before="yesterday")
    assert "Not a page position." in page and "The newest decisions are shown." in page
    assert len(rows(page)) == 1


def test_a_deleted_rule_keeps_its_number_and_a_reader_without_rules_gets_no_link(
    client, staff, vip
):
    rule = RULES.create(
        fields=RuleFields(
            name="1 push a day", segment=None, channel="push", match="any", tag="",
            window_kind="rolling", window_seconds=86_400, window_unit="", limit=1,
            reserve_below_priority=None, reserve_slots=None,
        ),
        via="command",
    )  # fmt: skip
    gate_check(channel="push", requests=[(1, "a"), (1, "b")], now=NOW)
    gate_check(channel="email", requests=[(1, "c"), (1, "d")], now=NOW + timedelta(seconds=1))
    ledger_drain_all()
    rule_id = rule.pk
    RULES.delete(row=rule, via="command")
    reader = staff("rita")
    reader.user_permissions.add(Permission.objects.get(codename="view_cap"))
    client.login(username="rita", password="a-long-test-password")
    capped_email, _, capped_push, _ = rows(lookup(client, 1))
    assert "Vip: daily cap on email" in capped_email and "<a href" not in capped_email
    assert f'rule #{rule_id} <span class="gk-help">(deleted)</span>' in capped_push
