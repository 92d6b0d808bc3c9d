"""Celery tasks of the segments app (queue `builds`): each loads its row and calls the work."""

import logging

from celery import Task, shared_task

from segments import user_lists
from segments.models import Build
from segments.publishing import BuildBusy, build_run

logger = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True, max_retries=60)
def build_snapshot(self: Task, build_id: int) -> str:
    """Build and publish a snapshot. Redelivered after a worker dies (acks_late), it starts the
    build over; while another process holds the publish lock it waits by retrying."""
    try:
        build = build_run(build_id=build_id)
    except Build.DoesNotExist:
        logger.warning("Build #%s does not exist (any more): nothing to build", build_id)
        return ""
    except BuildBusy as exc:
        raise self.retry(exc=exc, countdown=10) from exc
    return build.version


@shared_task(acks_late=True)
def user_list_validate(user_list_id: int) -> str:
    """Validate a large uploaded list the web process stored unchecked."""
    user_list = user_lists.user_list_validate(user_list_id=user_list_id)
    return user_list.status if user_list is not None else "gone"


@shared_task
def user_lists_stalled() -> int:
    """Beat, every 5 minutes: queue again validations whose task was lost."""
    ids = user_lists.user_lists_stalled()
    for user_list_id in ids:
        user_list_validate.delay(user_list_id)
    return len(ids)
