"""The admin's backtests: "Try this change on the last 30 days" on the rule, quiet-hours and
cap forms, the backtest's page (its progress, then a chart per day and the table) and "Save
this change", which keeps the result with the change."""

import pytest
from django.urls import reverse

from limits.ledger.drain import ledger_drain_all
from limits.models.policy import Rule, SettingChange
from segments.models import Segment
from tests.support.backtests import START, made, recent_start, traffic
from worker.backtest import backtest_part_run
from worker.models import Backtest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def history(policy, redis_client):
    start = recent_start()
    made([{**c, "at": c["at"] + start - START} for c in traffic(5)])
    ledger_drain_all()
    return start


def run(backtest: Backtest) -> None:
    for index in range(backtest.parts):
        backtest_part_run(backtest_id=backtest.pk, index=index)


def rule_form(rule: Rule, **changes) -> dict:
    data = {
        "name": rule.name, "enabled": "on", "segment": "", "channel": rule.channel,
        "match": rule.match, "tag": rule.tag, "window_kind": rule.window_kind,
        "window_seconds": "" if rule.window_seconds is None else str(rule.window_seconds),
        "window_unit": rule.window_unit, "limit": str(rule.limit),
        "reserve_below_priority": "", "reserve_slots": "",
    }  # fmt: skip
    return {**data, **changes}


def test_a_marketer_tries_a_rule_change_reads_its_result_and_saves_it_with_it(
    marketer_client, history
):
    push = Rule.objects.get(name="one push a day, their day")
    form = marketer_client.get(reverse("admin:limits_rule_change", args=[push.pk]))
    assert "Try this change on the last 30 days" in form.content.decode()
    tried = marketer_client.post(
        f"{reverse('admin:backtest_try', args=['rule'])}?id={push.pk}",
        rule_form(push, limit="0"),
    )
    backtest = Backtest.objects.get()
    assert tried.status_code == 302 and tried["Location"] == reverse(
        "admin:backtest", args=[backtest.pk]
    )
    assert backtest.changes["rules"][0]["op"] == "change"
    assert Rule.objects.get(pk=push.pk).limit == 1  # tried, not saved
    waiting = marketer_client.get(tried["Location"]).content.decode()
    assert 'http-equiv="refresh"' in waiting and 'id="backtest-progress"' in waiting
    assert "Change the rule &#x27;one push a day, their day&#x27;" in waiting
    run(backtest)
    backtest.refresh_from_db()
    page = marketer_client.get(tried["Location"]).content.decode()
    assert 'http-equiv="refresh"' not in page
    assert backtest.result is not None
    lost = backtest.result["totals"]["lost"]
    assert lost > 0 and f"{lost} fewer" in page
    assert "every decision is the one the gate made then" in page
    assert 'id="chart-days"' in page and 'id="backtest-days"' in page
    assert 'id="backtest-save"' in page
    saved = marketer_client.post(reverse("admin:backtest_save", args=[backtest.pk]))
    assert saved.status_code == 302
    assert Rule.objects.get(pk=push.pk).limit == 0
    backtest.refresh_from_db()
    change = SettingChange.objects.get(pk=backtest.saved_as_id)
    assert (change.kind, change.object_id, change.via) == ("rule", push.pk, "admin")
    again = marketer_client.get(reverse("admin:backtest", args=[backtest.pk])).content.decode()
    assert 'id="backtest-saved"' in again and 'id="backtest-save"' not in again
    listing = marketer_client.get(reverse("admin:backtests")).content.decode()
    assert reverse("admin:backtest", args=[backtest.pk]) in listing


def test_a_change_tried_before_someone_else_changed_the_settings_is_not_saved(
    marketer_client, history
):
    push = Rule.objects.get(name="one push a day, their day")
    marketer_client.post(
        f"{reverse('admin:backtest_try', args=['rule'])}?id={push.pk}", rule_form(push, limit="3")
    )
    backtest = Backtest.objects.get()
    run(backtest)
    from limits.policy.services import RULES

    RULES.update(row=Rule.objects.get(name="promos"), changes={"limit": 5})
    page = marketer_client.get(reverse("admin:backtest", args=[backtest.pk])).content.decode()
    assert 'id="backtest-stale"' in page and 'id="backtest-save"' not in page
    marketer_client.post(reverse("admin:backtest_save", args=[backtest.pk]))
    assert Rule.objects.get(pk=push.pk).limit == 1


def test_a_bad_change_is_not_tried_and_says_why(marketer_client, history):
    push = Rule.objects.get(name="one push a day, their day")
    answer = marketer_client.post(
        f"{reverse('admin:backtest_try', args=['rule'])}?id={push.pk}", rule_form(push, limit="-1")
    )
    assert answer.status_code == 400
    assert "not a whole number" in answer.content.decode()
    assert not Backtest.objects.exists()


def test_caps_and_quiet_hours_are_tried_from_their_forms(marketer_client, history):
    vip = Segment.objects.get(slug="vip")
    grid = marketer_client.get(reverse("admin:cap_grid", args=[vip.pk])).content.decode()
    assert "Try this change on the last 30 days" in grid
    marketer_client.post(
        f"{reverse('admin:backtest_try', args=['caps'])}?id={vip.pk}",
        {"email-daily": "0", "email-weekly": "5", "all-daily": "", "all-weekly": ""},
    )
    caps = Backtest.objects.get()
    assert caps.changes["caps"] == [{"segment": "vip", "channel": "email", "daily": 0, "weekly": 5}]
    run(caps)
    caps.refresh_from_db()
    assert caps.result is not None and caps.result["totals"]["lost"] > 0
    quiet = marketer_client.get(reverse("admin:limits_quiethours_add")).content.decode()
    assert "Try this change on the last 30 days" in quiet
    marketer_client.post(
        reverse("admin:backtest_try", args=["quiet"]),
        {"segment": "", "channel": "push", "start": "00:00", "end": "23:00",
         "spread_minutes": "0", "enabled": "on"},
    )  # fmt: skip
    held = Backtest.objects.exclude(pk=caps.pk).get()
    run(held)
    held.refresh_from_db()
    assert held.result is not None
    assert held.result["totals"]["draft"].get("quiet_hours", 0) > held.result["totals"][
        "in_force"
    ].get("quiet_hours", 0)


def test_a_viewer_reads_a_backtest_but_neither_tries_nor_saves(
    marketer_client, viewer_client, history
):
    push = Rule.objects.get(name="one push a day, their day")
    denied = viewer_client.post(
        f"{reverse('admin:backtest_try', args=['rule'])}?id={push.pk}", rule_form(push, limit="0")
    )
    assert denied.status_code == 403 and not Backtest.objects.exists()
    form = viewer_client.get(reverse("admin:limits_rule_change", args=[push.pk])).content.decode()
    assert "Try this change" not in form
