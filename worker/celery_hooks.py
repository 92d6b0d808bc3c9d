"""Celery worker signals: the snapshot is loaded in the parent, followed in each child; the
database connection is kept between tasks; logs as JSON when GATEKEEPER_LOG_FORMAT says so, and
Celery's routine lines about the periodic tasks only from GATEKEEPER_PERIODIC_LOG_LEVEL."""

import gc
import logging
import os
from collections.abc import Iterable
from typing import Any

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from django.conf import settings
from django.db import close_old_connections

from gatekeeper.lib.json_logs import json_formatter
from worker import latency, stats, timings
from worker.delivery import answers
from worker.startup import after_fork, load_snapshot


@worker_init.connect
def _load_in_parent(sender: Any = None, **kwargs: Any) -> None:
    # Only a prefork pool forks children that follow on their own (worker_process_init); with
    # the solo or threads pool this process gates itself and follows lazily, on first use.
    pool = getattr(sender, "pool_cls", "prefork")
    name = pool if isinstance(pool, str) else f"{pool.__module__}.{pool.__name__}"
    if "prefork" not in name.lower():
        return
    # GATEKEEPER_LOAD_SNAPSHOT_IN_PARENT=0 only exists to measure the alternative (bench memory).
    if os.environ.get("GATEKEEPER_LOAD_SNAPSHOT_IN_PARENT", "1") != "0":
        load_snapshot(role="worker")
    # What the parent made before forking (Django, the snapshot) is never collected: kept out
    # of the collector's walks, its pages stay shared with the children instead of copied.
    gc.freeze()


@worker_process_init.connect
def _follow_in_child(**kwargs: Any) -> None:
    after_fork(role="worker")
    gc.freeze()


@task_prerun.connect
def _fresh_connections(sender: Any = None, **kwargs: Any) -> None:
    # As Django does per request: a connection past DATABASE_CONN_MAX_AGE or broken by an
    # error is closed, the next query opens another. Not for a task run eagerly, in the
    # caller's process and perhaps inside its transaction (as Celery's own closing skips it).
    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


@worker_process_shutdown.connect
def _write_counts(**kwargs: Any) -> None:
    stats.flush()
    timings.flush()
    latency.flush()
    answers.flush()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_logs(logger: logging.Logger | None = None, **kwargs: Any) -> None:
    # Celery's worker and beat set up logging their own way (the root logger taken over, its
    # own format): with GATEKEEPER_LOG_FORMAT=json their lines are JSON like the rest.
    if settings.GATEKEEPER_LOG_FORMAT == "json" and logger is not None:
        for handler in logger.handlers:
            handler.setFormatter(json_formatter())


# Where Celery writes its routine lines about a task (celery 5), all at INFO: beat's "Scheduler:
# Sending due task <entry> (<task>)" (celery.beat); a worker's "Task <name>[<id>] received"
# (celery.worker.strategy), "... succeeded in ...", "... retry", "... ignored" (celery.app.trace),
# whose records carry the task's name in their `data` extra (the context Celery formats them
# with), and "Discarding revoked task: <name>[<id>]" (celery.worker.request: a task that expired
# in the queue, as a periodic tick does while its worker starts), the name its first argument.
PERIODIC_LOGGERS = (
    "celery.beat",
    "celery.worker.strategy",
    "celery.app.trace",
    "celery.worker.request",
)
BEAT_SENDING = "Scheduler: Sending due task"
DISCARDING = "Discarding revoked task"


class PeriodicTaskLines(logging.Filter):
    """Drops Celery's routine records about periodic tasks below `level`: beat's sending of any
    due task, and a worker's records about one of `tasks`. Every other record passes: a send
    job's chunks, errors and warnings (at or above `level`), everything not Celery's."""

    def __init__(self, level: int, tasks: Iterable[str]) -> None:
        super().__init__()
        self.level = level
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        message = str(record.msg)
        if record.name == "celery.beat":
            return not message.startswith(BEAT_SENDING)
        if record.name == "celery.worker.request":
            args = record.args if isinstance(record.args, tuple) else ()
            return not (message.startswith(DISCARDING) and args[:1] and args[0] in self.tasks)
        data = getattr(record, "data", None)
        return not (isinstance(data, dict) and data.get("name") in self.tasks)


def periodic_lines_filtered() -> None:
    """Put PeriodicTaskLines, at GATEKEEPER_PERIODIC_LOG_LEVEL, on the loggers that write those
    lines (replacing one put there before), for the tasks of CELERY_BEAT_SCHEDULE."""
    level = logging.getLevelNamesMapping()[settings.GATEKEEPER_PERIODIC_LOG_LEVEL]
    tasks = {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    for name in PERIODIC_LOGGERS:
        logger = logging.getLogger(name)
        for earlier in [f for f in logger.filters if isinstance(f, PeriodicTaskLines)]:
            logger.removeFilter(earlier)
        logger.addFilter(PeriodicTaskLines(level, tasks))


@after_setup_logger.connect
def _periodic_lines(**kwargs: Any) -> None:
    # Once Celery's worker or beat has set up its logging (its children inherit the filters).
    periodic_lines_filtered()
