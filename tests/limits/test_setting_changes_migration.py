"""The histories kept per kind moved into the one history (migration 0027) and back: every
change of a cap, a rule, quiet hours, a topic, the control group and an experiment comes through
with its kind, object, action, before and after, who, via and time, in the order made."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

OLD = ("limits", "0026_setting_changes")
MOVED = ("limits", "0027_setting_changes_moved")
T0 = datetime(2025, 11, 22, 8, 0, tzinfo=UTC)


def migrate(target: tuple[str, str] | None = None) -> Any:
    """Migrate to `target` (the latest when None); the apps as they are there."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    targets = [target] if target else executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    executor = MigrationExecutor(connection)
    return executor.loader.project_state(targets).apps


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def dated(model: Any, minutes: int, **fields: Any) -> Any:
    row = model.objects.create(**fields)
    model.objects.filter(pk=row.pk).update(changed_at=at(minutes))
    return row


def old_histories(apps: Any) -> dict[str, Any]:
    """One object of each kind and a few changes of each, as the old tables kept them."""
    user = apps.get_model("auth", "User").objects.create(username="marketer")
    segment = apps.get_model("segments", "Segment").objects.create(
        slug="vip", name="VIP", priority=1
    )
    cap = apps.get_model("limits", "Cap").objects.create(segment=segment, channel="email", daily=3)
    CapChange = apps.get_model("limits", "CapChange")
    dated(CapChange, 1, cap=cap, segment_slug="vip", channel="email", new_daily=2,
          changed_by=user, via="admin")  # fmt: skip
    dated(CapChange, 5, cap=cap, segment_slug="vip", channel="email", old_daily=2, new_daily=3,
          via="api")  # fmt: skip
    rule = apps.get_model("limits", "Rule").objects.create(
        name="1 a day", channel="email", window_seconds=86400, limit=1
    )
    RuleChange = apps.get_model("limits", "RuleChange")
    dated(RuleChange, 2, rule=rule, label="1 a day", action="created", after={"id": rule.pk,
          "name": "1 a day", "limit": 1}, changed_by=user, via="api")  # fmt: skip
    dated(RuleChange, 7, rule=None, label="gone", action="deleted", before={"id": 999,
          "name": "gone", "limit": 4}, via="admin")  # fmt: skip
    quiet = apps.get_model("limits", "QuietHours").objects.create(
        channel="all", start="21:00", end="08:00"
    )
    dated(apps.get_model("limits", "QuietHoursChange"), 3, quiet_hours=quiet, label="night",
          action="changed", before={"id": quiet.pk, "spread_minutes": 0},
          after={"id": quiet.pk, "spread_minutes": 30}, via="api")  # fmt: skip
    topic = apps.get_model("limits", "Topic").objects.create(slug="offers", name="Offers")
    dated(apps.get_model("limits", "TopicChange"), 4, topic=topic, label="Offers (offers)",
          action="created", after={"slug": "offers", "name": "Offers"}, via="command")  # fmt: skip
    dated(apps.get_model("limits", "HoldoutChange"), 6, before={"share": 0.0},
          after={"share": 0.05}, via="admin", changed_by=user)  # fmt: skip
    experiment = apps.get_model("limits", "Experiment").objects.create(
        name="3 or 5", salt="s", starts_at=at(60), ends_at=at(6000)
    )
    dated(apps.get_model("limits", "ExperimentChange"), 8, experiment=experiment,
          action="stopped", before={"name": "3 or 5"}, after={"name": "3 or 5"},
          words="Stopped.", via="api", changed_by=user)  # fmt: skip
    return {"user": user.pk, "cap": cap.pk, "rule": rule.pk, "quiet": quiet.pk,
            "topic": topic.pk, "experiment": experiment.pk}  # fmt: skip


