"""Each classic cap becomes its two rules (rolling 24 h and 7 d, every send), as cap_set keeps
them from now on. Reversing removes the classic rules; the caps stay."""

from django.db import migrations

WINDOWS = (("daily", 86_400), ("weekly", 604_800))


def caps_to_rules(apps, schema_editor):
    Cap = apps.get_model("limits", "Cap")
    Rule = apps.get_model("limits", "Rule")
    RuleChange = apps.get_model("limits", "RuleChange")
    for cap in Cap.objects.select_related("segment"):
        scope = "all channels together" if cap.channel == "all" else cap.channel
        for which, seconds in WINDOWS:
            limit = getattr(cap, which)
            if limit is None or Rule.objects.filter(cap=cap, window_seconds=seconds).exists():
                continue
            rule = Rule.objects.create(
                cap=cap,
                name=f"{cap.segment.name}: {which} cap on {scope}",
                segment=cap.segment,
                channel=cap.channel,
                match="any",
                window_kind="rolling",
                window_seconds=seconds,
                limit=limit,
            )
            RuleChange.objects.create(
                rule=rule,
                rule_name=rule.name,
                action="created",
                after={
                    "id": rule.pk,
                    "name": rule.name,
                    "segment": cap.segment.slug,
                    "channel": cap.channel,
                    "match": "any",
                    "tag": None,
                    "window": {"kind": "rolling", "seconds": seconds},
                    "limit": limit,
                    "reserve": None,
                    "enabled": True,
                    "classic": True,
                },
                via="migration",
            )


def remove_classic_rules(apps, schema_editor):
    apps.get_model("limits", "Rule").objects.filter(cap__isnull=False).delete()


class Migration(migrations.Migration):
    dependencies = [("limits", "0006_rules")]

    operations = [migrations.RunPython(caps_to_rules, remove_classic_rules)]
