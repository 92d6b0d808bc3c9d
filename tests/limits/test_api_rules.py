"""Cap rules over HTTP: created, read, changed and deleted through the services (one rule for a
valid rule, every change in the history), the classic caps' rules left to their caps."""

import pytest

from limits.models.policy import Rule, SettingChange
from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

PROMO = {
    "name": "1 promo a day",
    "segment": "vip",
    "channel": "email",
    "match": "tag",
    "tag": "promo",
    "window": {"kind": "calendar", "unit": "day"},
    "limit": 1,
}


def test_a_marketer_creates_reads_changes_and_deletes_a_rule_and_each_step_is_recorded(
    api, snapshot
):
    m = api("marketer")
    created = call(m, "POST", "/api/v1/rules/", json=PROMO)
    assert created.status_code == 201, created.text
    rule = created.json()
    assert {k: rule[k] for k in PROMO} == PROMO
    assert (rule["reserve"], rule["enabled"], rule["classic"], rule["findings"]) == (
        None,
        True,
        False,
        [],
    )
    assert rule["description"] == (
        "VIP users: at most 1 promo-tagged email per calendar day, in their own time zone"
    )
    assert rule["created_at"] and rule["changed_at"]

    listed = call(api("viewer"), "GET", "/api/v1/rules/").json()
    assert [r["id"] for r in listed] == sorted(r["id"] for r in listed)  # the list's order
    assert listed[-1] == rule
    assert call(m, "GET", f"/api/v1/rules/{rule['id']}/").json() == rule

    changes = {"window": {"kind": "rolling", "seconds": 14_400}, "reserve": None, "limit": 2}
    changed = call(m, "PATCH", f"/api/v1/rules/{rule['id']}/", json=changes)
    assert changed.status_code == 200, changed.text
    assert changed.json()["window"] == {"kind": "rolling", "seconds": 14_400}
    assert changed.json()["limit"] == 2
    assert changed.json()["tag"] == "promo"  # untouched fields stay
    assert changed.json()["description"] == (
        "VIP users: at most 2 promo-tagged emails in any 4 hours"
    )
    # A rule that stops counting a tag forgets it.
    anything = call(m, "PATCH", f"/api/v1/rules/{rule['id']}/", json={"match": "any"}).json()
    assert (anything["match"], anything["tag"]) == ("any", None)

    assert call(m, "DELETE", f"/api/v1/rules/{rule['id']}/").status_code == 204
    assert call(m, "GET", f"/api/v1/rules/{rule['id']}/").status_code == 404
    history = list(
        SettingChange.objects.filter(kind="rule", object_label=PROMO["name"])
        .order_by("id")
        .values_list("action", "via", "by__username")
    )
    assert history == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("deleted", "api", "marketer"),
    ]
    first_change = SettingChange.objects.filter(kind="rule", object_label=PROMO["name"]).order_by(
        "id"
    )[1]
    before, after = first_change.before or {}, first_change.after or {}
    assert (before["window"], after["window"]) == (
        {"kind": "calendar", "unit": "day"},
        {"kind": "rolling", "seconds": 14_400},
    )


def test_a_rule_for_every_segment_and_every_channel_with_a_reserve(api, snapshot):
    body = {
        "name": "4 a week",
        "segment": None,
        "channel": "all",
        "window": {"kind": "calendar", "unit": "week"},
        "limit": 4,
        "reserve": {"below_priority": 7, "slots": 1},
        "enabled": False,
    }
    rule = call(api("marketer"), "POST", "/api/v1/rules/", json=body).json()
    assert (rule["segment"], rule["match"], rule["tag"], rule["enabled"]) == (
        None,
        "any",
        None,
        False,
    )
    assert rule["reserve"] == {"below_priority": 7, "slots": 1}
    assert rule["description"] == (
        "Everyone: at most 4 marketing messages per calendar week (Monday to Sunday), in their "
        "own time zone; the last 1 slot kept for priority 7 and above"
    )


