"""Celery worker signals: the snapshot is loaded in the parent, followed in each child."""

import os
from typing import Any

from celery.signals import worker_init, worker_process_init, worker_process_shutdown

from worker import stats
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


@worker_process_init.connect
def _follow_in_child(**kwargs: Any) -> None:
    after_fork(role="worker")


@worker_process_shutdown.connect
def _write_counts(**kwargs: Any) -> None:
    stats.flush()
