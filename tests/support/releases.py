"""Two releases side by side, for the rolling-upgrade tests: an earlier release's source tree
(tests.support.celery_workers.release_tree), the four kinds of process of either release started
from its tree (web, send worker, upkeep worker, beat) on one environment, each stopped as
systemd stops it (SIGTERM to the main process) and timed, and what changed in the migrations
between two commits."""

import ast
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.servers import free_port
from tests.support.celery_workers import ROOT, start_celery_worker

BIN = Path(sys.executable).parent


@dataclass
class Running:
    """One process of one release: `kind` (web, worker, upkeep, beat), `release` (a name)."""

    kind: str
    release: str
    process: subprocess.Popen[Any]
    log: Path
    url: str = ""  # a web process's
    stopped_in: float | None = None  # seconds from SIGTERM to its exit

    @property
    def name(self) -> str:
        return f"{self.release} {self.kind}"

    def stop(self, timeout: float = 120) -> float:
        """SIGTERM to the main process alone (systemd's KillMode=mixed), then its exit: the
        seconds that took. A process still running after `timeout` fails the test."""
        started = time.monotonic()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
                raise AssertionError(f"{self.name} still ran {timeout} s after SIGTERM") from None
        self.stopped_in = time.monotonic() - started
        return self.stopped_in

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class Release:
    """A release's source tree, and the processes started from it."""

    name: str
    root: Path
    env: dict[str, str]
    logs: Path
    running: list[Running] = field(default_factory=list)

    def _log(self, kind: str) -> Path:
        return self.logs / f"{self.name}-{kind}.log"

    def web(self) -> Running:
        """gunicorn with the project's config (gatekeeper/gunicorn_conf.py), one worker of four
        threads, on a free loopback port."""
        port = free_port()
        log = self._log("web")
        env = {
            **self.env,
            "GATEKEEPER_BIND": f"127.0.0.1:{port}",
            "WEB_CONCURRENCY": "1",
            "GUNICORN_ACCESSLOG": "",
        }
        with open(log, "ab") as output:
            process = subprocess.Popen(
                [str(BIN / "gunicorn"), "--config", "gatekeeper/gunicorn_conf.py",
                 "gatekeeper.wsgi:application"],
                cwd=self.root, env=env, start_new_session=True, stdout=output, stderr=output,
            )  # fmt: skip
        return self._started(
            Running("web", self.name, process, log, url=f"http://127.0.0.1:{port}")
        )

    def worker(self, queues: str, kind: str) -> Running:
        log = self._log(kind)
        process = start_celery_worker(queues, self.env, log=log, root=self.root)
        return self._started(Running(kind, self.name, process, log))

    def beat(self) -> Running:
        log = self._log("beat")
        with open(log, "ab") as output:
            process = subprocess.Popen(
                [str(BIN / "celery"), "-A", "gatekeeper", "beat", "--loglevel", "INFO",
                 "--pidfile", str(self.logs / f"{self.name}-beat.pid")],
                cwd=self.root, env=self.env, start_new_session=True, stdout=output, stderr=output,
            )  # fmt: skip
        return self._started(Running("beat", self.name, process, log))

    def manage(self, *args: str) -> str:
        """`manage.py` of this release, as an operator runs it; its output."""
        done = subprocess.run(
            [str(BIN / "python"), "manage.py", *args],
            cwd=self.root, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} of {self.name}: {done.stderr}")
        return done.stdout

    def _started(self, running: Running) -> Running:
        self.running.append(running)
        return running

    def stop_all(self) -> None:
        for running in self.running:
            if running.process.poll() is None:
                # Killed when it does not stop: the test has failed already or reports it.
                with contextlib.suppress(AssertionError):
                    running.stop(timeout=60)


