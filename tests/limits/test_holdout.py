"""The global control group: set whole over REST with its history and what a change does in
words; its users get no marketing (`holdout`, charged nothing), exactly those the keyed hash
holds, whatever process asks; excluded segments and tags, and transactional sends, pass; bad
input is a 400 naming the field and changes nothing."""

import numpy as np
import pytest

from limits.engine.assignment import in_share
from limits.models.policy import SettingChange
from limits.policy.selectors import policy_cache
from tests.support.api import call
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/holdout/"
USERS = list(range(1, 2001))


def test_the_group_is_set_whole_with_its_history_and_what_the_change_does(api, snapshot):
    marketer = api("marketer")
    empty = call(api("viewer"), "GET", PATH).json()
    assert empty["share"] == 0 and len(empty["salt"]) == 32
    grown = call(marketer, "PUT", PATH, json={"share": 0.05, "exclude_tags": ["receipt"]})
    assert grown.status_code == 200, grown.text
    assert grown.json()["salt"] == empty["salt"]  # kept when left out
    assert "everyone held out stays out" in grown.json()["change"]
    shrunk = call(marketer, "PUT", PATH, json={"share": 0.03})
    assert "2.0% of users come back" in shrunk.json()["change"]
    assert call(marketer, "GET", PATH).json()["exclude_tags"] == []
    assert SettingChange.objects.filter(kind="control_group").count() == 2
    last = SettingChange.objects.filter(kind="control_group").order_by("id").last()
    assert last is not None and last.before is not None
    assert last.before["share"] == 0.05
    # The same again changes nothing and records nothing.
    assert call(marketer, "PUT", PATH, json={"share": 0.03}).status_code == 200
    assert SettingChange.objects.filter(kind="control_group").count() == 2
    assert call(api("viewer"), "PUT", PATH, json={"share": 0.01}).status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"share": 0.5}, "share"),
        ({"share": 0.0001}, "share"),
        ({"share": 0.1, "exclude_segments": ["nope"]}, "exclude_segments.0"),
        ({"share": 0.1, "exclude_tags": ["Bad Tag"]}, "exclude_tags.0"),
        ({"share": 0.1, "exclude_tags": ["a", "a"]}, "exclude_tags"),
        ({"share": 0.1, "salt": " "}, "salt"),
        ({}, "share"),
    ],
)
def test_bad_input_is_a_400_naming_it_and_changes_nothing(api, snapshot, body, field):
    marketer = api("marketer")
    assert call(marketer, "PUT", PATH, json={"share": 0.02}).status_code == 200
    refused = call(marketer, "PUT", PATH, json=body)
    assert refused.status_code == 400 and field in refused.json(), refused.text
    assert call(marketer, "GET", PATH).json()["share"] == 0.02
    assert SettingChange.objects.filter(kind="control_group").count() == 1


def test_its_users_get_no_marketing_and_are_charged_nothing(api, published):
    published(vip=(10, USERS[:1000], {"email": (5, None)}), rest=(20, USERS[1000:], {}))
    marketer = api("marketer")
    body = {"share": 0.2, "salt": "control-1", "exclude_tags": ["receipt"]}
    assert call(marketer, "PUT", PATH, json=body).status_code == 200
    policy_cache().invalidate()
    expected = in_share(np.array(USERS), "control-1", 0.2)
    decided = gate_check(channel="email", requests=[(u, f"m{u}") for u in USERS])
    held = np.array([d.reason == "holdout" for d in decided])
    assert np.array_equal(held, expected) and 300 < held.sum() < 500
    assert {d.reason for d in decided} == {"holdout", "allowed"}
    # Nothing charged: a held-out user's next send with an excluded tag is their first.
    first = USERS[int(np.argmax(expected))]
    tagged = gate_check(channel="email", requests=[(first, "t")], tags=("receipt",))[0]
    assert (tagged.reason, tagged.counts["daily"]) == ("allowed", 1)
    # Each says what it would have got: sent (no rule), and once the caps are full, refused.
    assert all(d.rule is None for d in decided if d.reason == "holdout")
    for n in range(4):
        gate_check(channel="email", requests=[(first, f"t{n}")], tags=("receipt",))
    would = gate_check(channel="email", requests=[(first, "w")])[0]
    assert would.reason == "holdout" and would.rule is not None
    assert (would.rule["limit"], would.rule["used"]) == (5, 5)
    # Transactional sends pass.
    kept = [u for u, h in zip(USERS, expected, strict=True) if h][:20]
    receipts = gate_check(channel="email", requests=[(u, f"r{u}") for u in kept],
                          category="transactional")  # fmt: skip
    assert {d.reason for d in receipts} == {"exempt"}
    # An excluded segment's users pass; the others stay out.
    body["exclude_segments"] = ["vip"]
    assert call(marketer, "PUT", PATH, json=body).status_code == 200
    policy_cache().invalidate()
    again = gate_check(channel="email", requests=[(u, f"n{u}") for u in USERS])
    held_now = np.array([d.reason == "holdout" for d in again])
    assert not held_now[:1000].any()
    assert np.array_equal(held_now[1000:], expected[1000:])


def test_the_admin_sets_it_through_the_one_rule_and_says_what_it_does(admin_client, snapshot):
    from django.urls import reverse

    listed = admin_client.get(reverse("admin:limits_holdout_changelist"))
    assert listed.status_code == 302
    page = reverse("admin:limits_holdout_change", args=[1])
    assert admin_client.get(page).status_code == 200
    salt = call_salt()
    bad = admin_client.post(page, {"share": "0.5", "salt": salt, "exclude_tags": "Bad Tag"})
    assert (
        bad.status_code == 200 and SettingChange.objects.filter(kind="control_group").count() == 0
    )
    assert "Ensure this value is less than or equal to 0.2" in bad.content.decode()
    saved = admin_client.post(
        page, {"share": "0.05", "salt": salt, "exclude_tags": "receipt, alert"}, follow=True
    )
    assert "everyone held out stays out" in saved.content.decode()
    change = SettingChange.objects.filter(kind="control_group").get()
    assert (change.via, (change.after or {})["exclude_tags"]) == ("admin", ["alert", "receipt"])
    assert admin_client.get(reverse("admin:limits_settingchange_changelist")).status_code == 200


def call_salt() -> str:
    from limits.policy.holdout import holdout_read

    return holdout_read().salt
