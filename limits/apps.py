from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save

from gatekeeper.lib.groups import groups_sync_after_migrate


class LimitsConfig(AppConfig):
    name = "limits"
    verbose_name = "Frequency caps"

    def ready(self) -> None:
        # Imported here: models, and what uses them, load only once the app registry is ready.
        from limits import checks  # noqa: F401  (registers the settings checks)
        from limits.engine import server_checks  # noqa: F401  (and the limiter's Redis's)
        from limits.ledger.listeners import drain_listen
        from limits.models.studies import Experiment
        from limits.policy.selectors import policy_cache_invalidate_on_commit
        from limits.privacy.places import places_register
        from limits.stream.events import StreamListener
        from limits.studies.drain import StudiesListener
        from segments.models import Segment

        places_register()  # this app's places of personal data (a person's export)
        # What the ledger's drain feeds, in this order, in its transaction.
        drain_listen(StreamListener())
        drain_listen(StudiesListener())
        # Sent for every app; the handler acts on the last one's.
        post_migrate.connect(groups_sync_after_migrate)
        # A segment's time zone (or its deletion, with its rules) changes the rules' table, and
        # so does an experiment's change (its arms are written in the same transaction).
        for signal in (post_save, post_delete):
            for sender in (Segment, Experiment):
                signal.connect(
                    policy_cache_invalidate_on_commit,
                    sender=sender,
                    dispatch_uid=f"limits-{sender.__name__}-{signal}",
                )
