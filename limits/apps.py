from django.apps import AppConfig
from django.db.models.signals import post_migrate

from gatekeeper.lib.groups import groups_sync_after_migrate


class LimitsConfig(AppConfig):
    name = "limits"
    verbose_name = "Frequency caps"

    def ready(self) -> None:
        # Registers the settings checks; importable only once the app registry is ready.
        from limits import checks  # noqa: F401

        # Sent for every app; the handler acts on the last one's.
        post_migrate.connect(groups_sync_after_migrate)
