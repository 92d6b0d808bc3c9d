"""Celery tasks of the worker (queue `sends`): thin wrappers around the services."""

from celery import shared_task

from worker.services import send_chunk_run


@shared_task(acks_late=True, reject_on_worker_lost=True)
def send_chunk(chunk_id: int) -> dict[str, int]:
    """Gate and dispatch one chunk of a send job. Redelivered after a worker dies; the message
    ids make the rerun send only what had not gone out."""
    return send_chunk_run(chunk_id=chunk_id)
