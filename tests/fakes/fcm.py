"""A Firebase Cloud Messaging HTTP v1 endpoint and its OAuth2 token endpoint, over HTTPS on
127.0.0.1, for firebase_admin to talk to.

- `POST /token` (what the service account's `token_uri` names): a `jwt-bearer` grant whose
  assertion is signed (RS256) by the service account's key, for the service account, with an
  FCM scope, addressed to Google's token endpoint (as google-auth does); answers an access token.
- `POST /v1/projects/<project>/messages:send` with `Authorization: Bearer <a token it issued>`:
  the body is checked as FCM checks it (one token, string data values, no reserved data keys),
  then answered by what the test set for the token (`answer()`), else accepted and recorded.
  Errors are Google's JSON errors with an `FcmError` detail, which firebase_admin maps to its
  exception classes.
"""

import itertools
import json
import re
import secrets
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# google-auth addresses its assertion to Google's token endpoint whatever `token_uri` says.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
FCM_SCOPES = {
    "https://www.googleapis.com/auth/firebase.messaging",
    "https://www.googleapis.com/auth/cloud-platform",
}
# The shape of a registration token, loosely: an instance id, a colon, then the token proper.
REGISTRATION_TOKEN = re.compile(r"[A-Za-z0-9_-]{8,}:[A-Za-z0-9_-]{20,}")
RESERVED_DATA_KEY = re.compile(r"^(from|message_type)$|^(google|gcm)")

# What FCM answers for each error: HTTP status, google.rpc status, FcmError errorCode, message.
ERRORS = {
    "UNREGISTERED": (404, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found."),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"),
    "QUOTA_EXCEEDED": (
        429,
        "RESOURCE_EXHAUSTED",
        "QUOTA_EXCEEDED",
        "Quota exceeded for quota metric 'Send requests'.",
    ),
    "UNAVAILABLE": (503, "UNAVAILABLE", "UNAVAILABLE", "The service is currently unavailable."),
    "INTERNAL": (500, "INTERNAL", "INTERNAL", "Internal error encountered."),
    # An invalid argument that is not the token's fault.
    "MESSAGE_TOO_BIG": (400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Message is too big"),
}


def registration_token(n: int) -> str:
    """A well-formed registration token, different for each n."""
    return f"inst{n:06d}:APA91b{n:020d}"


@dataclass
class Answer:
    error: str  # a key of ERRORS, or "DROP": close the connection without answering
    times: int | None = None  # None: every time
    retry_after: str | None = None


class FakeFCM:
    def __init__(
        self,
        *,
        context: ssl.SSLContext,
        project_id: str,
        client_email: str,
        public_key: Any,
    ) -> None:
        self.project_id, self.client_email, self.public_key = project_id, client_email, public_key
        self.lock = threading.Lock()
        self.access_tokens: set[str] = set()
        self.assertions: list[dict[str, Any]] = []  # the token requests' verified claims
        self.accepted: list[dict[str, Any]] = []  # {"message": ..., "authorization": ...}
        self.requests = 0  # every messages:send request, answered or not
        self.answers: dict[str, Answer] = {}
        self.ids = itertools.count(1)
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        # Handshakes happen in the handler threads (on first read), not in the accepting one.
        self.server.socket = context.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.token_uri = f"{self.url}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "FakeFCM":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.lock:
            self.access_tokens.clear()
            self.accepted.clear()
            self.assertions.clear()
            self.answers.clear()
            self.requests = 0

    def answer(
        self, token: str, error: str, *, times: int | None = None, retry_after: str | None = None
    ) -> None:
        """Answer sends to `token` with `error` (a key of ERRORS, or DROP), `times` times."""
        self.answers[token] = Answer(error, times, retry_after)

    def tokens_sent(self) -> list[str]:
        return [accepted["message"]["token"] for accepted in self.accepted]

    # -- the endpoints ---------------------------------------------------------------------

    def issue_token(self, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        if form.get("grant_type") != [JWT_BEARER] or len(form.get("assertion", [])) != 1:
            return 400, {"error": "unsupported_grant_type"}
        try:
            claims = jwt.decode(
                form["assertion"][0],
                self.public_key,
                algorithms=["RS256"],
                audience=GOOGLE_TOKEN_AUDIENCE,
                issuer=self.client_email,
                options={"require": ["iss", "aud", "iat", "exp"]},
            )
        except jwt.PyJWTError as exc:
            return 400, {"error": "invalid_grant", "error_description": str(exc)}
        if not FCM_SCOPES & set(str(claims.get("scope", "")).split()):
            return 400, {"error": "invalid_scope"}
        token = f"ya29.fake-{secrets.token_urlsafe(16)}"
        with self.lock:
            self.access_tokens.add(token)
            self.assertions.append(claims)
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    def send(self, path: str, authorization: str, body: bytes) -> tuple[int, dict[str, Any], str]:
        """(status, JSON answer, Retry-After or ""); status 0: drop the connection."""
        with self.lock:
            self.requests += 1
        if path != f"/v1/projects/{self.project_id}/messages:send":
            return _error(404, "NOT_FOUND", None, f"Unknown path {path}")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or token not in self.access_tokens:
            return _error(
                401, "UNAUTHENTICATED", None, "Request had invalid authentication credentials."
            )
        try:
            message = json.loads(body)["message"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "INVALID_ARGUMENT", None, "Invalid JSON payload received.")
        problem = _message_problem(message)
        if problem:
            return _error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", problem)
        answer = self._answer_for(message["token"])
        if answer is not None:
            if answer.error == "DROP":
                return 0, {}, ""
            status, rpc_status, code, text = ERRORS[answer.error]
            status_, body_, _ = _error(status, rpc_status, code, text)
            return status_, body_, answer.retry_after or ""
        with self.lock:
            self.accepted.append({"message": message, "authorization": authorization})
            name = f"projects/{self.project_id}/messages/{next(self.ids)}"
        return 200, {"name": name}, ""

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


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return "Invalid value at 'message'."
    token = message.get("token")
    if not isinstance(token, str) or not token:
        return "Recipient of the message is not set."
    for key, value in (message.get("data") or {}).items():
        if not isinstance(value, str):
            return f"Invalid value at 'message.data[{key}].value' (TYPE_STRING)."
        if RESERVED_DATA_KEY.search(key):
            return f"Invalid data payload key: {key}"
    if not REGISTRATION_TOKEN.fullmatch(token):
        return "The registration token is not a valid FCM registration token"
    return None


def _error(
    status: int, rpc_status: str, fcm_code: str | None, message: str
) -> tuple[int, dict[str, Any], str]:
    details = []
    if fcm_code:
        details.append(
            {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": fcm_code}
        )
    error = {"code": status, "message": message, "status": rpc_status, "details": details}
    return status, {"error": error}, ""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up, or refused the certificate: nothing to tell


def _handler(fake: FakeFCM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Google's front ends

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            retry_after = ""
            if self.path == "/token":
                form = urllib.parse.parse_qs(body.decode())
                status, answer = fake.issue_token(form)
            else:
                status, answer, retry_after = fake.send(
                    self.path, self.headers.get("Authorization", ""), body
                )
            if status == 0:
                self.close_connection = True  # read, never answered
                return
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            if retry_after:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
