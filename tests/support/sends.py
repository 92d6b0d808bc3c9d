"""Send jobs in tests: a real SMTP server (aiosmtpd) and a real HTTP push relay as fixtures, a published campaign, jobs made and run chunk by chunk, a user's recorded sends."""

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from bench.servers import free_port
from limits.engine.limiter import get_limiter
from limits.policy.rules import RuleFields
from limits.policy.services import RULES
from worker.chunks import send_chunk_run
from worker.claims import SENDING_STATE, SENT_STATE, ChunkRecord, record_read, state_at
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.services import send_job_create


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    async def handle_DATA(self, server, session, envelope):
        body = envelope.content.decode("utf-8", errors="replace")
        for rcpt in envelope.rcpt_tos:
            self.messages.append((rcpt, body))
        return "250 OK"

    def per_recipient(self) -> Counter[str]:
        return Counter(rcpt for rcpt, _ in self.messages)


def recorded(user_id: int, channel: str) -> int:
    """The sends the user's log holds on the channel."""
    return sum(1 for entry in get_limiter().entries(user_id) if entry.channel == channel)


@contextlib.contextmanager
def smtp_serving(handler: Any) -> Iterator[int]:
    """A real SMTP server on loopback (aiosmtpd) handing its messages to `handler`; its port."""
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        yield controller.port
    finally:
        controller.stop()


def smtp_settings(settings: Any, port: int) -> None:
    """This process's email settings pointed at the SMTP server on `port`."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""


@pytest.fixture
def smtp(settings) -> Iterator[Inbox]:
    inbox = Inbox()
    with smtp_serving(inbox) as port:
        smtp_settings(settings, port)
        yield inbox


class Relay:
    """A push relay on loopback that answers with the next status in `statuses` (200 after)."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.keys: list[str] = []
        self.statuses: list[int] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = relay.statuses.pop(0) if relay.statuses else 200
                if status == 200:
                    relay.received.append(body)
                    relay.keys.append(self.headers["Idempotency-Key"])
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/push"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def relay(settings) -> Iterator[Relay]:
    relay = Relay()
    settings.GATEKEEPER_DISPATCHERS = {"push": "webhook"}
    settings.GATEKEEPER_PUSH_WEBHOOK_URL = relay.url
    yield relay
    relay.server.shutdown()


@pytest.fixture
def campaign(published):
    published(
        vip=(10, [1, 2], {"email": (1, 5), "push": (1, 5)}),
        dormant=(20, [3], {"email": (0, 0), "push": (0, 0)}),
    )


def recipients(*user_ids: int, domain: str = "example.com") -> list[dict]:
    return [
        {"user_id": u, "address": f"u{u}@{domain}", "context": {"name": f"User {u}"}}
        for u in user_ids
    ]


def make_job(*user_ids: int, channel: str = "email", campaign: str = "c", **options) -> SendJob:
    """A send job of the `welcome` template to `recipients(*user_ids)`, stored and not queued
    (the test runs its chunks)."""
    return send_job_create(
        channel=channel,
        campaign=campaign,
        template="welcome",
        recipients=recipients(*user_ids),
        queue=False,
        **options,
    )


def run_all(job: SendJob, now: datetime | None = None) -> None:
    for chunk in SendChunk.objects.filter(job=job, status=SendChunk.Status.QUEUED).order_by("pk"):
        send_chunk_run(chunk_id=chunk.pk, now=now)


def make_rule(name: str, **values):
    fields = {
        "segment": None, "channel": "email", "match": "any", "tag": "", "window_kind": "rolling",
        "window_seconds": 86_400, "window_unit": "", "limit": 1, "reserve_below_priority": None,
        "reserve_slots": None,
    }  # fmt: skip
    return RULES.create(fields=RuleFields(name=name, **{**fields, **values}), via="command")


def earlier_run(
    job: Any,
    *,
    sent: tuple[int, ...] = (),
    sending: tuple[int, ...] = (),
    holder: int | None = None,
) -> None:
    """What a run of `job`'s one chunk left when it died: every recipient gated (recorded for
    `holder`, the job itself unless named), the users `sent` marked sent and `sending` cut
    off while sending, in the chunk's record (worker/claims.py)."""
    chunk = job.chunks.get()
    gate_check(
        channel=job.channel,
        requests=[(r["user_id"], r["message_id"]) for r in chunk.recipients],
        campaign=job.campaign,
        category=job.category,
        job=job.pk if holder is None else holder,
    )
    record = ChunkRecord(chunk, "dead-run-0000000")
    record.take()
    position = {r["user_id"]: i for i, r in enumerate(chunk.recipients)}
    record.mark(
        [(position[u], SENT_STATE) for u in sent] + [(position[u], SENDING_STATE) for u in sending]
    )


def chunk_states(chunk: Any) -> list[int]:
    """How far each send of a chunk got, by position (0 not sent, 1 sending, 2 sent)."""
    states = record_read(chunk)
    return [state_at(states, i) for i in range(len(chunk.recipients))]
