"""Celery tasks of the worker (queue `sends`): each calls the work in `worker.chunks`."""

import logging
from typing import Any

from celery import shared_task

from worker.chunks import ChunkBusy, chunks_due, send_chunk_fail, send_chunk_run

logger = logging.getLogger(__name__)

MAX_RETRIES = 8  # with the backoff below: about 25 minutes of trying before giving up


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_RETRIES)
def send_chunk(self: Any, chunk_id: int) -> dict[str, int]:
    """Gate and dispatch one chunk of a send job. Redelivered after a worker dies; the message
    ids make the rerun send only what had not gone out.

    An error (database or Redis gone mid-chunk) retries the chunk with backoff instead of
    dropping it; after the last retry its recipients are counted as failed on the job, so a
    campaign never stalls with sends that silently went nowhere."""
    try:
        return send_chunk_run(chunk_id=chunk_id)
    except ChunkBusy as busy:
        # Another delivery runs it (or ran it and died): look again when its lease ends. A new
        # message, not a retry, so it spends none of the retries.
        send_chunk.apply_async((chunk_id,), countdown=busy.retry_in)
        return {}
    except Exception as exc:
        if self.request.retries >= MAX_RETRIES:
            logger.exception(
                "Chunk %s failed %d times; its unsent recipients count as failed",
                chunk_id,
                MAX_RETRIES + 1,
            )
            send_chunk_fail(chunk_id=chunk_id, error=f"{type(exc).__name__}: {exc}")
            raise
        logger.warning("Chunk %s met %s: %s; trying again", chunk_id, type(exc).__name__, exc)
        raise self.retry(exc=exc, countdown=min(600, 5 * 2**self.request.retries)) from exc


def send_chunks(chunk_ids: list[int]) -> None:
    """Queue a task per chunk."""
    for chunk_id in chunk_ids:
        send_chunk.delay(chunk_id)


@shared_task
def send_chunks_due() -> int:
    """Beat, every 10 s: queue deferred and retried chunks whose time has come, and lost ones."""
    ids = chunks_due()
    send_chunks(ids)
    return len(ids)
