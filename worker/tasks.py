"""Celery tasks of the worker (queue `sends`): each calls the work in `worker.chunks`."""

import logging
import time
from datetime import datetime

from celery import Task, shared_task
from django.db import DatabaseError

from gatekeeper.lib.instants import instant_from_text
from worker.backtest import backtest_part_run
from worker.chunks import (
    ChunkBusy,
    chunk_failed,
    chunk_run_later,
    chunks_due,
    send_chunk_fail,
    send_chunk_run,
    waiting_close,
)
from worker.delivery import dead_addresses
from worker.delivery.mailbox_settings import brakes_check
from worker.plan import plan_refresh
from worker.preparing import jobs_preparing_stalled, send_job_part_run, send_job_prepare_run
from worker.rounds import round_project, rounds_close_due
from worker.scheduling import jobs_start_due
from worker.stopping import WorkerStopping
from worker.timings import timed

logger = logging.getLogger(__name__)

MAX_RETRIES = 8  # with the backoff below: about 25 minutes of trying before giving up
# With the database away too, a failed chunk waits this long at most in its task before it is
# queued again (nothing else can run meanwhile: every chunk needs the database).
DATABASE_AWAY_WAIT = 30.0


def _instant(now: str | None) -> datetime | None:
    """A task's `now` (ISO 8601 with its offset, as JSON carries it), or None: the clock."""
    return None if now is None else instant_from_text(now)


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_RETRIES)
def send_chunk(self: Task, chunk_id: int, now: str | None = None) -> dict[str, int]:
    """Gate and dispatch one chunk of a send job. Redelivered after a worker dies; the message
    ids make the rerun send only what had not gone out.

    An error (database or Redis gone mid-chunk) runs the chunk again after a backoff instead of
    dropping it; after the last its recipients are counted as failed on the job, so a campaign
    never stalls with sends that silently went nowhere. The run again waits in the database
    (worker.chunks.chunk_run_later: beat queues it when due), not in the broker as a countdown,
    which a worker killed while holding it would keep for the broker's visibility timeout;
    only when the database is away too does the broker hold it.

    `now` (tests, replays; ISO 8601 with its offset): the instant the chunk is run at, passed
    to `send_chunk_run`, the gate's clock included. Production never passes it. A bad `now`
    fails the task at once, before the chunk is touched: it is not the chunk's failure."""
    instant = _instant(now)
    try:
        return send_chunk_run(chunk_id=chunk_id, now=instant)
    except ChunkBusy as busy:
        # Another delivery runs it (or ran it and died): look again when its lease ends,
        # spending none of its retries.
        chunk_run_later(chunk_id, seconds=busy.retry_in, now=instant)
        return {}
    except WorkerStopping as stopped:
        # This worker stops (worker/stopping.py): the chunk, its lease given back, goes to
        # another worker now, not when a lease would have run out.
        logger.info("%s", stopped)
        send_chunk.apply_async((chunk_id,), {"now": now})
        return {}
    except Exception as exc:
        try:
            failures: int | None = chunk_failed(chunk_id)
        except DatabaseError:
            failures = None  # the database is away too: the broker holds the retry
        tried = self.request.retries + 1 if failures is None else failures
        if tried > MAX_RETRIES:
            logger.exception(
                "Chunk %s failed %d times; its unsent recipients count as failed",
                chunk_id,
                tried,
            )
            send_chunk_fail(chunk_id=chunk_id, error=f"{type(exc).__name__}: {exc}")
            raise
        backoff = min(600, 5 * 2 ** (tried - 1))
        logger.warning(
            "Chunk %s met %s: %s; trying again in %d s", chunk_id, type(exc).__name__, exc, backoff
        )
        if failures is None:
            # Waited here, then queued again to run at once: a message with a countdown would
            # be held by one worker until due, and lost with it for hours if it were killed.
            time.sleep(min(backoff, DATABASE_AWAY_WAIT))
            raise self.retry(exc=exc, countdown=0) from exc
        chunk_run_later(chunk_id, seconds=backoff, now=instant)
        return {}


