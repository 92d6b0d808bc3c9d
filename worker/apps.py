from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "worker"
    verbose_name = "Sends"

    def ready(self) -> None:
        # Connects the Celery worker signals. Imported here: the hooks' modules import models,
        # which the app registry allows only once it is ready.
        from worker import (
            celery_hooks,  # noqa: F401
            throttle,  # noqa: F401  (registers the provider rates' check)
        )
