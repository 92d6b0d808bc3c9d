"""Dead addresses: what a provider says no longer exists is kept on the job, shown by the REST
API and POSTed to the caller's webhook (each at least once; refusals tried again)."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.servers import free_port
from tests.support.sends import make_job
from worker.chunks import send_chunk_run
from worker.delivery.base import PERMANENT, DispatchError, Message, OneAtATime
from worker.delivery.dead_addresses import (
    ReportFailed,
    dead_addresses_record,
    dead_addresses_report,
    dead_addresses_report_due,
)
from worker.models import DeadAddress
from worker.serializers import SendJobSerializer


class DeadTokenBackend(OneAtATime):
    """A provider to whom the tokens of users 2 and 9 are unregistered."""

    provider = "test-dead"
    sent: list[int] = []

    def send(self, message: Message) -> None:
        if message.user_id in (2, 9):
            raise DispatchError("UNREGISTERED: token not registered", kind=PERMANENT, invalid=True)
        self.sent.append(message.user_id)


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.bodies.append(body)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/dead"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    receiver = Receiver()
    settings.GATEKEEPER_DEAD_ADDRESS_WEBHOOK = receiver.url
    yield receiver
    receiver.server.shutdown()


def test_dead_tokens_fail_are_kept_once_listed_and_reported(
    campaign,
    settings,
    receiver,
):
    settings.GATEKEEPER_PUSH_BACKEND = f"{__name__}.DeadTokenBackend"
    DeadTokenBackend.sent.clear()
    job = make_job(1, 2, 9, channel="push", campaign="dead")
    chunk = job.chunks.get()
    assert send_chunk_run(chunk_id=chunk.pk) == {"sent": 1, "failed": 2}
    assert DeadTokenBackend.sent == [1]
    shown = SendJobSerializer(job).data["dead_addresses"]
    assert shown["count"] == 2
    assert [(d["user_id"], d["address"]) for d in shown["first"]] == [
        (2, "u2@example.com"),
        (9, "u9@example.com"),
    ]
    assert "UNREGISTERED" in shown["first"][0]["reason"]

    # A refusal leaves them unreported (the beat task's next run tries again); then they go,
    # once.
    receiver.statuses = [503]
    with pytest.raises(ReportFailed, match="503"):
        dead_addresses_report(job.pk)
    receiver.statuses = [503]
    assert dead_addresses_report_due() == 0
    assert not DeadAddress.objects.filter(reported=True).exists()
    assert dead_addresses_report_due() == 2
    assert dead_addresses_report_due() == 0
    (body,) = receiver.bodies
    assert (body["job"], body["campaign"], body["channel"]) == (job.pk, "dead", "push")
    assert [d["user_id"] for d in body["dead_addresses"]] == [2, 9]

    # The same chunk run again (a worker died before settling it): kept once.
    dead_addresses_record(job, [(2, "u2@example.com", "again")])
    assert DeadAddress.objects.filter(job=job).count() == 2
