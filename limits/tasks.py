"""Celery tasks of the limits app: each calls the work in `limits.upkeep`."""

import logging

from celery import shared_task

from limits.upkeep import send_logs_sweep_run

logger = logging.getLogger(__name__)


# A run still queued when the next is due is dropped: the next one continues the same walk.
@shared_task(expires=60)
def send_logs_sweep() -> int:
    """Beat, every minute: the next stretch of the walk over every bucket of send logs, dropping
    the users whose newest send has left the retention. Returns how many were dropped."""
    report = send_logs_sweep_run()
    logger.info(
        "Send logs swept: %d buckets looked at, %d users dropped, %d empty buckets deleted",
        report.buckets,
        report.dropped,
        report.emptied,
    )
    return report.dropped
