"""An Apple Push Notification service endpoint: HTTP/2 over TLS (ALPN "h2") on 127.0.0.1,
built on the `h2` library, one thread per connection, many streams on each.

`POST /3/device/<token>` with a provider token (`authorization: bearer <ES256 JWT>`, checked
against the team's key: signature, `kid`, `iss`, age), `apns-topic`, `apns-push-type` and
`apns-id`, and a JSON payload with `aps`: answered as the test set for the token (`answer()`),
else 200 with the `apns-id`, and recorded. Errors carry APNs' `{"reason": ...}` bodies.
"""

import json
import re
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import jwt

DEVICE_TOKEN = re.compile(r"(?:[0-9a-fA-F]{2}){32,100}")
PUSH_TYPES = {"alert", "background", "voip", "complication", "fileprovider", "mdm", "liveactivity"}

# What APNs answers for each reason.
STATUSES = {
    "BadDeviceToken": 400,
    "DeviceTokenNotForTopic": 400,
    "Unregistered": 410,
    "TooManyRequests": 429,
    "InternalServerError": 500,
    "ServiceUnavailable": 503,
}


def device_token(n: int) -> str:
    """A well-formed device token (32 bytes in hex), different for each n."""
    return f"{n:064x}"


@dataclass
class Answer:
    reason: str  # a key of STATUSES, or "DROP": close the connection without answering
    times: int | None = None  # None: every time


class FakeAPNs:
    def __init__(
        self, *, context: ssl.SSLContext, team_id: str, key_id: str, public_key: Any, topic: str
    ) -> None:
        self.context = context
        self.team_id, self.key_id, self.public_key, self.topic = team_id, key_id, public_key, topic
        self.lock = threading.Lock()
        self.accepted: list[dict[str, Any]] = []  # {"token", "apns_id", "payload", "headers"}
        self.requests = 0
        self.connections = 0
        self.answers: dict[str, Answer] = {}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> "FakeAPNs":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()

    def reset(self) -> None:
        with self.lock:
            self.accepted.clear()
            self.answers.clear()
            self.requests = self.connections = 0

    def answer(self, token: str, reason: str, *, times: int | None = None) -> None:
        """Answer pushes to `token` with `reason` (a key of STATUSES, or DROP), `times` times."""
        self.answers[token] = Answer(reason, times)

    def tokens_sent(self) -> list[str]:
        return [accepted["token"] for accepted in self.accepted]

    # -- connections -----------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            with self.context.wrap_socket(raw, server_side=True) as sock:
                if sock.selected_alpn_protocol() != "h2":
                    return
                with self.lock:
                    self.connections += 1
                self._speak_h2(sock)
        except (OSError, h2.exceptions.ProtocolError):
            pass  # the client went away, or broke the protocol: the connection ends

    def _speak_h2(self, sock: ssl.SSLSocket) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        conn = h2.connection.H2Connection(config=config)
        conn.local_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000}
        )
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        streams: dict[int, tuple[dict[str, str], bytearray]] = {}
        while True:
            data = sock.recv(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    # header_encoding="utf-8": names and values arrive as str.
                    headers = {str(name): str(value) for name, value in event.headers or ()}
                    streams[event.stream_id] = (headers, bytearray())
                elif isinstance(event, h2.events.DataReceived):
                    streams[event.stream_id][1].extend(event.data or b"")
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    headers, body = streams.pop(event.stream_id)
                    status, answer_headers, answer = self.push(headers, bytes(body))
                    if status == 0:
                        return  # read, never answered: the connection is dropped
                    payload = json.dumps(answer).encode() if answer else b""
                    conn.send_headers(
                        event.stream_id,
                        [(":status", str(status)), *answer_headers.items()],
                        end_stream=not payload,
                    )
                    if payload:
                        conn.send_data(event.stream_id, payload, end_stream=True)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    sock.sendall(conn.data_to_send())
                    return
            sock.sendall(conn.data_to_send())

    # -- one push --------------------------------------------------------------------------

    def push(
        self, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], dict[str, Any] | None]:
        """(status, headers, JSON body or None); status 0: drop the connection."""
        with self.lock:
            self.requests += 1
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        answer_headers = {"apns-id": apns_id}

        def refuse(reason: str, status: int) -> tuple[int, dict[str, str], dict[str, Any]]:
            return status, answer_headers, {"reason": reason}

        path = headers.get(":path", "")
        if headers.get(":method") != "POST" or not path.startswith("/3/device/"):
            return refuse("MethodNotAllowed" if path.startswith("/3/device/") else "BadPath", 405)
        token = path.removeprefix("/3/device/")
        problem = self._provider_token_problem(headers.get("authorization", ""))
        if problem:
            return refuse(problem, 403)
        if not _is_uuid(headers.get("apns-id", "")):
            return refuse("BadMessageId", 400)
        if headers.get("apns-topic") != self.topic:
            return refuse("TopicDisallowed" if headers.get("apns-topic") else "MissingTopic", 400)
        if headers.get("apns-push-type") not in PUSH_TYPES:
            return refuse("InvalidPushType", 400)
        if not body:
            return refuse("PayloadEmpty", 400)
        if len(body) > 4096:
            return refuse("PayloadTooLarge", 413)
        try:
            payload = json.loads(body)
        except ValueError:
            return refuse("BadPayload", 400)
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            return refuse("BadPayload", 400)
        if not DEVICE_TOKEN.fullmatch(token):
            return refuse("BadDeviceToken", 400)
        answer = self._answer_for(token)
        if answer is not None:
            if answer.reason == "DROP":
                return 0, {}, None
            refusal: dict[str, Any] = {"reason": answer.reason}
            if answer.reason == "Unregistered":
                refusal["timestamp"] = int(time.time() * 1000)  # when it was last valid
            return STATUSES[answer.reason], answer_headers, refusal
        with self.lock:
            self.accepted.append(
                {"token": token, "apns_id": apns_id, "payload": payload, "headers": headers}
            )
        return 200, answer_headers, None

    def _provider_token_problem(self, authorization: str) -> str | None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "MissingProviderToken"
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(
                token, self.public_key, algorithms=["ES256"], options={"require": ["iss", "iat"]}
            )
        except jwt.PyJWTError:
            return "InvalidProviderToken"
        if header.get("kid") != self.key_id or claims["iss"] != self.team_id:
            return "InvalidProviderToken"
        if claims["iat"] < time.time() - 3600:
            return "ExpiredProviderToken"
        return None

    def _answer_for(self, token: str) -> Answer | None:
        with self.lock:
            answer = self.answers.get(token)
            if answer is None:
                return None
            if answer.times is not None:
                answer.times -= 1
                if answer.times <= 0:
                    del self.answers[token]
            return answer


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False
