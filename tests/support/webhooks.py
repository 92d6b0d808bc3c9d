"""A company's webhook receiver on loopback, as a fixture: a real HTTP server (a thread) that
records every request, verifies its signature with the Standard Webhooks library (not ours),
and answers as a test tells it: taken (200), a status of its choice, no answer until released
(the client times out), or the connection closed."""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int | None  # the status it was answered with; None: no answer
    verified: bool


@dataclass
class Receiver:
    url: str = ""
    secret: str = ""  # set by the test once the endpoint is made: requests are verified with it
    answers: list[Any] = field(default_factory=list)  # next answers: a status, "hang", "close"
    default: int = 200  # the answer once `answers` are used up
    received: list[Received] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def taken(self) -> list[dict[str, Any]]:
        """Every event of every request answered 2xx, in order (repeats included)."""
        return [
            event
            for r in self.received
            if r.answered is not None and 200 <= r.answered < 300
            for event in msgspec.json.decode(r.body)["events"]
        ]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the answer in one segment, not held for an ACK

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                Webhook(receiver.secret).verify(body, headers, json_parse=False)
                verified = True
            except WebhookVerificationError:
                verified = False
            answer = receiver.answers.pop(0) if receiver.answers else receiver.default
            record = Received(headers=headers, body=body, answered=None, verified=verified)
            receiver.received.append(record)
            if answer == "hang":
                receiver.release.wait(30)
                return
            if answer == "close":
                self.close_connection = True
                return
            record.answered = int(answer)
            payload = b"taken" if 200 <= answer < 300 else b"not now"
            self.send_response(int(answer))
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(found))
    server.daemon_threads = True
    found.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gatekeeper"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.release.set()
    server.shutdown()
    server.server_close()
