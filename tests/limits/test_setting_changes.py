# mypy: disable-error-code="index,operator"
"""The one write path and its one history: every kind of setting (caps, rules, quiet hours,
topics, the control group, experiments, webhook endpoints) records exactly one SettingChange per
write, with its kind, object, action, JSON before and after, words, via and who; a write refused
for a bad value records nothing and changes nothing; the admin's history page lists and filters
every kind's changes, and each kind's page links to it."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from gatekeeper.lib.problems import Problems
from limits.engine.quiet import QuietFields
from limits.engine.topics import TopicFields
from limits.models.policy import Cap, Holdout, Rule, SettingChange
from limits.models.stream import WebhookEndpoint
from limits.models.studies import Experiment
from limits.policy.holdout import HoldoutFields, holdout_read, holdout_set
from limits.policy.rules import RuleFields
from limits.policy.services import QUIET_HOURS, RULES, TOPICS, cap_delete, cap_set
from limits.stream.webhooks import WebhookFields, webhook_change, webhook_create, webhook_delete
from limits.studies.experiments import (
    ArmFields,
    ExperimentFields,
    experiment_change,
    experiment_create,
    experiment_stop,
)
from segments.models import Segment

pytestmark = pytest.mark.django_db

DAY = {"kind": "rolling", "seconds": 86_400}


@pytest.fixture
def vip() -> Segment:
    return Segment.objects.create(slug="vip", name="VIP", priority=1)


def recorded(**where: Any) -> list[SettingChange]:
    return list(SettingChange.objects.filter(**where).order_by("id"))


def only(**where: Any) -> SettingChange:
    (change,) = recorded(**where)
    return change


def promo(**more: Any) -> RuleFields:
    fields = dict(name="1 promo a day", segment="vip", channel="email", match="tag", tag="promo",
                  window_kind="rolling", window_seconds=86_400, window_unit="", limit=1,
                  reserve_below_priority=None, reserve_slots=None)  # fmt: skip
    return RuleFields(**{**fields, **more})


def test_a_cap_records_its_creation_change_and_deletion_and_its_rules_theirs(vip, admin_user):
    cap = cap_set(segment=vip, channel="email", daily=3, weekly=None, user=admin_user, via="api")
    made = only(kind="cap")
    assert (made.object_id, made.object_label, made.action, made.via, made.by) == (
        cap.pk, "vip / email", "created", "api", admin_user
    )  # fmt: skip
    assert made.before is None
    assert made.after == {"segment": "vip", "channel": "email", "daily": 3, "weekly": None}
    assert made.words == "Created: at most 3 emails in any 24 hours."
    assert [(c.action, c.via) for c in recorded(kind="rule")] == [("created", "cap")]

    cap_set(segment=vip, channel="email", daily=3, weekly=None, via="api")  # the same again
    assert len(recorded(kind="cap")) == 1
    cap_set(segment=vip, channel="email", daily=2, weekly=10, via="command")
    changed = recorded(kind="cap")[-1]
    assert (changed.action, changed.via, changed.by) == ("changed", "command", None)
    assert (changed.before["daily"], changed.after["daily"], changed.after["weekly"]) == (3, 2, 10)
    assert changed.words.startswith("24 h / 7 d: 3 / none → 2 / 10: ")
    assert [c.action for c in recorded(kind="rule")] == ["created", "changed", "created"]

    with pytest.raises(ValidationError):
        cap_set(segment=vip, channel="email", daily=-1, weekly=None, via="api")
    assert len(recorded(kind="cap")) == 2 and Cap.objects.get().daily == 2

    cap_delete(Cap.objects.get(), user=admin_user, via="admin")
    gone = recorded(kind="cap")[-1]
    assert (gone.action, gone.object_id, gone.object_label, gone.after) == (
        "deleted", cap.pk, "vip / email", None
    )  # fmt: skip
    assert gone.before["weekly"] == 10
    assert [c.action for c in recorded(kind="rule")][-2:] == ["deleted", "deleted"]
    assert not Cap.objects.exists() and not Rule.objects.exists()


@pytest.mark.parametrize(
    ("kind", "spec", "fields", "change", "bad"),
    [
        ("rule", RULES, promo(), {"limit": 2}, {"limit": -1}),
        ("quiet_hours", QUIET_HOURS, QuietFields(segment="vip", channel="all", start="21:00",
         end="08:00", spread_minutes=0), {"spread_minutes": 30}, {"end": "21:00"}),
        ("topic", TOPICS, TopicFields(slug="offers", name="Offers"), {"name": "Deals"},
         {"default": "maybe"}),
    ],
)  # fmt: skip
def test_an_authored_kind_records_each_write_and_nothing_for_a_refused_one(
    vip, admin_user, kind, spec, fields, change, bad
):
    row = spec.create(fields=fields, user=admin_user, via="api")
    made = only(kind=kind)
    assert (made.object_id, made.action, made.via, made.by, made.before) == (
        row.pk, "created", "api", admin_user, None
    )  # fmt: skip
    assert made.after == spec.as_json(row) and made.object_label == str(row)[:200]
    assert made.words.startswith("Created: ")

    with pytest.raises(ValidationError):
        spec.update(row=row, changes=bad, user=admin_user, via="api")
    assert len(recorded(kind=kind)) == 1
    assert spec.as_json(spec.find(row.pk)) == made.after  # nothing changed

    changed_row = spec.update(row=row, changes=change, via="command")
    changed = recorded(kind=kind)[-1]
    (key,) = change
    assert (changed.action, changed.via, changed.by) == ("changed", "command", None)
    assert changed.before == made.after and changed.after == spec.as_json(changed_row)
    assert changed.after[key] != changed.before[key]
    spec.update(row=changed_row, changes=change, via="command")  # the same again
    assert len(recorded(kind=kind)) == 2

    spec.delete(row=changed_row, user=admin_user, via="admin")
    gone = recorded(kind=kind)[-1]
    assert (gone.action, gone.object_id, gone.before, gone.after, gone.words) == (
        "deleted", row.pk, changed.after, None, "Deleted."
    )  # fmt: skip
    assert not spec.model.objects.exists()


def test_the_control_group_records_each_change_as_a_singleton(vip, admin_user):
    salt = holdout_read().salt
    holdout_set(HoldoutFields(share=0.05, salt=salt), segments=["vip"], via="api", by=admin_user)
    change = only(kind="control_group")
    assert (change.object_id, change.object_label, change.action, change.via, change.by) == (
        None, "control group", "changed", "api", admin_user
    )  # fmt: skip
    assert (change.before["share"], change.after["share"]) == (0.0, 0.05)
    assert "everyone held out stays out" in change.words
    with pytest.raises(ValidationError):
        holdout_set(HoldoutFields(share=0.5, salt=salt), segments=["vip"], via="api")
    assert len(recorded(kind="control_group")) == 1 and Holdout.objects.get().share == 0.05


def experiment(**more: Any) -> ExperimentFields:
    now = datetime.now(UTC)
    arms = [
        ArmFields("one", 0.5, [{"name": "1 a day", "channel": "email", "window": DAY, "limit": 1}]),
        ArmFields("three", 0.5, [{"name": "3 a day", "channel": "email", "window": DAY,
                                  "limit": 3}]),
    ]  # fmt: skip
    fields = dict(name="1 or 3", segment="vip", arms=arms, starts_at=now + timedelta(days=1),
                  ends_at=now + timedelta(days=8), salt="exp")  # fmt: skip
    return ExperimentFields(**{**fields, **more})


def test_an_experiment_records_its_arms_and_its_named_actions(vip, admin_user):
    row = experiment_create(experiment(), user=admin_user, via="api")
    made = only(kind="experiment")
    assert (made.object_id, made.object_label, made.action, made.before) == (
        row.pk, "1 or 3", "created", None
    )  # fmt: skip
    assert [a["name"] for a in made.after["arms"]] == ["one", "three"]
    assert made.words.startswith("On segment 'vip'")

    with pytest.raises(ValidationError):
        experiment_change(row, {"name": ""}, user=admin_user, via="api")
    assert len(recorded(kind="experiment")) == 1 and Experiment.objects.get().name == "1 or 3"

    experiment_change(row, {"name": "1 or 3 a day"}, user=admin_user, via="admin")
    changed = recorded(kind="experiment")[-1]
    assert (changed.action, changed.via, changed.before["name"], changed.after["name"]) == (
        "changed", "admin", "1 or 3", "1 or 3 a day"
    )  # fmt: skip
    experiment_stop(row, user=admin_user, via="api")
    stopped = recorded(kind="experiment")[-1]
    assert (stopped.action, stopped.before["stopped_at"]) == ("stopped", None)
    assert stopped.after["stopped_at"] is not None
    assert stopped.words == "Stopped: every user is back on the segment's rules."
    assert len(recorded(kind="experiment")) == 3


def test_a_webhook_endpoint_records_each_write_never_its_secret(admin_user):
    endpoint = webhook_create(
        fields=WebhookFields(url="https://example.com/hook"), by=admin_user, via="api"
    )
    made = only(kind="webhook")
    assert (made.object_id, made.object_label, made.action, made.before, made.by) == (
        endpoint.pk, "https://example.com/hook", "created", None, admin_user
    )  # fmt: skip
    assert made.after["url"] == "https://example.com/hook" and "secret" not in made.after

    with pytest.raises(Problems):
        webhook_change(endpoint, fields=WebhookFields(url="ftp://nowhere"), by=admin_user)
    assert len(recorded(kind="webhook")) == 1
    assert WebhookEndpoint.objects.get().url == "https://example.com/hook"

    webhook_change(endpoint, active=False, by=admin_user, via="admin")
    paused = recorded(kind="webhook")[-1]
    assert (paused.action, paused.via, paused.before["state"], paused.after["state"]) == (
        "changed", "admin", "active", "paused"
    )  # fmt: skip
    secret = WebhookEndpoint.objects.get().secret
    webhook_change(endpoint, new_secret=True, by=admin_user, via="api")
    rotated = recorded(kind="webhook")[-1]
    assert rotated.action == "secret_rotated" and rotated.before == rotated.after
    assert "a new secret" in rotated.words and secret not in str(rotated.after)
    assert WebhookEndpoint.objects.get().secret != secret

    endpoint_id = endpoint.pk
    webhook_delete(endpoint, by=admin_user, via="api")
    gone = recorded(kind="webhook")[-1]
    assert (gone.action, gone.object_id, gone.after) == ("deleted", endpoint_id, None)
    assert len(recorded(kind="webhook")) == 4 and not WebhookEndpoint.objects.exists()


def test_the_history_page_lists_every_kind_and_filters_them(vip, admin_client, admin_user):
    cap_set(segment=vip, channel="email", daily=3, weekly=None, user=admin_user, via="admin")
    rule = RULES.create(fields=promo(), via="command")
    TOPICS.create(fields=TopicFields(slug="offers", name="Offers"), user=admin_user, via="api")
    webhook_create(fields=WebhookFields(url="https://example.com/hook"), via="api")
    url = reverse("admin:limits_settingchange_changelist")

    def listed(**query: str) -> str:
        response = admin_client.get(url, query)
        assert response.status_code == 200
        return response.content.decode()

    everything = listed()
    for label in ("vip / email", "1 promo a day", "Offers (offers)", "https://example.com/hook"):
        assert label in everything
    topics = listed(kind__exact="topic")
    assert "Offers (offers)" in topics and "1 promo a day" not in topics
    commands = listed(via__exact="command")
    assert "1 promo a day" in commands and "Offers (offers)" not in commands
    mine = listed(by=str(admin_user.pk))
    assert "Offers (offers)" in mine and "https://example.com/hook" not in mine
    nobody = listed(by="none")
    assert "https://example.com/hook" in nobody and "Offers (offers)" not in nobody
    today = datetime.now(UTC)
    dated = listed(at__year=str(today.year), at__month=str(today.month), at__day=str(today.day))
    assert "Offers (offers)" in dated
    assert "Offers (offers)" not in listed(at__year=str(today.year - 1))
    assert "Offers (offers)" in listed(q="offers") and "vip / email" not in listed(q="offers")
    one = listed(kind__exact="rule", object_id=str(rule.pk))
    assert "1 promo a day" in one and "daily cap" not in one
    assert admin_client.get(reverse("admin:limits_settingchange_add")).status_code == 403

    page = admin_client.get(reverse("admin:limits_rule_change", args=[rule.pk])).content.decode()
    assert f"?kind__exact=rule&amp;object_id={rule.pk}" in page
    grid = admin_client.get(reverse("admin:cap_grid", args=[vip.pk])).content.decode()
    assert "?kind__exact=cap" in grid
