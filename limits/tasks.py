"""Celery tasks of the limits app: each calls the work in `limits.engine.upkeep`."""

import logging

from celery import shared_task
from django.conf import settings

from limits.engine.limiter import get_limiter
from limits.engine.upkeep import logs_sweep
from limits.ledger.drain import ledger_drain_all
from limits.ledger.drain import ledger_upkeep as ledger_upkeep_run
from limits.people.suppression import journal_prune
from limits.policy.selectors import policy_cache
from limits.privacy.tasks import users_erase, users_erase_due  # noqa: F401
from limits.stream.webhooks import deliveries_prune, webhook_deliver, webhooks_due

logger = logging.getLogger(__name__)


# A run still queued when the next is due is dropped: the next one continues the same walk.
@shared_task(expires=60)
def send_logs_sweep() -> int:
    """Beat, every minute: the next stretch of the walk over every bucket of send logs, dropping
    the users whose newest send has left the retention. Returns how many were dropped."""
    report = logs_sweep(
        get_limiter(),
        buckets=settings.GATEKEEPER_LOG_SWEEP_BUCKETS,
        retention_ms=policy_cache().table().retention_ms,  # the rules' retention
    )
    logger.info(
        "Send logs swept: %d buckets looked at, %d users dropped, %d empty buckets deleted",
        report.buckets,
        report.dropped,
        report.emptied,
    )
    return report.dropped


@shared_task(expires=10)
def ledger_drain() -> int:
    """Beat, every 2 s: move the gate's decisions from the ledger's Redis stream into the
    database, until the stream is empty or 10 rounds were made. Returns the decisions written
    (0 when another drainer is at work: it drains what this one would have)."""
    return ledger_drain_all(rounds=10, wait=0)


@shared_task(expires=600)
def ledger_upkeep() -> int:
    """Beat, hourly: drop the ledger's days past GATEKEEPER_LEDGER_DAYS. Returns rows or days
    dropped."""
    report = ledger_upkeep_run()
    deliveries_prune()  # the webhooks' attempts, kept a week
    if report.dropped_days or report.deleted_rows:
        logger.info(
            "Ledger upkeep: %d days dropped, %d rows deleted",
            len(report.dropped_days),
            report.deleted_rows,
        )
    return len(report.dropped_days) + report.deleted_rows


@shared_task(expires=3600)
def suppression_journal_prune() -> int:
    """Beat, daily: drop the suppression journal's changes older than 30 days (the list stays;
    processes only ever read its last seconds)."""
    return journal_prune()


# Queued again every second while due: a run still queued by then is dropped.
@shared_task(expires=10)
def webhook_run(endpoint_id: int) -> int:
    """One endpoint's delivery run (limits.stream.webhooks). Returns the events it took (0 when
    another run holds it or it is not due)."""
    report = webhook_deliver(endpoint_id)
    return report.events if report is not None else 0


@shared_task(expires=2)
def webhooks_deliver_due() -> int:
    """Beat, every second: a delivery run queued for each endpoint that is due and that no run
    holds. Returns how many were queued."""
    due = webhooks_due()
    for endpoint_id in due:
        webhook_run.delay(endpoint_id)
    return len(due)
