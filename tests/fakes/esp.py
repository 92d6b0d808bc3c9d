"""Email service providers' send APIs on 127.0.0.1, speaking the JSON (or form) each ESP speaks,
as django-anymail calls them; Amazon SES is moto's real server instead (see the tests).

- Postmark: `POST /email` and `POST /email/batch` (at most 500), `X-Postmark-Server-Token`.
  An address in `inactive` is refused as Postmark refuses a hard-bounced one (ErrorCode 406:
  HTTP 422 alone, or that message's result in a batch).
- SendGrid: `POST /v3/mail/send` (at most 1,000 personalizations, each address once),
  `Authorization: Bearer`, answered 202 without a body. An address in `invalid` makes the whole
  request a 400, as SendGrid does.
- Mailgun: `POST /v3/<domain>/messages`, form-encoded, basic auth `api:<key>`; with
  `recipient-variables` each `to` gets a copy of its own with `%recipient.<name>%` substituted
  (at most 1,000), without them one copy to all. An address in `invalid` is a 400.
- Resend: `POST /emails`, `Authorization: Bearer`; a repeated `Idempotency-Key` answers the
  first request's id and sends nothing.

Each records every request (`requests`) and, for the copies it would send, one `Delivery` per
recipient: its subject, text, headers and metadata as the recipient's copy would have them.
`then(...)` queues answers for the next requests instead of the normal one: `Status(429,
{"Retry-After": "7"})`, `Status(500)`, `HANG` (read the request, never answer: the client's
read timeout), `LOST` (take the request, send its copies, never answer) or `DROP` (read the
request, close the connection without a word).

`FakeSesV2` answers SES v2's SendEmail for the failures moto's server does not produce (429,
5xx, a hang); the sends themselves go to moto.
"""

import base64
import json
import re
import socket
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Status:
    code: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # JSON, or None for the ESP's usual error body


HANG, LOST, DROP = "hang", "lost", "drop"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def form(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.body.decode(), keep_blank_values=True)


@dataclass
class Delivery:
    """One recipient's copy, as the ESP would send it."""

    to: list[str]
    subject: str
    text: str
    html: str | None
    headers: dict[str, str]  # lower-case names
    metadata: dict[str, str]


