import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.db import transaction

from limits.models.policy import Cap
from segments.models import DefaultSegmentProtected, Segment


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_default_segment_exists_after_migrating():
    default = Segment.objects.get(is_default=True)
    assert default.slug == "default"


@pytest.mark.django_db
def test_the_default_segment_cannot_be_deleted():
    default = Segment.objects.get(is_default=True)
    with pytest.raises(DefaultSegmentProtected), transaction.atomic():
        default.delete()
    with pytest.raises(DefaultSegmentProtected), transaction.atomic():
        Segment.objects.all().delete()
    assert Segment.objects.filter(is_default=True).exists()


@pytest.mark.django_db
def test_a_cap_names_a_known_channel():
    from django.core.exceptions import ValidationError

    default = Segment.objects.get(is_default=True)
    cap = Cap(segment=default, channel="fax", daily=1)
    with pytest.raises(ValidationError, match="Unknown channel 'fax'"):
        cap.full_clean()


@pytest.mark.django_db
def test_migrations_match_the_models():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


# --- the periodic tasks' lines (GATEKEEPER_PERIODIC_LOG_LEVEL, worker/celery_hooks.py) ----------

ROOT = Path(__file__).resolve().parents[2]
PERIODIC = "limits.tasks.webhooks_deliver_due"  # due every second
CHUNK = "worker.tasks.send_chunk"  # a send job's chunk: not periodic

# What Celery's worker and beat do at start-up (Celery takes the root logger over at --loglevel
# INFO, then tells the project: after_setup_logger), then Celery's own calls that write its
# routine lines, each for a periodic task and for a send job's chunk.
CELERY_LINES = f"""
import django, logging
django.setup()
from gatekeeper.celery import app
app.log.setup(loglevel="INFO")
from celery import beat
from celery.app import trace
from celery.worker import request, strategy
beat.info("Scheduler: Sending due task %s (%s)", "webhooks-deliver-due", "{PERIODIC}")
logging.getLogger("celery.beat").info("beat: Starting...")
for name in ("{PERIODIC}", "{CHUNK}"):
    context = {{"id": "t1", "name": name, "args": "()", "kwargs": "{{}}", "eta": None}}
    strategy.logger.info(trace.LOG_RECEIVED, context, extra={{"data": context}})
    trace.info(trace.LOG_SUCCESS, {{**context, "return_value": "0", "runtime": 0.01}})
    request.info("Discarding revoked task: %s[%s]", name, "t2")
trace.logger.error(
    trace.LOG_FAILURE,
    {{"id": "t3", "name": "{PERIODIC}", "description": "raised unexpected", "exc": "boom"}},
)
logging.getLogger("worker.scheduling").info("Job 7 started: 2 chunks handed out")
"""


def celery_lines(**env: str) -> list[str]:
    """The lines CELERY_LINES writes with the project's settings and `env`, without their time
    and process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    environ.update(DJANGO_SETTINGS_MODULE="gatekeeper.settings", PYTHONPATH=str(ROOT), **env)
    done = subprocess.run(
        [sys.executable, "-c", CELERY_LINES],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line.partition("] ")[2] or line for line in done.stderr.splitlines()]


@pytest.mark.processes
def test_celerys_lines_about_periodic_tasks_are_written_only_when_asked() -> None:
    quiet = celery_lines()
    assert quiet == [
        # Beat's own, a chunk's, an error (even a periodic task's), and the project's own.
        "beat: Starting...",
        f"Task {CHUNK}[t1] received",
        f"Task {CHUNK}[t1] succeeded in 0.01s: 0",
        f"Discarding revoked task: {CHUNK}[t2]",
        f"Task {PERIODIC}[t3] raised unexpected: boom",
        "Job 7 started: 2 chunks handed out",
    ]
    shown = celery_lines(GATEKEEPER_PERIODIC_LOG_LEVEL="INFO")
    assert f"Scheduler: Sending due task webhooks-deliver-due ({PERIODIC})" in shown
    for line in (f"Task {PERIODIC}[t1] received", f"Task {PERIODIC}[t1] succeeded in 0.01s: 0"):
        assert line in shown
    assert set(quiet) < set(shown) and len(shown) == len(quiet) + 4
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "gatekeeper.settings",
             "PYTHONPATH": str(ROOT), "GATEKEEPER_PERIODIC_LOG_LEVEL": "loud"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "GATEKEEPER_PERIODIC_LOG_LEVEL is 'LOUD': DEBUG, INFO, WARNING, ERROR or" in done.stderr


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("level", [None, "INFO"], ids=["default", "INFO"])
def test_a_real_beat_and_worker_write_the_periodic_lines_only_when_asked(
    level: str | None, tmp_path: Path
) -> None:
    """A beat and a worker as `make run` starts them (--loglevel INFO): the worker takes a
    periodic task and then a chunk from one queue, in that order; beat sends its ticks to the
    upkeep queue, which nothing takes here."""
    from gatekeeper.celery import app
    from tests.support.celery_workers import start_celery_worker, stop_celery_worker, worker_env
    from tests.support.worker_processes import TEST_BROKER_URL, wait_for

    broker = redis.Redis.from_url(TEST_BROKER_URL)
    broker.flushdb()
    env = worker_env(TEST_BROKER_URL, GATEKEEPER_KEY_PREFIX="periodiclines:")
    env.pop("GATEKEEPER_PERIODIC_LOG_LEVEL", None)
    if level is not None:
        env["GATEKEEPER_PERIODIC_LOG_LEVEL"] = level
    beat_log, worker_log = tmp_path / "beat.log", tmp_path / "worker.log"
    with beat_log.open("ab") as output:
        beat = subprocess.Popen(
            [str(Path(sys.executable).parent / "celery"), "-A", "gatekeeper", "beat",
             "--loglevel", "INFO", "--pidfile", str(tmp_path / "beat.pid")],
            cwd=ROOT, env=env, start_new_session=True, stdout=output, stderr=output,
        )  # fmt: skip
    worker = start_celery_worker("periodiclines", env, log=worker_log)
    try:
        app.send_task(PERIODIC, queue="periodiclines")
        app.send_task(CHUNK, args=[2**40], queue="periodiclines")  # no such chunk: done at once
        wait_for(
            lambda: any(
                f"{CHUNK}[" in line and "succeeded" in line
                for line in worker_log.read_text().splitlines()
            ),
            seconds=90,
            what="the worker to run the chunk",
        )
        wait_for(lambda: broker.llen("upkeep") >= 3, seconds=60, what="beat to send its ticks")
    finally:
        stop_celery_worker(worker)
        stop_celery_worker(beat)
    worker_lines, beat_lines = worker_log.read_text(), beat_log.read_text()
    assert f"Task {CHUNK}[" in worker_lines and "beat: Starting..." in beat_lines
    asked = level == "INFO"
    assert (f"Task {PERIODIC}[" in worker_lines) is asked, worker_lines
    assert ("Scheduler: Sending due task" in beat_lines) is asked, beat_lines
