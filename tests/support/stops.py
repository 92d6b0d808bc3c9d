"""Real processes stopped under load: a worker's dispatch log read as it grows
(tests/support/dispatch_log.py), which chunk holds a user, whether a chunk was given back, when
a condition first held; this project's gunicorn, and HTTP requests held in flight."""

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.servers import free_port
from tests.support.celery_workers import ROOT
from tests.support.worker_processes import wait_for
from worker.models import SendChunk, SendJob


class LogWatch:
    """A FileDispatcher log read as the worker appends to it: only what was added since the
    last look is read, so a test can look often."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._tail = b""
        self._users: set[int] = set()
        self._count = 0
        self._last: int | None = None

    def _read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()  # a line not yet written whole
        for line in lines:
            user = int(line.split(b" ", 1)[0])
            self._users.add(user)
            self._last = user
        self._count += len(lines)

    def count(self) -> int:
        """How many sends the log holds."""
        self._read()
        return self._count

    def users(self) -> set[int]:
        """The users it sent to."""
        self._read()
        return self._users

    def last_user(self) -> int:
        self._read()
        if self._last is None:
            raise AssertionError(f"{self.path} holds no send")
        return self._last


def chunk_of_users(job: SendJob, user_id: int) -> int:
    """The id of the chunk of `job` that holds `user_id`."""
    for chunk_id, recipients in job.chunks.values_list("pk", "recipients"):
        if any(r["user_id"] == user_id for r in recipients):
            return chunk_id
    raise AssertionError(f"no chunk of job {job.pk} holds user {user_id}")


def chunk_free_or_taken(chunk_id: int, runs: int) -> bool:
    """Whether the run that held the chunk gave it back: nobody holds its lease, or a run after
    the `runs` it had counted took it."""
    chunk = SendChunk.objects.get(pk=chunk_id)
    return chunk.lease_until is None or chunk.runs > runs


@dataclass
class Answer:
    """What became of one request: its status and whole body, or where the connection failed
    (`refused` at connect; `reset` or `truncated` after it was made)."""

    status: int | None = None
    body: bytes = b""
    error: str | None = None
    answered_at: float | None = None  # time.monotonic()


class InFlight(threading.Thread):
    """One HTTP/1.1 request on a connection of its own, sent whole but for its last `held`
    bytes, which go once `release` is set; then its answer read whole (Content-Length)."""

    def __init__(
        self,
        address: tuple[str, int],
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        held: int = 0,
        release: threading.Event | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.address, self.path, self.body, self.headers = address, path, body, headers
        self.held, self.release = held, release
        self.sent = threading.Event()  # all but the held bytes went
        self.answer = Answer()

    def run(self) -> None:
        connection = http.client.HTTPConnection(*self.address, timeout=120)
        try:
            connection.connect()
        except ConnectionRefusedError:
            self.answer.error = "refused"
            self.sent.set()
            return
        try:
            connection.putrequest("POST", self.path, skip_accept_encoding=True)
            for name, value in {**self.headers, "Content-Length": str(len(self.body))}.items():
                connection.putheader(name, value)
            connection.endheaders()
            cut = len(self.body) - self.held
            connection.send(self.body[:cut])
            self.sent.set()
            if self.held:
                assert self.release is not None
                self.release.wait()
                connection.send(self.body[cut:])
            response = connection.getresponse()
            body = response.read()  # IncompleteRead when cut short
            self.answer.status, self.answer.body = response.status, body
            self.answer.answered_at = time.monotonic()
        except http.client.IncompleteRead:
            self.answer.error = "truncated"
        except (ConnectionError, http.client.HTTPException, OSError) as error:
            self.answer.error = f"reset: {type(error).__name__}: {error}"
        finally:
            self.sent.set()
            connection.close()


def multipart(
    fields: dict[str, str], file_field: str, name: str, content: bytes
) -> tuple[bytes, str]:
    """A multipart/form-data body of `fields` and one file: the body and its Content-Type."""
    from urllib3 import encode_multipart_formdata

    body, content_type = encode_multipart_formdata(
        {**fields, file_field: (name, content, "text/csv")}
    )
    return body, content_type


@contextlib.contextmanager
def gunicorn_serving(
    env: dict[str, str], log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """This project's web process as the Procfile runs it (gatekeeper/gunicorn_conf.py) on a
    free loopback port, in a process group of its own, its output in `log`: the master and its
    base URL, once it answers /healthz. Killed at the end if the test did not stop it."""
    bind = f"127.0.0.1:{free_port()}"
    output = open(log, "ab")  # noqa: SIM115 (the child's)
    try:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "--config",
             "gatekeeper/gunicorn_conf.py", "gatekeeper.wsgi:application"],
            cwd=ROOT, env={**env, "GATEKEEPER_BIND": bind}, start_new_session=True,
            stdout=output, stderr=output,
        )  # fmt: skip
    finally:
        output.close()
    base = f"http://{bind}"
    try:
        wait_for(lambda: _healthy(base), seconds=60, what="gunicorn to answer", every=0.2)
        yield server, base
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=5).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False
