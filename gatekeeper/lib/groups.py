"""The two admin groups marketers are put in, and what each may do.

- Marketer: edit segments, user lists, caps, cap rules, quiet hours and topics; build, publish and
  roll back snapshots; add users to the suppression list and take them off; reset a user's quota;
  send a campaign file; pause, resume and cancel send jobs and their waiting sends; edit the
  mailbox providers (resuming one its brake paused) and the warm-up plans; read everything
  else the admin shows.
- Viewer: read-only.

`groups_sync` creates the groups and gives them exactly these permissions. A migration runs it
(`limits/migrations/0005_groups.py`), and so does every later `migrate` (post_migrate), so a
permission added later joins its group without a new migration. Staff in neither group (and
without permissions of their own) see an empty admin.
"""

from typing import Any

from django.apps import apps as global_apps

MARKETER, VIEWER = "Marketer", "Viewer"

_READ = [
    "segments.view_segment",
    "segments.view_userlist",
    "segments.view_build",
    "limits.view_cap",
    "limits.view_rule",
    "limits.view_quiethours",
    "limits.view_topic",
    "limits.view_preference",
    "limits.view_preferencechange",
    "limits.view_holdout",
    "limits.view_experiment",
    "limits.view_experimentarm",
    "limits.view_settingchange",
    "limits.view_quotareset",
    "limits.view_suppression",
    "limits.view_suppressionchange",
    "worker.view_sendjob",
    "worker.view_backtest",
    "worker.view_mailboxprovider",
    "worker.view_warmupplan",
]
GROUP_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _READ,
    MARKETER: [
        *_READ,
        "segments.add_segment",
        "segments.change_segment",
        "segments.delete_segment",
        "segments.add_userlist",
        "segments.change_userlist",
        "segments.delete_userlist",
        "segments.publish_snapshot",
        "limits.add_cap",
        "limits.change_cap",
        "limits.delete_cap",
        "limits.add_rule",
        "worker.add_backtest",
        "limits.change_rule",
        "limits.delete_rule",
        "limits.add_quiethours",
        "limits.change_quiethours",
        "limits.delete_quiethours",
        "limits.add_topic",
        "limits.change_topic",
        "limits.delete_topic",
        "limits.change_preference",
        "limits.change_holdout",
        "limits.add_experiment",
        "limits.change_experiment",
        "limits.reset_quota",
        "limits.add_suppression",
        "limits.delete_suppression",
        "worker.add_sendjob",
        "worker.cancel_sendjob",
        "worker.add_mailboxprovider",
        "worker.change_mailboxprovider",
        "worker.delete_mailboxprovider",
        "worker.add_warmupplan",
        "worker.change_warmupplan",
        "worker.delete_warmupplan",
    ],
}


def groups_sync(apps: Any = None) -> None:
    """Create Marketer and Viewer with exactly their permissions (those that exist yet)."""
    if apps is None:
        apps = global_apps
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    # Every permission a group names, read in one query (a database flushed between tests
    # syncs the groups each time).
    codenames = {code.split(".")[1] for codes in GROUP_PERMISSIONS.values() for code in codes}
    found = {
        f"{p.content_type.app_label}.{p.codename}": p
        for p in permission_model.objects.filter(codename__in=codenames).select_related(
            "content_type"
        )
    }
    for name, codes in GROUP_PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        group.permissions.set([found[code] for code in codes if code in found])


def groups_sync_after_migrate(sender: Any, **kwargs: Any) -> None:
    """post_migrate handler. The signal is sent once per app, and each app's permissions are
    created by its own signal: only the last app's comes after every permission exists."""
    with_models = [config for config in global_apps.get_app_configs() if config.models_module]
    if with_models and sender.label == with_models[-1].label:
        groups_sync()
