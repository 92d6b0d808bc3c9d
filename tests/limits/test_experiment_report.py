"""Outcome events and the experiments report, end to end over REST: the gate's decisions bring
users into the experiment's arms (through the ledger's drain), the company posts events (each
id counted once, only for users in a running study, whether the drain wrote the users before or
after the events were posted), unsubscribes come from the suppression list; the report gives
per arm the users and per-user figures that a count by hand gives, the lift against the first
arm, CSV, and the control group's report against its treatment sample. Bad input is a 400
naming it and counts nothing."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from limits.engine.assignment import arms_of
from limits.ledger.drain import ledger_drain_all
from limits.models.studies import EventSeen, StudyDay, StudyEvent, StudyMember
from limits.policy.selectors import policy_cache
from tests.support.api import call
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

USERS = list(range(1, 401))
DAY = {"kind": "rolling", "seconds": 86_400}


@pytest.fixture
def experiment(api, published):
    """An experiment on VIP (USERS): arm "one" 1 email a day, arm "three" 3, half each."""
    published(vip=(10, USERS, {}))
    body = {
        "name": "1 or 3 a day",
        "segment": "vip",
        "salt": "report-1",
        "ends_at": (datetime.now(UTC) + timedelta(days=10)).isoformat(),
        "arms": [
            {"name": "one", "share": 0.5, "rules": [{"name": "1", "channel": "email",
                                                      "window": DAY, "limit": 1}]},
            {"name": "three", "share": 0.5, "rules": [{"name": "3", "channel": "email",
                                                        "window": DAY, "limit": 3}]},
        ],
    }  # fmt: skip
    made = call(api("marketer"), "POST", "/api/v1/experiments/", json=body)
    assert made.status_code == 201, made.text
    policy_cache().invalidate()
    return made.json()


@pytest.fixture
def deciding(experiment):
    """`experiment`, every user sent 3 emails, so arm "one" gets 1 each and "three" 3 each; not
    drained yet."""
    for n in range(3):
        gate_check(channel="email", requests=[(u, f"r{n}-{u}") for u in USERS])
    return experiment


@pytest.fixture
def running(deciding):
    """`deciding`, drained: its users are in the arms."""
    ledger_drain_all()
    return deciding


def places() -> np.ndarray:
    return arms_of(np.array(USERS), "report-1", [0.5, 0.5])


@pytest.mark.postgres
def test_the_drain_brings_users_in_once_with_their_sends(running):
    assert StudyMember.objects.filter(study=running["id"]).count() == len(USERS)
    per_arm = {
        arm: (sum(d.entered for d in StudyDay.objects.filter(study=running["id"], arm=arm)),
              sum(d.sends for d in StudyDay.objects.filter(study=running["id"], arm=arm)))
        for arm in (0, 1)
    }  # fmt: skip
    one, three = int((places() == 0).sum()), int((places() == 1).sum())
    assert per_arm == {0: (one, one * 1), 1: (three, three * 3)}
    # Drained again (a later decision) a member is not counted twice.
    gate_check(channel="email", requests=[(USERS[0], "later")])
    ledger_drain_all()
    entered = sum(d.entered for d in StudyDay.objects.filter(study=running["id"]))
    assert entered == len(USERS)


@pytest.mark.postgres
def test_events_count_once_for_members_and_the_report_reads_them(api, running):
    gate = api("gate")
    now = datetime.now(UTC).isoformat()
    buyers = USERS[:100]
    events = [{"event_id": f"o{u}", "user_id": u, "name": "order", "at": now, "value": 10.0}
              for u in buyers]  # fmt: skip
    events += [{"event_id": "o1", "user_id": 1, "name": "order", "at": now, "value": 10.0},
               {"event_id": "stranger", "user_id": 99_999, "name": "order", "at": now}]  # fmt: skip
    posted = call(gate, "POST", "/api/v1/events/", json={"events": events})
    assert posted.status_code == 202, posted.text
    assert posted.json() == {"accepted": 101, "repeated": 1}
    assert ledger_drain_all() == 0  # no decision: the events alone
    again = call(gate, "POST", "/api/v1/events/", json={"events": events[:5]})
    assert again.json() == {"accepted": 0, "repeated": 5}
    ledger_drain_all()
    assert sum(e.count for e in StudyEvent.objects.all()) == 100
    # Two unsubscribe, in arm "three"'s users.
    leaving = [u for u, p in zip(USERS, places().tolist(), strict=True) if p == 1][:2]
    call(gate, "POST", "/api/v1/suppressions/",
         json={"channel": "email", "user_ids": leaving, "reason": "unsubscribed"})  # fmt: skip

    report = call(api("viewer"), "GET", f"/api/v1/reports/experiments/{running['id']}/")
    assert report.status_code == 200, report.text
    shown = report.json()
    assert shown["reference"] == "one" and [a["name"] for a in shown["arms"]] == ["one", "three"]
    one, three = shown["arms"]
    assert (one["users"], three["users"]) == (
        int((places() == 0).sum()),
        int((places() == 1).sum()),
    )
    assert one["measures"]["sends"]["mean"] == pytest.approx(1.0)
    assert three["measures"]["sends"]["mean"] == pytest.approx(3.0)
    bought = places()[:100]
    assert one["measures"]["order"]["mean"] == pytest.approx((bought == 0).sum() / one["users"])
    assert three["measures"]["order.value"]["mean"] == pytest.approx(
        10 * (bought == 1).sum() / three["users"]
    )
    assert three["measures"]["unsubscribes"]["mean"] == pytest.approx(2 / three["users"])
    sends = three["lift"]["sends"]
    # Every user of an arm got the same: no spread, a certain difference.
    assert sends["difference"] == pytest.approx(2.0) and sends["significant"] is True
    assert one["lift"] is None
    assert "'three' brought" in shown["verdict"] and "than 'one'" in shown["verdict"]

    csv = call(api("viewer"), "GET", f"/api/v1/reports/experiments/{running['id']}/?format=csv")
    assert csv.status_code == 200 and csv.headers["Content-Type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0].startswith("arm,measure,users,mean,low,high,difference")
    assert len(lines) == 1 + 2 * len(shown["measures"])


def order_events(users, at: datetime) -> list[dict]:
    return [{"event_id": f"o{u}", "user_id": u, "name": "order", "at": at.isoformat(),
             "value": 10.0} for u in users]  # fmt: skip


def orders_by_arm(experiment: int) -> dict[int, tuple[int, float]]:
    found: dict[int, tuple[int, float]] = {}
    for e in StudyEvent.objects.filter(study=experiment, name="order"):
        count, value = found.get(e.arm, (0, 0.0))
        found[e.arm] = (count + e.count, value + e.value)
    return found


@pytest.mark.postgres
def test_events_posted_before_the_drain_writes_their_users_count_once_when_it_does(api, deciding):
    # The sends were decided; the drain has not written their users into the arms yet (it runs
    # every 2 s, later behind a large campaign) when the company posts the orders that followed.
    gate = api("gate")
    buyers = USERS[:100]
    events = order_events(buyers, datetime.now(UTC))
    posted = call(gate, "POST", "/api/v1/events/", json={"events": events})
    assert not StudyMember.objects.exists()
    ledger_drain_all()
    bought = places()[:100]
    expected = {arm: (int((bought == arm).sum()), 10.0 * int((bought == arm).sum()))
                for arm in (0, 1)}  # fmt: skip
    assert orders_by_arm(deciding["id"]) == expected
    assert posted.status_code == 202 and posted.json() == {"accepted": 100, "repeated": 0}
    # Posted again (a retry): a repeat, counted no second time.
    again = call(gate, "POST", "/api/v1/events/", json={"events": events})
    assert again.json() == {"accepted": 0, "repeated": 100}
    ledger_drain_all()
    assert orders_by_arm(deciding["id"]) == expected
    report = call(api("viewer"), "GET", f"/api/v1/reports/experiments/{deciding['id']}/").json()
    one, three = report["arms"]
    assert one["measures"]["order"]["mean"] == pytest.approx(expected[0][0] / one["users"])
    assert three["measures"]["order"]["mean"] == pytest.approx(expected[1][0] / three["users"])


@pytest.mark.postgres
def test_an_event_posted_twice_before_the_drain_counts_once(api, deciding):
    gate = api("gate")
    events = order_events(USERS[:10], datetime.now(UTC))
    for _ in range(2):  # a retry that came before the drain counted the first post
        answer = call(gate, "POST", "/api/v1/events/", json={"events": events})
        assert answer.json() == {"accepted": 10, "repeated": 0}
    ledger_drain_all()
    assert sum(count for count, _ in orders_by_arm(deciding["id"]).values()) == 10
    assert call(gate, "POST", "/api/v1/events/", json={"events": events}).json() == {
        "accepted": 0,
        "repeated": 10,
    }


@pytest.mark.postgres
def test_an_event_counts_for_the_users_decided_before_it_was_posted_not_after(api, experiment):
    # The stream's order decides, not the drain's timing: users whose first decision in the
    # experiment came after their order was posted were not in it when they ordered. One drain
    # writes both kinds.
    gate = api("gate")
    gate_check(channel="email", requests=[(u, f"first-{u}") for u in USERS[:200]])
    events = order_events(USERS[:300], datetime.now(UTC))
    assert call(gate, "POST", "/api/v1/events/", json={"events": events}).status_code == 202
    gate_check(channel="email", requests=[(u, f"first-{u}") for u in USERS[200:300]])
    ledger_drain_all()
    assert StudyMember.objects.filter(study=experiment["id"]).count() == 300
    assert sum(count for count, _ in orders_by_arm(experiment["id"]).values()) == 200


@pytest.mark.postgres
def test_the_control_group_is_read_against_its_treatment_sample(api, published):
    published(vip=(10, USERS, {}))
    assert call(api("marketer"), "PUT", "/api/v1/holdout/",
                json={"share": 0.2, "salt": "group-1"}).status_code == 200  # fmt: skip
    policy_cache().invalidate()
    gate_check(channel="email", requests=[(u, f"c{u}") for u in USERS])
    ledger_drain_all()
    report = call(api("viewer"), "GET", "/api/v1/reports/experiments/holdout/").json()
    held, sample = report["arms"]
    assert report["reference"] == "control group (held out)"
    assert held["measures"]["sends"]["mean"] == 0 and sample["measures"]["sends"]["mean"] == 1
    assert 40 < held["users"] < 120 and 40 < sample["users"] < 120
    # A new salt draws a new group: its report starts afresh.
    call(api("marketer"), "PUT", "/api/v1/holdout/", json={"share": 0.2, "salt": "group-2"})
    assert not StudyMember.objects.filter(study=0).exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"at": "2099-01-01T00:00:00Z"}, "events.0.at"),
        ({"at": "2001-01-01T00:00:00Z"}, "events.0.at"),
        ({"at": "2026-01-01T00:00:00"}, "events"),  # no offset
        ({"name": "Not A Tag"}, "events"),
        ({"user_id": -1}, "events"),
        ({"event_id": ""}, "events"),
        ({"value": 1e300}, "events"),
    ],
)
def test_bad_events_are_a_400_naming_them_and_count_nothing(api, snapshot, change, field):
    event = {"event_id": "e", "user_id": 1, "name": "order",
             "at": datetime.now(UTC).isoformat(), **change}  # fmt: skip
    refused = call(api("gate"), "POST", "/api/v1/events/", json={"events": [event]})
    assert refused.status_code == 400 and field in str(refused.json()), refused.text
    assert not EventSeen.objects.exists()


def test_events_are_a_503_naming_redis_when_it_does_not_answer(api, snapshot, settings):
    event = {"event_id": "e", "user_id": 1, "name": "order", "at": datetime.now(UTC).isoformat()}
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    down = call(api("gate"), "POST", "/api/v1/events/", json={"events": [event]})
    assert down.status_code == 503 and "Redis" in down.json()["detail"], down.text
    assert not EventSeen.objects.exists()


@pytest.mark.postgres
def test_events_need_their_right_and_come_at_most_10000_a_call(api, snapshot):
    event = {"event_id": "e", "user_id": 1, "name": "order", "at": datetime.now(UTC).isoformat()}
    assert (
        call(api("viewer"), "POST", "/api/v1/events/", json={"events": [event]}).status_code == 403
    )
    many = [{**event, "event_id": f"e{n}"} for n in range(10_001)]
    assert call(api("gate"), "POST", "/api/v1/events/", json={"events": many}).status_code == 400
    assert (
        call(api("gate"), "POST", "/api/v1/events/", json={"events": many[:10_000]}).json()[
            "accepted"
        ]
        == 10_000
    )


def test_a_report_asked_badly_says_so(api, running):
    viewer = api("viewer")
    base = f"/api/v1/reports/experiments/{running['id']}/"
    assert call(viewer, "GET", "/api/v1/reports/experiments/999/").status_code == 404
    assert call(viewer, "GET", "/api/v1/reports/experiments/nope/").status_code == 404
    bad = call(viewer, "GET", f"{base}?from=2026-02-30")
    assert bad.status_code == 400 and "from" in bad.json()
    backwards = call(viewer, "GET", f"{base}?from=2026-05-02&to=2026-05-01")
    assert backwards.status_code == 400 and "to" in backwards.json()
    assert call(viewer, "GET", f"{base}?format=xml").status_code == 400
    long = call(viewer, "GET", f"{base}?event={'o' * 65}")
    assert long.status_code == 400 and "event" in long.json()
    assert call(api("nobody"), "GET", base).status_code == 403


def test_a_scheduled_experiments_report_is_empty_not_an_error(api, published):
    published(vip=(10, USERS, {}))
    later = datetime.now(UTC) + timedelta(days=3)
    body = {"name": "Later", "segment": "vip", "starts_at": later.isoformat(),
            "ends_at": (later + timedelta(days=7)).isoformat(),
            "arms": [{"name": "a", "share": 0.5, "rules": [{"name": "1", "channel": "email",
                                                             "window": DAY, "limit": 1}]},
                     {"name": "b", "share": 0.5, "rules": [{"name": "2", "channel": "email",
                                                             "window": DAY, "limit": 2}]}]}  # fmt: skip
    made = call(api("marketer"), "POST", "/api/v1/experiments/", json=body).json()
    report = call(api("viewer"), "GET", f"/api/v1/reports/experiments/{made['id']}/")
    assert report.status_code == 200, report.text
    assert [a["users"] for a in report.json()["arms"]] == [0, 0]
    assert report.json()["verdict"].startswith("No user has entered yet")