MOVED_ROWS = [
    # kind, object (a name in old_histories' ids, or a number), label, action, via, by (user?)
    ("cap", "cap", "vip / email", "created", "admin", True),
    ("rule", "rule", "1 a day", "created", "api", True),
    ("quiet_hours", "quiet", "night", "changed", "api", False),
    ("topic", "topic", "Offers (offers)", "created", "command", False),
    ("cap", "cap", "vip / email", "changed", "api", False),
    ("control_group", None, "control group", "changed", "admin", True),
    ("rule", 999, "gone", "deleted", "admin", False),
    ("experiment", "experiment", "3 or 5", "stopped", "api", True),
]


@pytest.mark.django_db(transaction=True)
def test_every_change_moves_into_the_one_history_and_back():
    apps = migrate(OLD)
    try:
        ids = old_histories(apps)
        apps = migrate(MOVED)
        changes = list(apps.get_model("limits", "SettingChange").objects.order_by("id"))
        expected = [
            (kind, ids.get(obj, obj) if isinstance(obj, str) else obj, label, action, via,
             ids["user"] if by else None, at(n + 1))
            for n, (kind, obj, label, action, via, by) in enumerate(MOVED_ROWS)
        ]  # fmt: skip
        assert [
            (c.kind, c.object_id, c.object_label, c.action, c.via, c.by_id, c.at) for c in changes
        ] == expected
        cap_created, cap_changed = changes[0], changes[4]
        assert cap_created.before is None
        assert cap_created.after == {"segment": "vip", "channel": "email", "daily": 2,
                                     "weekly": None}  # fmt: skip
        assert cap_changed.before["daily"] == 2 and cap_changed.after["daily"] == 3
        assert cap_changed.words == "24 h / 7 d: 2 / none → 3 / none"
        assert changes[2].words == "spread_minutes: 0 → 30"
        assert changes[5].before == {"share": 0.0} and changes[5].after == {"share": 0.05}
        assert changes[6].before == {"id": 999, "name": "gone", "limit": 4}
        assert changes[7].words == "Stopped."
        for model in ("CapChange", "RuleChange", "HoldoutChange", "ExperimentChange"):
            assert not apps.get_model("limits", model).objects.exists()

        apps = migrate(OLD)  # and back
        assert not apps.get_model("limits", "SettingChange").objects.exists()
        caps = apps.get_model("limits", "CapChange").objects.order_by("changed_at")
        assert [
            (c.cap_id, c.segment_slug, c.channel, c.old_daily, c.new_daily, c.via,
             c.changed_by_id, c.changed_at) for c in caps
        ] == [
            (ids["cap"], "vip", "email", None, 2, "admin", ids["user"], at(1)),
            (ids["cap"], "vip", "email", 2, 3, "api", None, at(5)),
        ]  # fmt: skip
        rules = apps.get_model("limits", "RuleChange").objects.order_by("changed_at")
        assert [(r.rule_id, r.label, r.action, r.before, r.changed_at) for r in rules] == [
            (ids["rule"], "1 a day", "created", None, at(2)),
            (None, "gone", "deleted", {"id": 999, "name": "gone", "limit": 4}, at(7)),
        ]
        (quiet,) = apps.get_model("limits", "QuietHoursChange").objects.all()
        assert (quiet.quiet_hours_id, quiet.after) == (ids["quiet"], {"id": ids["quiet"],
                                                                      "spread_minutes": 30})  # fmt: skip
        (topic,) = apps.get_model("limits", "TopicChange").objects.all()
        assert (topic.topic_id, topic.via, topic.changed_at) == (ids["topic"], "command", at(4))
        (holdout,) = apps.get_model("limits", "HoldoutChange").objects.all()
        assert (holdout.after, holdout.changed_by_id) == ({"share": 0.05}, ids["user"])
        (experiment,) = apps.get_model("limits", "ExperimentChange").objects.all()
        assert (experiment.experiment_id, experiment.action, experiment.words) == (
            ids["experiment"], "stopped", "Stopped."
        )  # fmt: skip
    finally:
        migrate()
