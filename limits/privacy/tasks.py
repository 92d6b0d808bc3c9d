"""The privacy wing's tasks, under the names they always had (limits.tasks.*): an erasure's
run, queued when it is made, and beat's pass over the erasures that are due."""

import logging

from celery import shared_task

from limits.policy.quota import Unavailable
from limits.privacy.erasure import erasure_run, erasures_due

logger = logging.getLogger(__name__)


@shared_task(name="limits.tasks.users_erase", expires=3600)
def users_erase(erasure_id: int) -> str | None:
    """An erasure's run, queued when it is made (limits.privacy.erasure). Returns its status."""
    erasure = erasure_run(erasure_id)
    return erasure.status if erasure is not None else None


@shared_task(name="limits.tasks.users_erase_due", expires=60)
def users_erase_due() -> int:
    """Beat, every 30 s: the erasures whose next pass is due, or whose run was lost, run here.
    Returns how many ran."""
    ran = 0
    for erasure_id in erasures_due():
        try:
            ran += erasure_run(erasure_id) is not None
        except Unavailable:
            logger.warning("Erasure %d waits for Redis", erasure_id)
    return ran
