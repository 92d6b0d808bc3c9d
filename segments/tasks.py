"""Celery tasks of the segments app (queue `builds`): thin wrappers around the services."""

from celery import shared_task

from segments.services import BuildBusy, build_run


@shared_task(bind=True, acks_late=True, max_retries=60)
def build_snapshot(self, build_id: int) -> str:
    """Build and publish a snapshot. Redelivered after a worker dies (acks_late), it starts the
    build over; while another process holds the publish lock it waits by retrying."""
    try:
        build = build_run(build_id=build_id)
    except BuildBusy as exc:
        raise self.retry(exc=exc, countdown=10) from exc
    return build.version