GOOD = {**PROMO, "match": "any", "tag": None}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**GOOD, "window": {"kind": "rolling", "seconds": 59}}, "window.seconds", "From 60"),
        ({**GOOD, "window": {"kind": "rolling", "seconds": 7_776_001}}, "window.seconds", "90"),
        ({**GOOD, "window": {"kind": "rolling"}}, "window.seconds", "required"),
        ({**GOOD, "window": {"kind": "calendar", "unit": "year"}}, "window.unit", "Choose one"),
        ({**GOOD, "window": {"kind": "calendar", "seconds": 60}}, "window.seconds", "unit"),
        ({**GOOD, "window": {"kind": "weekly"}}, "window.kind", "rolling, calendar"),
        ({**GOOD, "window": {"seconds": 60}}, "window.kind", "required"),
        ({**GOOD, "match": "tag"}, "tag", "needs the tag"),
        ({**GOOD, "tag": "promo"}, "tag", "Only a tag rule"),
        ({**GOOD, "match": "tag", "tag": "Promo"}, "tag", "Lowercase"),
        ({**GOOD, "match": "tag", "tag": "promo\n"}, "tag", "is not a tag"),
        ({**GOOD, "reserve": {"below_priority": 5, "slots": 2}}, "reserve.slots", "at most"),
        ({**GOOD, "reserve": {"below_priority": 0, "slots": 1}}, "reserve.below_priority", "1"),
        ({**GOOD, "reserve": {"below_priority": 5, "slots": 0}}, "reserve.slots", "At least 1"),
        ({**GOOD, "reserve": {"slots": 1}}, "reserve.below_priority", "required"),
        ({**GOOD, "segment": "nope"}, "segment", "No segment 'nope'"),
        ({**GOOD, "segment": "no pe"}, "segment", "slug"),
        ({k: v for k, v in GOOD.items() if k != "segment"}, "segment", "required"),
        ({**GOOD, "channel": "fax"}, "channel", "Unknown channel"),
        ({**GOOD, "match": "every"}, "match", "Choose one"),
        ({**GOOD, "limit": -1}, "limit", "From 0"),
        ({**GOOD, "limit": 2**31}, "limit", "2,147,483,647"),
        ({**GOOD, "limit": "1"}, "limit", "integer"),
        ({**GOOD, "name": "   "}, "name", "blank"),
        ({**GOOD, "name": "x" * 101}, "name", "100"),
        ({**GOOD, "dry_run": True}, "dry_run", "Unknown field"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field_and_nothing_is_stored(
    api, snapshot, body, field, words
):
    stored = Rule.objects.count()
    refused = call(api("marketer"), "POST", "/api/v1/rules/", json=body)
    assert refused.status_code == 400, refused.text
    assert field in refused.json(), refused.json()
    assert words in " ".join(refused.json()[field]), refused.json()
    assert Rule.objects.count() == stored


def test_a_change_is_checked_against_the_whole_rule(api, snapshot):
    m = api("marketer")
    rule = call(m, "POST", "/api/v1/rules/", json={**GOOD, "limit": 3}).json()
    path = f"/api/v1/rules/{rule['id']}/"
    reserved = call(m, "PATCH", path, json={"reserve": {"below_priority": 5, "slots": 2}})
    assert reserved.status_code == 200
    # Lowering the limit under the reserve it keeps is refused, naming the reserve.
    lowered = call(m, "PATCH", path, json={"limit": 1})
    assert lowered.status_code == 400 and "reserve.slots" in lowered.json()
    tagless = call(m, "PATCH", path, json={"match": "tag"})
    assert tagless.status_code == 400 and "tag" in tagless.json()
    assert call(m, "PATCH", path, json={"match": "tag", "tag": "promo"}).json()["tag"] == "promo"
    assert call(m, "GET", path).json()["limit"] == 3
    for missing in ("/api/v1/rules/999999/", f"/api/v1/rules/{2**63}/", "/api/v1/rules/0/"):
        assert call(m, "PATCH", missing, json={"limit": 1}).status_code == 404


def test_a_classic_caps_rules_are_listed_and_change_only_with_their_cap(api, snapshot):
    m = api("marketer")
    classic = [r for r in call(m, "GET", "/api/v1/rules/").json() if r["classic"]]
    vip_email = [r for r in classic if (r["segment"], r["channel"]) == ("vip", "email")]
    assert sorted((r["window"]["seconds"], r["limit"]) for r in vip_email) == [
        (86_400, 2),
        (604_800, 3),
    ]
    daily = next(r for r in vip_email if r["window"]["seconds"] == 86_400)
    path = f"/api/v1/rules/{daily['id']}/"
    for method, body in (("PATCH", {"limit": 5}), ("DELETE", None)):
        refused = call(m, method, path, json=body)
        assert refused.status_code == 409, refused.text
        assert "PUT /api/v1/limits/vip/email/" in refused.json()["detail"]
    assert call(m, "GET", path).json()["limit"] == 2
    # Through its cap, it changes (the classic rules keep their ids).
    call(m, "PUT", "/api/v1/limits/vip/email/", json={"daily": 5, "weekly": 3})
    assert call(m, "GET", path).json()["limit"] == 5


def test_findings_name_rules_that_never_decide_and_reserves_that_shut_lower_priorities_out(
    api, snapshot
):
    m = api("marketer")
    # vip's classic daily email cap (2 in any 24 hours) is stricter than this, and applies with it.
    dead = call(
        m,
        "POST",
        "/api/v1/rules/",
        json={
            **GOOD,
            "name": "5 a day",
            "window": {"kind": "rolling", "seconds": 3_600 * 12},
            "limit": 5,
        },
    ).json()
    assert len(dead["findings"]) == 1
    assert dead["findings"][0].startswith("Never decides: 'VIP: daily cap on email'")
    shut = call(
        m,
        "POST",
        "/api/v1/rules/",
        json={
            **GOOD,
            "name": "push only for the urgent",
            "channel": "push",
            "limit": 2,
            "reserve": {"below_priority": 8, "slots": 2},
        },
    ).json()
    assert shut["findings"] == [
        "The reserve keeps all 2 slots: sends below priority 8 are always refused."
    ]
    # Without the stricter caps the rule decides again; a disabled rule has no findings.
    for scope in ("email", "all"):
        call(m, "PUT", f"/api/v1/limits/vip/{scope}/", json={"daily": None, "weekly": None})
    assert call(m, "GET", f"/api/v1/rules/{dead['id']}/").json()["findings"] == []
    off = call(m, "PATCH", f"/api/v1/rules/{shut['id']}/", json={"enabled": False}).json()
    assert off["findings"] == []


def test_a_new_rule_governs_the_gate_at_once(api, snapshot):
    call(
        api("marketer"),
        "POST",
        "/api/v1/rules/",
        json={**GOOD, "segment": None, "channel": "push", "limit": 0, "name": "no push"},
    )
    body = {"channel": "push", "requests": [{"user_id": 7, "message_id": "a"}]}
    decided = call(api("gate"), "POST", "/api/v1/gate/check/", json=body).json()["results"][0]
    assert (decided["reason"], decided["rule"]["name"], decided["rule"]["limit"]) == (
        "blocked",
        "no push",
        0,
    )
