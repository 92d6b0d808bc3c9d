"""Logs as JSON (GATEKEEPER_LOG_FORMAT=json) and errors to Sentry (SENTRY_DSN), each set up by
the project's real settings in a process of its own: the JSON lines parsed, and Sentry's event
received over HTTP by a Sentry stand-in on loopback."""

import gzip
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh Python with the project's production settings and `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SENTRY_", "GATEKEEPER_"))}
    environ.update(DJANGO_SETTINGS_MODULE="gatekeeper.settings", PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_logs_are_one_json_object_a_line() -> None:
    done = run_python(
        "import django, logging\n"
        "django.setup()\n"
        "logging.getLogger('worker.chunks').warning('chunk %s is late', 7, extra={'job': 3})\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    logging.getLogger('worker.gate').exception('the gate failed')\n",
        GATEKEEPER_LOG_FORMAT="json",
    )
    assert done.returncode == 0, done.stderr
    late, failed = json_lines(done.stderr)
    assert {k: late[k] for k in ("level", "logger", "message", "job")} == {
        "level": "WARNING",
        "logger": "worker.chunks",
        "message": "chunk 7 is late",
        "job": 3,
    }
    assert datetime.fromisoformat(late["time"]).utcoffset() is not None
    assert failed["level"] == "ERROR" and failed["message"] == "the gate failed"
    assert "ZeroDivisionError: division by zero" in failed["exc_info"]
    # Plain by default: the same line as text.
    plain = run_python(
        "import django, logging\ndjango.setup()\nlogging.getLogger('worker.chunks').warning('hi')\n"
    )
    assert plain.stderr.rstrip().endswith("WARNING worker.chunks: hi") and not json_lines(
        plain.stderr
    )


def test_celerys_worker_and_beat_log_json_too() -> None:
    # What a worker and beat do at start-up: Celery takes the root logger over with its own
    # format, then tells the project (after_setup_logger).
    done = run_python(
        "import django, logging\n"
        "django.setup()\n"
        "from gatekeeper.celery import app\n"
        "app.log.setup(loglevel='INFO')\n"
        "logging.getLogger('celery.worker').info('ready %s', 'now')\n"
        "app.log.get_default_logger(name='celery.task').warning('a task said so')\n",
        GATEKEEPER_LOG_FORMAT="json",
    )
    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr)
    assert [(line["logger"], line["message"]) for line in lines] == [
        ("celery.worker", "ready now"),
        ("celery.task", "a task said so"),
    ]


def test_an_unknown_log_format_stops_the_start() -> None:
    done = run_python("import django\ndjango.setup()\n", GATEKEEPER_LOG_FORMAT="xml")
    assert done.returncode != 0
    assert "GATEKEEPER_LOG_FORMAT is 'xml': plain or json." in done.stderr


class SentryStandIn:
    """Sentry's ingestion endpoint on loopback: keeps the envelopes POSTed to it."""

    def __init__(self) -> None:
        self.envelopes: list[tuple[str, bytes]] = []  # (path, the envelope, decompressed)
        self.received = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                stand_in.envelopes.append((self.path, body))
                stand_in.received.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": "0"}')

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict]:
        """The events of every envelope (an envelope: a header line, then per item a header
        line and its payload)."""
        found = []
        for _, envelope in self.envelopes:
            lines = envelope.split(b"\n")
            for header, payload in zip(lines[1::2], lines[2::2], strict=False):
                if header and json.loads(header).get("type") == "event":
                    found.append(json.loads(payload))
        return found


@pytest.fixture
def sentry() -> Iterator[SentryStandIn]:
    stand_in = SentryStandIn()
    yield stand_in
    stand_in.server.shutdown()


def test_errors_go_to_sentry_when_a_dsn_is_set(sentry: SentryStandIn) -> None:
    done = run_python(
        "import django, json, logging, sentry_sdk\n"
        "django.setup()\n"
        "client = sentry_sdk.get_client()\n"
        "print(json.dumps(sorted(client.integrations)))\n"
        "print(client.options['send_default_pii'], client.options['traces_sample_rate'])\n"
        "logging.getLogger('worker.chunks').error('chunk %s failed', 7)\n"
        "sentry_sdk.flush(timeout=10)\n",
        SENTRY_DSN=f"http://public@127.0.0.1:{sentry.port}/42",
        SENTRY_ENVIRONMENT="staging",
    )
    assert done.returncode == 0, done.stderr
    integrations, options = done.stdout.splitlines()
    names = set(json.loads(integrations))
    # Django and Celery, with the defaults (logging among them); nothing that wraps Redis.
    assert {"django", "celery", "logging"} <= names and "redis" not in names
    assert options == "False None"
    assert sentry.received.wait(10)
    assert {path for path, _ in sentry.envelopes} == {"/api/42/envelope/"}
    (event,) = sentry.events()
    assert event["level"] == "error" and event["logger"] == "worker.chunks"
    assert event["logentry"]["formatted"] == "chunk 7 failed"
    assert event["environment"] == "staging"
    assert "user" not in event  # no personal data


def test_no_sentry_without_a_dsn() -> None:
    done = run_python(
        "import django, sys\ndjango.setup()\nprint('sentry_sdk' in sys.modules)\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
