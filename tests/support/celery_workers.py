"""Real Celery worker processes for end-to-end tests, pointed at the test's database, Redis,
snapshot store and a broker database of the test's own."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import TEST_REDIS_URL

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The test database as a DATABASE_URL a worker process can open."""
    params = connection.settings_dict
    if params["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{params['NAME']}"
    user = params.get("USER") or "postgres"
    return f"postgres://{user}@{params.get('HOST') or '127.0.0.1'}:{params.get('PORT') or 5432}/{params['NAME']}"


def worker_env(broker_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": TEST_REDIS_URL,
        "CELERY_BROKER_URL": broker_url,
        "GATEKEEPER_STORE_URL": settings.GATEKEEPER_STORE_URL,
        "GATEKEEPER_SNAPSHOT_CACHE_DIR": str(settings.GATEKEEPER_SNAPSHOT_CACHE_DIR) + "-worker",
        "MEDIA_ROOT": str(settings.MEDIA_ROOT),
        **extra,
    }


def start_celery_worker(
    queues: str, env: dict[str, str], *, log: Path | None = None, root: Path = ROOT
) -> subprocess.Popen[Any]:
    """One prefork child, in a process group of its own (so stop_celery_worker or a test's
    SIGKILL reaches the children too). With `log`, it logs at INFO level (each task's success
    and result) to that file, for a test to read. `root`: the source tree it runs (another
    release's, checked out by a test)."""
    output = open(log, "ab") if log is not None else None  # noqa: SIM115 (the child's)
    try:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "celery"), "-A", "gatekeeper", "worker",
             "-Q", queues, "-c", "1", "-P", "prefork",
             "--loglevel", "INFO" if log is not None else "WARNING",
             "--without-mingle", "--without-gossip"],
            cwd=root, env=env, start_new_session=True, stdout=output, stderr=output,
        )  # fmt: skip
    finally:
        if output is not None:
            output.close()


def release_tree(commit: str, directory: Path) -> Path:
    """The source tree of an earlier release (a commit of this repository), for a test to run
    its processes beside this version's: `git archive` of it in `directory`."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        raise LookupError(f"commit {commit} is not in this clone's history")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    return directory


def release_tree_or_skip(commit: str, tmp_path_factory: Any) -> Path:
    """release_tree in a directory of the test's own, or the test skipped when the commit is not
    in this clone (a shallow one)."""
    try:
        return release_tree(commit, tmp_path_factory.mktemp("previous"))
    except LookupError as exc:
        pytest.skip(str(exc))


def start_celery_beat(env: dict[str, str], directory: Path) -> subprocess.Popen[Any]:
    """Celery beat with the project's scheduler (django-celery-beat, in the test's database),
    queueing the project's periodic tasks on the test's broker; its pid file in `directory`."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "celery"), "-A", "gatekeeper", "beat",
         "--loglevel", "WARNING", "--pidfile", str(directory / "beat.pid")],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip


def stop_celery_worker(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def start_celery_beat_logged(
    env: dict[str, str], directory: Path, log: Path
) -> subprocess.Popen[Any]:
    """start_celery_beat, its output (WARNING and above: the lead taken and lost, with the
    time) appended to `log` for the test to read."""
    output = open(log, "ab")  # noqa: SIM115 (the child's)
    try:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "celery"), "-A", "gatekeeper", "beat",
             "--loglevel", "WARNING", "--pidfile", str(directory / "beat.pid")],
            cwd=ROOT, env=env, start_new_session=True, stdout=output, stderr=output,
        )  # fmt: skip
    finally:
        output.close()
