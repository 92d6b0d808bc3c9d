"""Create the Marketer and Viewer groups (gatekeeper/lib/groups.py) with their permissions."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


def create_groups(apps, schema_editor):
    # Permissions are normally created after all migrations; make them now so the groups get
    # them on a fresh database.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    from gatekeeper.lib.groups import groups_sync

    groups_sync(apps)


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["Marketer", "Viewer"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("limits", "0004_alter_cap_options_quotareset"),
        ("segments", "0004_alter_build_options"),
        ("worker", "0002_chunk_error"),
    ]

    operations = [migrations.RunPython(create_groups, remove_groups)]
