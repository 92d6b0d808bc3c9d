from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "worker"
    verbose_name = "Sends"

    def ready(self) -> None:
        # Connects the Celery worker signals. Imported here: the hooks' modules import models,
        # which the app registry allows only once it is ready.
        from anymail.signals import tracking as anymail_tracking

        from limits.stream.events import journal_register
        from worker import celery_hooks, stopping  # noqa: F401
        from worker.delivery import (
            dns,  # noqa: F401  (registers the DNS settings' check)
            registry,  # noqa: F401  (registers the dispatchers' check)
            throttle,  # noqa: F401  (registers the provider rates' check)
        )
        from worker.delivery.dead_addresses import JOURNAL
        from worker.delivery.tracking import tracking_received
        from worker.personal import places_register

        # The ESPs' tracking webhooks (bounces, complaints, unsubscribes) feed the suppression
        # list; the uid keeps it connected once however often ready() runs.
        anymail_tracking.connect(tracking_received, dispatch_uid="worker.tracking")
        # The send jobs' recipients, dead addresses and SMS numbers in a person's export.
        places_register()
        # Dead addresses are events of the event stream (type dead_address): the stream reads
        # their table as a journal, registered here, since limits imports nothing of the worker.
        # The import also registers the deprecated dead-address webhook's check (worker.W004).
        journal_register(JOURNAL)
