from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "worker"
    verbose_name = "Sends"

    def ready(self) -> None:
        from worker import celery_hooks  # noqa: F401  (connects the worker signals)