class FakeEsp:
    name = "esp"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.deliveries: list[Delivery] = []
        self.answers: list[Any] = []
        self.released = threading.Event()  # lets hanging requests go at the end
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the ESPs' front ends

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Request(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                with fake.lock:
                    fake.requests.append(request)
                    answer = fake.answers.pop(0) if fake.answers else None
                if answer == LOST:
                    with fake.lock:
                        fake.handle(request)
                if answer in (HANG, LOST):
                    fake.released.wait(10)
                    self.close_connection = True
                    return
                if answer == DROP:
                    self.close_connection = True
                    return
                if isinstance(answer, Status):
                    status, headers, payload = answer.code, answer.headers, answer.body
                    if payload is None:
                        payload = fake.error_body(answer.code)
                else:
                    with fake.lock:
                        status, headers, payload = fake.handle(request)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if data:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        # A short poll: shutdown() waits for it, at the end of every test.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def then(self, *answers: Any) -> None:
        with self.lock:
            self.answers.extend(answers)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError

    def error_body(self, status: int) -> Any:
        return {"message": f"error {status}"}

    def delivered_to(self, address: str) -> list[Delivery]:
        return [d for d in self.deliveries if address in d.to]


class FakePostmark(FakeEsp):
    name = "postmark"
    token = "postmark-server-token"
    BATCH_MAX = 500

    def __init__(self) -> None:
        super().__init__()
        self.inactive: set[str] = set()

    def error_body(self, status: int) -> Any:
        return {"ErrorCode": 100 if status >= 500 else 429, "Message": f"error {status}"}

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        if request.headers.get("x-postmark-server-token") != self.token:
            return 401, {}, {"ErrorCode": 10, "Message": "No Account or Server API tokens."}
        if request.path == "/email":
            result = self.one(request.json())
            if result["ErrorCode"] == 406:
                return 422, {}, result
            return 200, {}, result
        if request.path == "/email/batch":
            messages = request.json()
            if not isinstance(messages, list) or len(messages) > self.BATCH_MAX:
                return 422, {}, {"ErrorCode": 300, "Message": "Invalid batch."}
            return 200, {}, [self.one(message) for message in messages]
        return 404, {}, {"ErrorCode": 404, "Message": "Not found."}

    def one(self, message: dict[str, Any]) -> dict[str, Any]:
        to = [a.strip() for a in message["To"].split(",")]
        dead = [a for a in to if a.lower() in self.inactive]
        if dead:
            return {
                "ErrorCode": 406,
                "Message": "You tried to send to recipient(s) that have been marked as "
                f"inactive.\nFound inactive addresses: {', '.join(dead)}.\nInactive recipients "
                "are ones that have generated a hard bounce, a spam complaint, or a manual "
                "suppression. ",
            }
        headers = {h["Name"].lower(): h["Value"] for h in message.get("Headers", [])}
        self.deliveries.append(
            Delivery(
                to=to,
                subject=message["Subject"],
                text=message.get("TextBody", ""),
                html=message.get("HtmlBody"),
                headers=headers,
                metadata=message.get("Metadata", {}),
            )
        )
        return {
            "To": message["To"],
            "SubmittedAt": "2026-06-10T10:00:00.0000000Z",
            "MessageID": str(uuid.uuid4()),
            "ErrorCode": 0,
            "Message": "OK",
        }


class FakeSendGrid(FakeEsp):
    name = "sendgrid"
    api_key = "SG.fake-key"
    PERSONALIZATIONS_MAX = 1000

    def __init__(self) -> None:
        super().__init__()
        self.invalid: set[str] = set()

    def error_body(self, status: int) -> Any:
        return {"errors": [{"message": f"error {status}", "field": None, "help": None}]}

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {}, self.error_body(401)
        if request.path != "/v3/mail/send":
            return 404, {}, self.error_body(404)
        data = request.json()
        personalizations = data.get("personalizations") or []
        if not personalizations:
            return 400, {}, self.error_body(400)
        if len(personalizations) > self.PERSONALIZATIONS_MAX:
            return 400, {}, self.error_body(400)
        seen: set[str] = set()
        for p in personalizations:
            for recipient in p["to"]:
                address = recipient["email"].lower()
                if address in seen or address in self.invalid:
                    return (
                        400,
                        {},
                        {
                            "errors": [
                                {
                                    "message": "Does not contain a valid address.",
                                    "field": "personalizations.to.email",
                                    "help": None,
                                }
                            ]
                        },
                    )
                seen.add(address)
        content = {c["type"]: c["value"] for c in data.get("content", [])}
        for p in personalizations:
            headers = {k.lower(): v for k, v in (data.get("headers") or {}).items()}
            headers.update({k.lower(): v for k, v in (p.get("headers") or {}).items()})
            metadata = {**(data.get("custom_args") or {}), **(p.get("custom_args") or {})}
            self.deliveries.append(
                Delivery(
                    to=[r["email"] for r in p["to"]],
                    subject=p.get("subject", data.get("subject", "")),
                    text=content.get("text/plain", ""),
                    html=content.get("text/html"),
                    headers=headers,
                    metadata=metadata,
                )
            )
        return 202, {"X-Message-Id": uuid.uuid4().hex}, None


class FakeMailgun(FakeEsp):
    name = "mailgun"
    api_key = "mailgun-api-key"
    RECIPIENTS_MAX = 1000
    RECIPIENT_VARIABLE = re.compile(r"%recipient\.([^%]+)%")

    def __init__(self) -> None:
        super().__init__()
        self.invalid: set[str] = set()

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        expected = "Basic " + base64.b64encode(f"api:{self.api_key}".encode()).decode()
        if request.headers.get("authorization") != expected:
            return 401, {}, {"message": "Invalid private key"}
        match = re.fullmatch(r"/v3/([^/]+)/messages", request.path)
        if match is None:
            return 404, {}, {"message": "Not found"}
        if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"
        ):
            return 400, {}, {"message": "expected a form"}
        form = request.form()
        to = form.get("to", [])
        if not to or len(to) > self.RECIPIENTS_MAX:
            return 400, {}, {"message": "'to' parameter is missing or too long"}
        if any(a.lower() in self.invalid for a in to):
            return (
                400,
                {},
                {"message": "to parameter is not a valid address. please check documentation"},
            )
        first = {name: values[0] for name, values in form.items()}
        variables = (
            json.loads(first["recipient-variables"]) if "recipient-variables" in first else None
        )
        copies = [[a] for a in to] if variables is not None else [to]
        for copy in copies:
            own = (variables or {}).get(copy[0], {})

            def value(text: str, own: dict[str, Any] = own) -> str:
                return self.RECIPIENT_VARIABLE.sub(lambda m: str(own.get(m.group(1), "")), text)

            self.deliveries.append(
                Delivery(
                    to=copy,
                    subject=value(first.get("subject", "")),
                    text=value(first.get("text", "")),
                    html=value(first["html"]) if "html" in first else None,
                    headers={
                        k[2:].lower(): value(v) for k, v in first.items() if k.startswith("h:")
                    },
                    metadata={k[2:]: value(v) for k, v in first.items() if k.startswith("v:")},
                )
            )
        domain = match.group(1)
        return 200, {}, {"id": f"<{uuid.uuid4().hex}@{domain}>", "message": "Queued. Thank you."}


class FakeResend(FakeEsp):
    name = "resend"
    api_key = "re_fake"

    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[str, str] = {}  # Idempotency-Key: the email id it was answered

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {}, {"statusCode": 401, "name": "missing_api_key", "message": "no key"}
        if request.path != "/emails":
            return 404, {}, {"statusCode": 404, "name": "not_found", "message": "not found"}
        key = request.headers.get("idempotency-key")
        if key is not None and key in self.keys:
            return 200, {}, {"id": self.keys[key]}
        data = request.json()
        headers = {k.lower(): v for k, v in (data.get("headers") or {}).items()}
        self.deliveries.append(
            Delivery(
                to=list(data["to"]),
                subject=data["subject"],
                text=data.get("text", ""),
                html=data.get("html"),
                headers=headers,
                metadata=json.loads(headers.get("x-metadata", "{}")),
            )
        )
        email_id = str(uuid.uuid4())
        if key is not None:
            self.keys[key] = email_id
        return 200, {}, {"id": email_id}


class FakeSesV2(FakeEsp):
    """Amazon SES v2's SendEmail (POST /v2/email/outbound-emails), for scripted failures."""

    name = "amazon_ses"

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        if request.path != "/v2/email/outbound-emails":
            return 404, {"x-amzn-ErrorType": "NotFoundException"}, {"message": "Not found"}
        return 200, {}, {"MessageId": f"0100{uuid.uuid4().hex}-000000"}


def closed_port_url() -> str:
    """An http URL on loopback where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