def ready(running: Running, *, seconds: float = 90) -> None:
    """Waits until the process is serving: a web process answers /healthz, a Celery worker logs
    that it is ready, a beat that it is starting; fails naming its log's end if it exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            tail = running.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{running.name} exited ({running.process.returncode}):\n{tail}")
        if running.kind == "web":
            try:
                if requests.get(f"{running.url}/healthz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
        elif running.kind == "beat":
            if b"beat: Starting" in running.log.read_bytes():
                return
        elif b" ready." in running.log.read_bytes():
            return
        time.sleep(0.2)
    raise AssertionError(f"{running.name} not ready after {seconds} s")


# --- migrations between two commits -------------------------------------------------------------

# Operations an old process cannot live with: it reads or writes what they take away or rename.
REMOVING = {"RemoveField", "DeleteModel", "RenameField", "RenameModel", "RemoveIndex"}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def migrations_since(commit: str) -> list[str]:
    """The migration files (paths) added or changed between `commit` and the working tree."""
    changed = _git("diff", "--name-only", "--diff-filter=AM", commit, "--", "*/migrations/*.py")
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", "*/migrations/*.py")
    names = {*changed.split(), *untracked.split()}
    return sorted(n for n in names if not n.endswith("__init__.py"))


def migration_leaves(commit: str) -> dict[str, str]:
    """Each app's last migration (by name) at `commit`: where its schema stood."""
    leaves: dict[str, str] = {}
    for path in _git("ls-tree", "-r", "--name-only", commit).split():
        parts = path.split("/")
        if len(parts) >= 3 and parts[-2] == "migrations" and parts[-1][:4].isdigit():
            app, name = parts[-3], parts[-1].removesuffix(".py")
            leaves[app] = max(leaves.get(app, name), name)
    return leaves


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def not_expanding(path: str) -> list[str]:
    """What in one migration file an older process could not run beside: an operation that
    removes or renames, a field added NOT NULL without a default in the database (`db_default`:
    an old process's INSERT leaves the new column out, and Django's `default` is not the
    database's, so the row is refused), or a field made NOT NULL without a default. Each as
    `<file>: <operation> <its arguments>`."""
    tree = ast.parse((ROOT / path).read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        op = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        text = f"{path}: {ast.unparse(node)[:200]}"
        if op in REMOVING:
            found.append(text)
        elif op in {"AlterField", "AddField"}:
            fielded = _keyword(node, "field") or (node.args[2] if len(node.args) > 2 else None)
            if not isinstance(fielded, ast.Call):
                continue
            nullable = _keyword(fielded, "null")
            has_default = _keyword(fielded, "db_default") is not None or (
                op == "AlterField" and _keyword(fielded, "default") is not None
            )
            null = isinstance(nullable, ast.Constant) and nullable.value is True
            auto = isinstance(fielded.func, ast.Attribute) and "Auto" in fielded.func.attr
            many = (
                isinstance(fielded.func, ast.Attribute) and fielded.func.attr == "ManyToManyField"
            )
            if not (null or has_default or auto or many) and not _no_sql(path, node):
                found.append(text)
    return found


def _no_sql(path: str, node: ast.Call) -> bool:
    """An AlterField of this project's that changes only what Django reads and the database
    never sees (choices, help text: the field's `non_db_attrs`), against the field as the
    migrations before it left it."""
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.operations import AlterField

    parts = Path(path).parts
    if len(parts) < 3 or (_keyword(node, "model_name") is None):
        return False
    key = (parts[-3], Path(path).stem)
    loader = MigrationLoader(None, ignore_no_migrations=True)
    if key not in loader.graph.nodes:
        return False
    model = ast.literal_eval(_keyword(node, "model_name"))  # type: ignore[arg-type]
    name = ast.literal_eval(_keyword(node, "name"))  # type: ignore[arg-type]
    before = loader.project_state([parent.key for parent in loader.graph.node_map[key].parents])
    old = before.models[key[0], model.lower()].fields[name]
    new = next(
        op.field
        for op in loader.graph.nodes[key].operations
        if isinstance(op, AlterField) and (op.model_name, op.name) == (model, name)
    )

    def seen(field: Any) -> tuple[Any, ...]:
        _, kind, args, kwargs = field.deconstruct()
        return kind, args, {k: v for k, v in kwargs.items() if k not in field.non_db_attrs}

    return seen(old) == seen(new)
