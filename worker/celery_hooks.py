"""Celery worker signals: the snapshot is loaded in the parent, followed in each child; the
database connection is kept between tasks; logs as JSON when GATEKEEPER_LOG_FORMAT says so."""

import gc
import logging
import os
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
