"""Backtests (worker/backtest.py): the ledger's requests replayed under the policy in force
reproduce the ledger's decisions, and under a draft they give what the real gate gives when the
draft is saved and the same requests are made again."""

from collections import Counter
from datetime import date, timedelta
from typing import Any

import msgspec
import pytest

from limits.engine.quiet import QuietFields
from limits.ledger.drain import ledger_drain_all
from limits.models.policy import Rule
from limits.policy.bodies import DraftBody
from limits.policy.drafts import draft_applied
from limits.policy.rules import rule_fields_of_json
from limits.policy.selectors import policy_cache, policy_read
from limits.policy.services import QUIET_HOURS, RULES, cap_set
from segments.models import Segment
from tests.support.backtests import DAY, DAYS, START, counted, made, recent_start, traffic
from worker.backtest import backtest_part

pytestmark = pytest.mark.django_db(transaction=True)

DRAFT: dict[str, Any] = {
    "rules": [
        {"op": "change", "id": None, "limit": 2},  # one push a day -> two
        {"op": "delete", "id": None},  # promos
        {
            "op": "add",
            "name": "two sms a day",
            "segment": None,
            "channel": "sms",
            "window": {"kind": "calendar", "unit": "day"},
            "limit": 2,
        },
    ],
    "quiet_hours": [
        {"op": "add", "segment": "vip", "channel": "push", "start": "21:00", "end": "09:00"}
    ],
    "caps": [{"segment": "vip", "channel": "email", "daily": 1, "weekly": 3}],
}


@pytest.mark.postgres
@pytest.mark.parametrize("seed", range(1, 7))
def test_the_policy_in_force_reproduces_the_ledger_and_a_draft_what_the_gate_would_do(
    policy, redis_client, seed
):
    calls = traffic(seed)
    start_at = START + 2 * DAY
    made(calls)
    assert ledger_drain_all() > 100
    first = date(1970, 1, 1) + timedelta(seconds=start_at)
    last = first + timedelta(days=DAYS - 3)
    push, promos = (Rule.objects.get(name=n).pk for n in ("one push a day, their day", "promos"))
    body = {**DRAFT, "rules": [dict(r) for r in DRAFT["rules"]]}
    body["rules"][0]["id"], body["rules"][1]["id"] = push, promos
    draft = draft_applied(msgspec.convert(body, DraftBody))

    result = backtest_part(start=first, end=last, in_force=policy_read(), draft=draft.table)

    asked = [c for c in calls if start_at <= c["at"] < start_at + (DAYS - 2) * DAY]
    assert result.decisions == sum(len(c["requests"]) for c in asked)
    assert (result.differences, result.examples) == (0, []), result.examples
    # The draft, saved, and the same requests made again through the gate from clean logs.
    redis_client.flushdb()
    made(calls, until=start_at)
    cap_set(segment=Segment.objects.get(slug="vip"), channel="email", daily=1, weekly=3)
    RULES.update(row=Rule.objects.get(pk=push), changes={"limit": 2})
    RULES.delete(row=Rule.objects.get(pk=promos))
    RULES.create(fields=rule_fields_of_json(body["rules"][2]))
    QUIET_HOURS.create(
        fields=QuietFields(
            segment="vip", channel="push", start="21:00", end="09:00", spread_minutes=0
        )
    )
    policy_cache().invalidate()
    under_draft = Counter(made(calls, since=start_at))
    modelled = counted(result, "draft")
    assert modelled == under_draft, (modelled - under_draft, under_draft - modelled)
    assert counted(result, "in_force") != under_draft  # the draft changed something
    gained = sum(e["gained"] for e in result.groups.values())
    lost = sum(e["lost"] for e in result.groups.values())
    assert gained and lost


