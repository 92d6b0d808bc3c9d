"""Cap experiments: made, changed, stopped and concluded over REST, each step in its history;
the gate applies each user's arm (exactly the users the keyed hash puts there), its rules
replacing or adding to the segment's own, every decision naming the experiment and arm (the
ledger keeps them); bad input is a 400 naming the field and keeps nothing."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from limits.engine.assignment import arms_of
from limits.models.policy import Rule, SettingChange
from limits.models.studies import Experiment
from limits.policy.selectors import policy_cache
from limits.studies.experiments import (
    ArmFields,
    ExperimentFields,
    experiment_create,
    experiment_problems,
)
from tests.support.api import call
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/experiments/"
USERS = list(range(1, 1001))
DAY = {"kind": "rolling", "seconds": 86_400}


def rule(name: str, limit: int, channel: str = "email", **more: object) -> dict[str, object]:
    return {"name": name, "channel": channel, "window": DAY, "limit": limit, **more}


def body(**more: object) -> dict[str, object]:
    now = datetime.now(UTC)
    return {
        "name": "1 or 3 a day",
        "segment": "vip",
        "arms": [
            {"name": "one", "share": 0.5, "rules": [rule("1 a day", 1)]},
            {"name": "three", "share": 0.5, "rules": [rule("3 a day", 3)]},
        ],
        "ends_at": (now + timedelta(days=14)).isoformat(),
        "salt": "exp-1",
        **more,
    }


@pytest.fixture
def vip(published):
    """The VIP segment (USERS) with a rule of its own: 2 email a day."""
    published(vip=(10, USERS, {}))
    Rule.objects.create(
        name="2 a day", segment_id=_segment_id("vip"), channel="email", window_seconds=86_400,
        limit=2,
    )  # fmt: skip
    policy_cache().invalidate()


def _segment_id(slug: str) -> int:
    from segments.models import Segment

    return Segment.objects.get(slug=slug).pk


@pytest.mark.postgres
def test_made_read_changed_and_stopped_over_rest_each_step_recorded(api, vip):
    marketer = api("marketer")
    made = call(marketer, "POST", PATH, json=body())
    assert made.status_code == 201, made.text
    shown = made.json()
    assert (shown["status"], shown["segment"], len(shown["arms"])) == ("running", "vip", 2)
    assert shown["arms"][0]["mode"] == "replace"
    assert shown["arms"][0]["rules"][0]["window"] == DAY
    one = f"{PATH}{shown['id']}/"
    assert call(api("viewer"), "GET", one).json() == call(marketer, "GET", one).json()
    assert [e["id"] for e in call(api("viewer"), "GET", PATH).json()] == [shown["id"]]
    assert call(api("viewer"), "POST", PATH, json=body()).status_code == 403
    # Started: the arms are fixed, the name and end are not.
    arms = body()["arms"]
    assert isinstance(arms, list)
    fixed = call(marketer, "PATCH", one, json={"arms": arms[::-1]})
    assert fixed.status_code == 400 and "arms" in fixed.json(), fixed.text
    renamed = call(marketer, "PATCH", one, json={"name": "One or three"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "One or three"
    stopped = call(marketer, "POST", f"{one}stop/")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    again = call(marketer, "POST", f"{one}stop/")
    assert again.status_code == 409 and again.json()["field"] == "status"
    actions = list(
        SettingChange.objects.filter(kind="experiment")
        .order_by("id")
        .values_list("action", "via", "by__username")
    )
    assert actions == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("stopped", "api", "marketer"),
    ]


def test_a_scheduled_one_changes_whole_and_starts_on_time(api, vip):
    marketer = api("marketer")
    later = datetime.now(UTC) + timedelta(days=1)
    made = call(marketer, "POST", PATH, json=body(starts_at=later.isoformat()))
    assert made.json()["status"] == "scheduled", made.text
    one = f"{PATH}{made.json()['id']}/"
    arms = [{"name": "a", "share": 0.3, "mode": "add", "rules": [rule("1 a day", 1)]},
            {"name": "b", "share": 0.3, "rules": [rule("5 a day", 5, channel="all")]}]  # fmt: skip
    changed = call(marketer, "PATCH", one, json={"arms": arms})
    assert changed.status_code == 200, changed.text
    assert [a["name"] for a in changed.json()["arms"]] == ["a", "b"]
    concluded = call(marketer, "POST", f"{one}conclude/", json={"arm": "a"})
    assert concluded.status_code == 409 and concluded.json()["field"] == "status"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"arms": [{"name": "a", "share": 0.7, "rules": [rule("1", 1)]},
                   {"name": "b", "share": 0.4, "rules": [rule("2", 2)]}]}, "arms"),
        ({"arms": [{"name": "a", "share": 0.5, "rules": [rule("1", 1)]},
                   {"name": "b", "share": 0.5, "rules": []}]}, "arms.1.rules"),
        ({"arms": [{"name": "a", "share": 0.5, "rules": [rule("1", 1)]}]}, "arms"),
        ({"arms": [{"name": "a", "share": 0.5, "rules": [rule("1", 1)]},
                   {"name": "a", "share": 0.5, "rules": [rule("2", 2)]}]}, "arms.1.name"),
        ({"arms": [{"name": "a", "share": 0, "rules": [rule("1", 1)]},
                   {"name": "b", "share": 0.5, "rules": [rule("2", 2)]}]}, "arms.0.share"),
        ({"arms": [{"name": "a", "share": 0.5, "rules": [rule("1", 1)]},
                   {"name": "b", "share": 0.5, "rules": [
                       rule("2", 2, window={"kind": "rolling", "seconds": 5})]}]},
         "arms.1.rules.0.window.seconds"),
        ({"arms": [{"name": "a", "share": 0.5, "rules": [rule("1", 1, channel="fax")]},
                   {"name": "b", "share": 0.5, "rules": [rule("2", 2)]}]}, "arms.0.rules.0.channel"),
        ({"segment": "nope"}, "segment"),
        ({"ends_at": "2020-01-01T00:00:00Z"}, "ends_at"),
        ({"starts_at": "2020-01-01T00:00:00Z", "ends_at": "2020-02-01T00:00:00Z"}, "starts_at"),
        ({"ends_at": "2031-01-01T00:00:00"}, "ends_at"),  # no offset
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_it_and_keeps_nothing(api, vip, change, field):
    refused = call(api("marketer"), "POST", PATH, json=body(**change))
    assert refused.status_code == 400 and field in refused.json(), refused.text
    assert (
        not Experiment.objects.exists()
        and not SettingChange.objects.filter(kind="experiment").exists()
    )


def test_two_live_experiments_never_share_a_user(api, vip, published):
    marketer = api("marketer")
    assert call(marketer, "POST", PATH, json=body()).status_code == 201
    on_vip = call(marketer, "POST", PATH, json=body(salt="exp-2"))
    on_everyone = call(marketer, "POST", PATH, json=body(segment=None, salt="exp-3"))
    for refused in (on_vip, on_everyone):
        assert refused.status_code == 400 and "segment" in refused.json(), refused.text
        assert "a user is in one experiment at a time" in refused.json()["segment"][0]
    # After the first one ends, another may follow on the same segment.
    start = (datetime.now(UTC) + timedelta(days=15)).isoformat()
    end = (datetime.now(UTC) + timedelta(days=20)).isoformat()
    after = call(marketer, "POST", PATH, json=body(starts_at=start, ends_at=end, salt="exp-4"))
    assert after.status_code == 201, after.text


def test_the_gate_applies_each_users_arm_and_names_it(api, vip):
    made = call(api("marketer"), "POST", PATH, json=body(
        arms=[{"name": "one", "share": 0.4, "rules": [rule("1 a day", 1)]},
              {"name": "three", "share": 0.4, "rules": [rule("3 a day", 3)]}]))  # fmt: skip
    assert made.status_code == 201, made.text
    policy_cache().invalidate()
    expected = arms_of(np.array(USERS), "exp-1", [0.4, 0.4])
    allowed = np.zeros(len(USERS), dtype=int)
    for n in range(4):
        decided = gate_check(channel="email", requests=[(u, f"m{n}-{u}") for u in USERS])
        allowed += [d.allowed for d in decided]
        for d, arm in zip(decided, expected.tolist(), strict=True):
            name = {0: "one", 1: "three"}.get(arm)
            assert d.experiment == ({"id": made.json()["id"], "arm": name} if name else None)
    # Arm "one": its 1 a day replaces the segment's 2; "three": 3; the rest: the segment's 2.
    want = np.select([expected == 0, expected == 1], [1, 3], default=2)
    assert np.array_equal(allowed, want)
    assert {0, 1, -1} == set(expected.tolist())
    refused = gate_check(channel="email", requests=[(USERS[int(np.argmax(expected == 1))], "x")])
    assert refused[0].rule is not None
    assert (refused[0].rule["kind"], refused[0].rule["name"]) == ("arm", "3 a day")
    assert refused[0].reason == "daily_cap" and refused[0].rule["id"] < 0


def test_an_arm_that_adds_keeps_the_segments_rules(api, vip):
    arms = [{"name": "add", "share": 1.0, "mode": "add", "rules": [rule("3 a day", 3)]},
            {"name": "none", "share": 0.0001, "rules": [rule("9 a day", 9)]}]  # fmt: skip
    assert call(api("marketer"), "POST", PATH, json=body(arms=arms)).status_code == 400
    arms[0]["share"] = 0.9999
    assert call(api("marketer"), "POST", PATH, json=body(arms=arms)).status_code == 201
    policy_cache().invalidate()
    user = USERS[int(np.argmax(arms_of(np.array(USERS), "exp-1", [0.9999, 0.0001]) == 0))]
    decided = [gate_check(channel="email", requests=[(user, f"a{n}")])[0] for n in range(3)]
    assert [d.allowed for d in decided] == [True, True, False]  # the segment's 2 still hold
    assert decided[2].rule is not None and decided[2].rule["kind"] == "rule"


def test_stopped_every_user_is_back_on_the_segments_rules(api, vip):
    made = call(api("marketer"), "POST", PATH, json=body()).json()
    assert call(api("marketer"), "POST", f"{PATH}{made['id']}/stop/").status_code == 200
    policy_cache().invalidate()
    decided = gate_check(channel="email", requests=[(u, "s") for u in USERS[:50]])
    assert all(d.experiment is None for d in decided)


@pytest.mark.postgres
def test_concluding_promotes_the_arm_and_disables_what_it_replaces(api, vip):
    marketer = api("marketer")
    made = call(marketer, "POST", PATH, json=body()).json()
    one = f"{PATH}{made['id']}/conclude/"
    unknown = call(marketer, "POST", one, json={"arm": "four"})
    assert unknown.status_code == 400 and "arm" in unknown.json()
    assert call(api("viewer"), "POST", one, json={"arm": "three"}).status_code == 403
    done = call(marketer, "POST", one, json={"arm": "three"})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "concluded" and done.json()["concluded_arm"] == "three"
    assert "made '3 a day'; disabled '2 a day'" in done.json()["change"]
    enabled = list(
        Rule.objects.filter(segment__slug="vip", enabled=True).values_list("name", "limit")
    )
    assert enabled == [("3 a day", 3)]
    assert set(SettingChange.objects.filter(kind="rule").values_list("action", "via")) == {
        ("created", "experiment"),
        ("changed", "experiment"),
    }
    assert call(marketer, "POST", one, json={"arm": "three"}).status_code == 409


@pytest.mark.postgres
def test_decisions_name_the_arm_in_the_ledger_and_history(api, vip):
    from limits.ledger.drain import ledger_drain
    from limits.models.ledger import LedgerKind

    made = call(api("marketer"), "POST", PATH, json=body()).json()
    policy_cache().invalidate()
    expected = arms_of(np.array(USERS[:20]), "exp-1", [0.5, 0.5])
    for n in range(2):
        gate_check(channel="email", requests=[(u, f"h{n}-{u}") for u in USERS[:20]])
    ledger_drain()
    kinds = set(LedgerKind.objects.values_list("experiment", "arm", "reason"))
    assert (made["id"], 0, "allowed") in kinds and (made["id"], 1, "allowed") in kinds
    user = USERS[int(np.argmax(expected == 0))]
    for _ in range(1):
        gate_check(channel="email", requests=[(user, "late")])
    ledger_drain()
    newest = call(api("viewer"), "GET", f"/api/v1/users/{user}/history/").json()["results"][0]
    assert newest["experiment"] == {"id": made["id"], "arm": "one"}
    assert newest["rule"]["name"] == "1 a day"
    assert "Arm 'one'" in newest["rule"]["description"]


def test_the_one_rule_refuses_overlap_with_either_on_every_segment():
    now = datetime(2026, 11, 1, tzinfo=UTC)
    fields = ExperimentFields(
        name="x", segment=None, salt="s", starts_at=now, ends_at=now + timedelta(days=3),
        arms=[ArmFields("a", 0.5, [rule("1", 1)]), ArmFields("b", 0.5, [rule("2", 2)])],
    )  # fmt: skip
    other = Experiment(pk=7, name="y", segment=None, starts_at=now + timedelta(days=2),
                       ends_at=now + timedelta(days=9))  # fmt: skip
    assert "segment" in experiment_problems(fields, segments=["vip"], others=[other])
    other.starts_at = now + timedelta(days=3)  # touching, not overlapping
    assert experiment_problems(fields, segments=["vip"], others=[other]) == {}


def test_made_in_code_checks_the_same(vip):
    fields = ExperimentFields(
        name="x", segment="vip", starts_at=datetime.now(UTC),
        ends_at=datetime.now(UTC) + timedelta(days=1),
        arms=[ArmFields("a", 0.5, [rule("1", 1)]), ArmFields("b", 0.6, [rule("2", 2)])],
    )  # fmt: skip
    with pytest.raises(Exception, match="at most 100"):
        experiment_create(fields, via="command")
    assert not Experiment.objects.exists()


def test_the_quota_shows_the_users_arm_and_its_rules(api, vip):
    made = call(api("marketer"), "POST", PATH, json=body()).json()
    policy_cache().invalidate()
    places = arms_of(np.array(USERS), "exp-1", [0.5, 0.5])
    user = USERS[int(np.argmax(places == 1))]
    quota = call(api("viewer"), "GET", f"/api/v1/users/{user}/quota/").json()
    assert quota["experiment"] == {"id": made["id"], "arm": "three"}
    rules = {(r["name"], r["kind"]) for r in quota["rules"]}
    assert ("3 a day", "arm") in rules and ("2 a day", "rule") not in rules
    call(api("marketer"), "POST", f"{PATH}{made['id']}/stop/")
    policy_cache().invalidate()
    after = call(api("viewer"), "GET", f"/api/v1/users/{user}/quota/").json()
    assert after["experiment"] is None
    assert {(r["name"], r["kind"]) for r in after["rules"]} == {("2 a day", "rule")}


def test_an_ended_one_keeps_its_end_and_one_about_to_start_keeps_its_arms(api, vip):
    from limits.studies.experiments import experiment_change

    marketer = api("marketer")
    made = call(marketer, "POST", PATH, json=body()).json()
    row = Experiment.objects.get(pk=made["id"])
    later = row.ends_at + timedelta(days=1)
    with pytest.raises(Exception, match="its end is past"):
        experiment_change(row, {"ends_at": later}, now=later)  # ended: fixed
    start = call(marketer, "POST", PATH, json=body(
        segment=None, salt="soon", starts_at=(row.ends_at + timedelta(days=2)).isoformat(),
        ends_at=(row.ends_at + timedelta(days=9)).isoformat())).json()  # fmt: skip
    scheduled = Experiment.objects.get(pk=start["id"])
    with pytest.raises(Exception, match="starts in a moment"):
        experiment_change(
            scheduled, {"salt": "other"}, now=scheduled.starts_at - timedelta(seconds=1)
        )
    renamed = experiment_change(scheduled, {"name": "Renamed"}, now=scheduled.starts_at)
    assert renamed.name == "Renamed"


def test_a_stopped_ones_rename_keeps_its_state(api, vip):
    from limits.studies.experiments import experiment_change

    made = call(api("marketer"), "POST", PATH, json=body()).json()
    call(api("marketer"), "POST", f"{PATH}{made['id']}/stop/")
    stale = Experiment.objects.get(pk=made["id"])
    stale.state = "active"  # as a writer that read it before the stop would hold it
    experiment_change(stale, {"name": "After"})
    again = Experiment.objects.get(pk=made["id"])
    assert (again.name, again.state) == ("After", "stopped")
