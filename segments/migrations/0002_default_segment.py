from django.db import migrations

# The default segment sorts last: any list a user is in wins over it.
DEFAULT_PRIORITY = 1_000_000


def create_default_segment(apps, schema_editor):  # type: ignore[no-untyped-def]
    Segment = apps.get_model("segments", "Segment")
    Segment.objects.get_or_create(
        slug="default",
        defaults={
            "name": "Everyone else",
            "priority": DEFAULT_PRIORITY,
            "is_default": True,
            "description": "Users who are in no segment's list.",
        },
    )


class Migration(migrations.Migration):
    dependencies = [("segments", "0001_initial")]

    operations = [migrations.RunPython(create_default_segment, migrations.RunPython.noop)]