@pytest.mark.postgres
def test_a_marketer_runs_a_backtest_over_rest_and_reads_it_as_json_and_csv(
    api, policy, redis_client
):
    from tests.support import broker
    from tests.support.api import call
    from worker.backtest import backtest_part_run

    start = recent_start()
    calls = traffic(3)
    for c in calls:
        c["at"] += start - START
    made(calls)
    ledger_drain_all()
    broker.clear("sends")
    day = lambda k: (date(1970, 1, 1) + timedelta(seconds=start + k * DAY)).isoformat()  # noqa: E731
    body = {
        "from": day(2),
        "to": day(4),
        "changes": {"caps": [{"segment": "vip", "channel": "email", "daily": 0, "weekly": 0}]},
    }
    assert call(api("viewer"), "POST", "/api/v1/backtests/", json=body).status_code == 403
    created = call(api("marketer"), "POST", "/api/v1/backtests/", json=body)
    assert created.status_code == 202, created.text
    shown = created.json()
    assert created.headers["Location"] == shown["url"]
    assert (shown["status"], shown["from"], shown["to"], shown["result"]) == (
        "queued", day(2), day(4), None,
    )  # fmt: skip
    assert shown["progress"]["expected"] == sum(
        len(c["requests"]) for c in calls if start + 2 * DAY <= c["at"] < start + 5 * DAY
    )
    queued = broker.queued("sends")
    assert sorted(args for _, args in queued) == [[shown["id"], k] for k in range(shown["parts"])]
    for task, (backtest_id, index) in queued:
        assert task == "worker.tasks.backtest_part"
        assert backtest_part_run(backtest_id=backtest_id, index=index)
        assert not backtest_part_run(backtest_id=backtest_id, index=index)  # done once
    done = call(api("viewer"), "GET", f"/api/v1/backtests/{shown['id']}/").json()
    assert done["status"] == "done"
    assert done["progress"] == {
        "decisions": shown["progress"]["expected"],
        "expected": shown["progress"]["expected"],
        "fraction": 1.0,
    }
    result = done["result"]
    assert result["reproduced"]["differences"] == 0
    vip_email = [r for r in result["rows"] if (r["segment"], r["channel"]) == ("vip", "email")]
    assert vip_email and all(r["draft"].get("allowed", 0) == 0 for r in vip_email)
    lost = sum(r["lost"] for r in vip_email)
    assert lost == sum(r["in_force"].get("allowed", 0) for r in vip_email) > 0
    assert result["totals"]["lost"] == lost and result["totals"]["gained"] == 0
    blocked = [r for r in result["rules"] if r["lost"]]
    assert {r["name"] for r in blocked} == {"Vip: daily cap on email"}
    csv = call(api("viewer"), "GET", f"/api/v1/backtests/{shown['id']}/?format=csv")
    assert csv.status_code == 200 and csv.headers["Content-Type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert lines[0].startswith("day,segment,channel,campaign,gained,lost,users_affected,")
    assert len(lines) == 1 + len(result["rows"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"from": "2020-01-01"}, "from"),
        ({"to": "2099-01-01"}, "to"),
        ({"from": "today+0", "to": "today-1"}, "to"),
        ({"changes": {"rules": [{"op": "change", "id": 999999, "limit": 1}]}}, "changes.rules[0].id"),
        ({"changes": {"rules": [{"op": "change", "id": "promos", "limit": -1}]}}, "changes.rules[0].limit"),
        ({"changes": {"rules": [{"op": "change", "id": "promos", "match": "tag", "tag": ""}]}}, "changes.rules[0].tag"),
        ({"changes": {"rules": [{"op": "add", "name": "x", "segment": "nope", "channel": "email",
                                 "window": {"kind": "rolling", "seconds": 3600}, "limit": 1}]}},
         "changes.rules[0].segment"),
        ({"changes": {"rules": [{"op": "delete", "id": "classic"}]}}, "changes.rules[0].id"),
        ({"changes": {"rules": [{"op": "rename", "id": 1}]}}, "changes.rules[0].op"),
        ({"changes": {"quiet_hours": [{"op": "add", "channel": "email", "start": "09:00",
                                       "end": "09:00"}]}}, "changes.quiet_hours[0].end"),
        ({"changes": {"caps": [{"segment": "nope", "channel": "email", "daily": 1, "weekly": 2}]}},
         "changes.caps[0].segment"),
        ({"changes": {"caps": [{"segment": "vip", "channel": "fax", "daily": 1, "weekly": 2}]}},
         "changes.caps[0].channel"),
        ({"changes": {"caps": [{"segment": "vip", "channel": "email", "daily": -1, "weekly": 2}]}},
         "changes.caps[0].daily"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field_and_makes_nothing(api, policy, change, field):
    from tests.support.api import call
    from worker.models import Backtest

    start = recent_start()
    day = lambda k: (date(1970, 1, 1) + timedelta(seconds=start + k * DAY)).isoformat()  # noqa: E731
    body = {"from": day(1), "to": day(3), **change}
    if body["from"] == "today+0":
        body["from"], body["to"] = day(6), day(5)
    ids = {
        "promos": Rule.objects.get(name="promos").pk,
        "classic": Rule.objects.filter(cap__isnull=False).first().pk,
    }
    for rule in body.get("changes", {}).get("rules", []):
        if "id" in rule:
            rule["id"] = ids.get(rule["id"], rule["id"])
    answer = call(api("marketer"), "POST", "/api/v1/backtests/", json=body)
    assert answer.status_code == 400, answer.text
    assert field in answer.json(), answer.json()
    assert not Backtest.objects.exists()


def test_a_period_the_ledger_only_partly_holds_says_so(policy, redis_client):
    from worker.services import backtest_create

    start = recent_start()
    made([{**c, "at": c["at"] + start - START} for c in traffic(4)])
    ledger_drain_all()
    first = date(1970, 1, 1) + timedelta(seconds=start)
    backtest = backtest_create(start=first - timedelta(days=2), end=first, changes=DraftBody())
    assert f"holds decisions from {first} on" in backtest.partial
    later = backtest_create(
        start=first + timedelta(days=1), end=first + timedelta(days=2), changes=DraftBody()
    )
    assert "in the first days the replay may admit sends the gate refused" in later.partial
    today = backtest_create(
        start=first + timedelta(days=6), end=first + timedelta(days=6), changes=DraftBody()
    )
    assert "is not over" in today.partial