@shared_task(acks_late=True, reject_on_worker_lost=True)
def send_job_prepare(job_id: int) -> int:
    """Read a job's recipients file into chunks, handing each write of them to the workers as it
    goes (worker.preparing). Redelivered after a worker dies: the next run reads the file again
    from the start. Returns how many chunks it queued."""
    queued = 0

    def hand_out(ids: list[int]) -> None:
        nonlocal queued
        send_chunks(ids)
        queued += len(ids)

    def read_parts(job: int, indexes: list[int]) -> None:
        for index in indexes:
            send_job_prepare_part.delay(job, index)

    hand_out(send_job_prepare_run(job_id=job_id, hand_out=hand_out, read_parts=read_parts))
    return queued


@shared_task(acks_late=True, reject_on_worker_lost=True)
def send_job_prepare_part(job_id: int, index: int) -> bool:
    """Read one part of a job's campaign file into staged chunks, for the run that reads the
    job's file to take in (worker.preparing). A part that run or another already read, or whose
    job ended, is left alone (False); one whose worker died is read by that run."""
    return send_job_part_run(job_id=job_id, index=index)


def send_chunks(chunk_ids: list[int], *, now: str | None = None) -> None:
    """Queue a task per chunk (with `now`, each is run at that instant)."""
    with timed("chunking"):
        for chunk_id in chunk_ids:
            if now is None:
                send_chunk.delay(chunk_id)
            else:
                send_chunk.delay(chunk_id, now=now)


@shared_task
def send_chunks_due(now: str | None = None) -> int:
    """Beat, every 10 s: end the waiting sends of jobs that expired or were cancelled (whatever
    their release), hand out again the files no run reads, then queue deferred and retried
    chunks whose time has come, and lost ones.
    Returns how many chunks it queued.

    `now` (tests, replays; ISO 8601 with its offset) judges expiry and due dates at that instant
    and runs the queued chunks at it too; beat passes none."""
    instant = _instant(now)
    try:
        waiting_close(now=instant)
    except Exception:
        # Closing ended waiting sends can wait for the next tick; queueing due chunks cannot.
        logger.exception("Could not end the waiting sends of expired or cancelled jobs")
    for job_id in jobs_preparing_stalled(now=instant):
        send_job_prepare.delay(job_id)
    ids = chunks_due(now=instant)
    send_chunks(ids, now=now)
    return len(ids)


@shared_task
def send_jobs_start_due(now: str | None = None) -> int:
    """Beat, every 2 s: start the scheduled jobs whose `start_at` has come (worker.scheduling)
    and queue their chunks. Returns how many chunks it queued. `now` as send_chunks_due's."""
    ids = jobs_start_due(now=_instant(now))
    send_chunks(ids, now=now)
    return len(ids)


@shared_task
def rounds_decide_due(now: str | None = None) -> int:
    """Beat, every 5 s: decide the rounds whose closing time has come (worker.rounds), one run
    per round under its lease; a round that cannot be decided now (Redis or the snapshot away)
    is tried again once its lease runs out. Returns how many it decided."""
    return len(rounds_close_due(now=_instant(now)))


@shared_task
def mailbox_brakes() -> list[str]:
    """Beat, every 15 s: pause the mailbox providers whose complaints or hard bounces reach
    their brake (worker/delivery/brakes.py). Returns the groups it paused."""
    return brakes_check()


@shared_task
def round_project_run(round_id: int, values: dict[str, float] | None = None) -> None:
    """The admin's or the API's ask: what the round would choose now, with some jobs' values
    tried (job id -> value), kept on the round (worker.rounds.round_project)."""
    round_project(round_id, values={int(job): v for job, v in (values or {}).items()})


@shared_task
def plan_refresh_due(force: bool = False) -> bool:
    """Beat, every 30 s (and the plan's API when it finds the plan stale): make the plan of the
    scheduled jobs again if a job, a rule or the snapshot changed, or it is older than
    worker.plan.PLAN_MAX_AGE; one process at a time. True when this run made it."""
    return plan_refresh(force=force)


@shared_task
def dead_addresses_report_due() -> int:
    """POST the dead addresses not reported yet to GATEKEEPER_DEAD_ADDRESS_WEBHOOK (beat)."""
    return dead_addresses.dead_addresses_report_due()


@shared_task(acks_late=True, reject_on_worker_lost=True)
def backtest_part(backtest_id: int, index: int) -> bool:
    """Replay one part of a backtest (worker/backtest.py); the last part done merges them. A
    part already done, or of a backtest that failed, is left alone (False)."""
    return backtest_part_run(backtest_id=backtest_id, index=index)
