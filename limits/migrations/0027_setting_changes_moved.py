"""Every change kept so far moved into the one history (SettingChange): the caps' (CapChange),
the rules', quiet hours' and topics' (their ChangeRecord tables), the control group's
(HoldoutChange) and the experiments' (ExperimentChange), in the order they were made; and back
again when the migration is reversed. A cap's old and new limits become its JSON before and
after; a first change of a cap is its creation."""

from typing import Any

from django.db import migrations

# (kind, change model, its foreign key to the object) of the authored kinds.
AUTHORED = (
    ("rule", "RuleChange", "rule"),
    ("quiet_hours", "QuietHoursChange", "quiet_hours"),
    ("topic", "TopicChange", "topic"),
)


def _none(value: Any) -> str:
    return "none" if value is None else str(value)


def _words(action: str, before: Any, after: Any) -> str:
    """The change in plain words, as well as this migration can say it without the app."""
    if action == "created":
        return "Created."
    if action == "deleted":
        return "Deleted."
    before, after = before or {}, after or {}
    changed = [
        f"{key}: {_none(before.get(key))} → {_none(after.get(key))}"
        for key in after
        if before.get(key) != after.get(key)
    ]
    return "; ".join(changed) or "Nothing visible changed."


def _cap_json(slug: str, channel: str, daily: Any, weekly: Any) -> dict[str, Any]:
    return {"segment": slug, "channel": channel, "daily": daily, "weekly": weekly}


def moved_in(apps: Any, schema_editor: Any) -> None:
    SettingChange = apps.get_model("limits", "SettingChange")
    found: list[tuple[Any, int, int, dict[str, Any]]] = []  # (at, source, old id, row)
    seen_caps: set[tuple[str, str]] = set()
    for change in apps.get_model("limits", "CapChange").objects.order_by("changed_at", "id"):
        scope = (change.segment_slug, change.channel)
        action = "changed" if scope in seen_caps else "created"
        seen_caps.add(scope)
        before = (
            _cap_json(*scope, change.old_daily, change.old_weekly) if action == "changed" else None
        )
        after = _cap_json(*scope, change.new_daily, change.new_weekly)
        row = {
            "kind": "cap", "object_id": change.cap_id, "object_label": " / ".join(scope),
            "action": action, "before": before, "after": after,
            "words": f"24 h / 7 d: {_none(change.old_daily)} / {_none(change.old_weekly)} → "
            f"{_none(change.new_daily)} / {_none(change.new_weekly)}",
            "via": change.via, "by_id": change.changed_by_id, "at": change.changed_at,
        }  # fmt: skip
        found.append((change.changed_at, 0, change.pk, row))
    for source, (kind, model, link) in enumerate(AUTHORED, start=1):
        for change in apps.get_model("limits", model).objects.all():
            object_id = getattr(change, f"{link}_id")
            if object_id is None:  # deleted since: its id is in its JSON, when it shows one
                object_id = (change.before or change.after or {}).get("id")
            row = {
                "kind": kind, "object_id": object_id, "object_label": change.label,
                "action": change.action, "before": change.before, "after": change.after,
                "words": _words(change.action, change.before, change.after),
                "via": change.via, "by_id": change.changed_by_id, "at": change.changed_at,
            }  # fmt: skip
            found.append((change.changed_at, source, change.pk, row))
    for change in apps.get_model("limits", "HoldoutChange").objects.all():
        action = "created" if change.before is None else "changed"
        row = {
            "kind": "control_group", "object_id": None, "object_label": "control group",
            "action": action, "before": change.before, "after": change.after,
            "words": _words(action, change.before, change.after),
            "via": change.via, "by_id": change.changed_by_id, "at": change.changed_at,
        }  # fmt: skip
        found.append((change.changed_at, 4, change.pk, row))
    for change in apps.get_model("limits", "ExperimentChange").objects.select_related(
        "experiment"
    ):
        row = {
            "kind": "experiment", "object_id": change.experiment_id,
            "object_label": (change.after or {}).get("name") or change.experiment.name,
            "action": change.action, "before": change.before, "after": change.after,
            "words": change.words, "via": change.via, "by_id": change.changed_by_id,
            "at": change.changed_at,
        }  # fmt: skip
        found.append((change.changed_at, 5, change.pk, row))
    found.sort(key=lambda f: f[:3])
    SettingChange.objects.bulk_create(SettingChange(**row) for *_, row in found)
    for model in ("CapChange", *(m for _, m, _ in AUTHORED), "HoldoutChange", "ExperimentChange"):
        apps.get_model("limits", model).objects.all().delete()


def _dated(model: Any, made: list[tuple[Any, Any]]) -> None:
    """Put back each change's own time (the old tables stamp the time of the insert)."""
    for row, at in made:
        model.objects.filter(pk=row.pk).update(changed_at=at)


def moved_out(apps: Any, schema_editor: Any) -> None:
    SettingChange = apps.get_model("limits", "SettingChange")
    exists = {
        name: set(apps.get_model("limits", name).objects.values_list("pk", flat=True))
        for name in ("Cap", "Rule", "QuietHours", "Topic", "Experiment")
    }
    made: dict[str, list[tuple[Any, Any]]] = {}

    def put(model: str, at: Any, **fields: Any) -> None:
        row = apps.get_model("limits", model).objects.create(**fields)
        made.setdefault(model, []).append((row, at))

    links = {kind: (model, link) for kind, model, link in AUTHORED}
    owners = {"rule": "Rule", "quiet_hours": "QuietHours", "topic": "Topic"}
    for change in SettingChange.objects.order_by("at", "id"):
        common = {"via": change.via, "changed_by_id": change.by_id}
        if change.kind == "cap":
            before, after = change.before or {}, change.after or {}
            put(
                "CapChange", change.at, **common,
                cap_id=change.object_id if change.object_id in exists["Cap"] else None,
                segment_slug=after.get("segment") or before.get("segment") or "",
                channel=after.get("channel") or before.get("channel") or "",
                old_daily=before.get("daily"), old_weekly=before.get("weekly"),
                new_daily=after.get("daily"), new_weekly=after.get("weekly"),
            )  # fmt: skip
        elif change.kind in links:
            model, link = links[change.kind]
            alive = change.object_id in exists[owners[change.kind]]
            put(
                model, change.at, **common,
                **{f"{link}_id": change.object_id if alive and change.action != "deleted" else None},
                action=change.action, before=change.before, after=change.after,
                label=change.object_label[:100],
            )  # fmt: skip
        elif change.kind == "control_group":
            put("HoldoutChange", change.at, **common, before=change.before, after=change.after)
        elif change.kind == "experiment" and change.object_id in exists["Experiment"]:
            put(
                "ExperimentChange", change.at, **common, experiment_id=change.object_id,
                action=change.action, before=change.before, after=change.after or {},
                words=change.words,
            )  # fmt: skip
        # A webhook endpoint's changes had no table before: they go.
    for model, rows in made.items():
        _dated(apps.get_model("limits", model), rows)
    SettingChange.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("limits", "0026_setting_changes")]

    operations = [migrations.RunPython(moved_in, moved_out)]
