"""Twilio's Programmable Messaging API over HTTPS on 127.0.0.1, for twilio-python's real
`twilio.rest.Client`, and Twilio's signed webhooks (a reply such as STOP, a status callback),
built as Twilio sends them.

The API, `POST /2010-04-01/Accounts/<AccountSid>/Messages.json`:
- HTTP basic auth with the Account SID and its Auth Token, or an API key's SID (SK...) and
  secret; anything else is a 401 with Twilio's code 20003. Another account's path is a 404
  (20404).
- The form is checked as Twilio checks it: `To` is required (21604) and must be a phone number
  in E.164 form (21211); `Body` is required (21602) and at most 1,600 characters (21617);
  `From` or `MessagingServiceSid` is required (21603) and `From` must be one of the account's
  senders (21606).
- A message it takes is answered 201 with Twilio's Message resource: its sid (SM and 32 hex
  digits) and status `queued` (sent from a number) or `accepted` (a Messaging Service picks
  the sender). Each is kept in `sent`; every request, taken or not, in `requests`.
- `answer(to, what)` scripts the answers for one number: a Twilio error code of ERRORS (the
  JSON error body Twilio answers, `{"code", "message", "more_info", "status"}`, with the
  HTTP status that goes with it; 20429 is an HTTP 429 with `retry_after` as its Retry-After),
  BAD_GATEWAY (a 502 whose body is a proxy's HTML page, not Twilio's JSON), HANG (read the
  request, never answer: the client's read timeout), LOST (take the message, then never
  answer: it went out and the client cannot know), DROP (read the request, close the
  connection without a word) or GARBLED (take the message, answer 201 with a body that is not
  JSON: a proxy's mangling). Twilio's magic test numbers are answered as Twilio answers them
  (MAGIC_TO: +15005550004 has replied STOP, and so on); the account's sender is Twilio's
  magic valid From, +15005550006.

The webhooks (`inbound_message`, `status_callback`) are form posts signed as Twilio signs them:
`X-Twilio-Signature` is the base64 HMAC-SHA1, keyed with the Auth Token, of the full URL
followed by each parameter's name and value, sorted by name (twilio-python's own
`RequestValidator.compute_signature`); each carries an `I-Twilio-Idempotency-Token`.
"""

import base64
import itertools
import json
import re
import ssl
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from twilio.request_validator import RequestValidator

API_VERSION = "2010-04-01"
MESSAGES_PATH = re.compile(r"/2010-04-01/Accounts/(?P<account>[^/]+)/Messages\.json")
E164 = re.compile(r"\+[1-9][0-9]{1,14}")  # a +, then 2 to 15 digits, the first not 0
BODY_MAX = 1600  # characters of `Body`

HANG, LOST, DROP, BAD_GATEWAY, GARBLED = "hang", "lost", "drop", "bad-gateway", "garbled"

# Twilio's default opt-out, opt-in and help keywords: a reply whose whole body (whatever its
# case) is one of them. With Advanced Opt-Out, the incoming message webhook says which it was
# in `OptOutType`.
OPT_OUT_KEYWORDS = frozenset(
    {"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"}
)
OPT_IN_KEYWORDS = frozenset({"START", "YES", "UNSTOP"})
HELP_KEYWORDS = frozenset({"HELP", "INFO"})


@dataclass(frozen=True)
class TwilioError:
    status: int  # HTTP status
    code: int  # Twilio's error code
    message: str  # `{to}` stands for the To number


# The errors a send can be answered with, by Twilio error code (www.twilio.com/docs/api/errors).
ERRORS = {
    error.code: error
    for error in (
        TwilioError(400, 21211, "The 'To' number {to} is not a valid phone number."),
        TwilioError(
            400,
            21408,
            "Permission to send an SMS has not been enabled for the region indicated by the "
            "'To' number: {to}.",
        ),
        TwilioError(400, 21610, "Attempt to send to unsubscribed recipient"),
        TwilioError(
            400,
            21612,
            "Message cannot be sent with the current combination of 'To' ({to}) and/or 'From' "
            "parameters",
        ),
        TwilioError(400, 21614, "'To' number is not a valid mobile number"),
        TwilioError(400, 21635, "'To' number cannot be a landline"),
        TwilioError(429, 20429, "Too Many Requests"),
        TwilioError(500, 20500, "An internal server error has occurred"),
        TwilioError(503, 20503, "Service unavailable"),
    )
}


# Twilio's magic To numbers for test credentials, answered as Twilio answers them when nothing
# else is scripted for them (www.twilio.com/docs/messaging/tutorials/automate-testing).
MAGIC_TO = {
    "+15005550001": 21211,  # invalid
    "+15005550002": 21612,  # cannot be routed
    "+15005550003": 21408,  # no international permission
    "+15005550004": 21610,  # blocked: replied STOP
    "+15005550009": 21614,  # cannot receive SMS
}


@dataclass
class Received:
    """One request to the Messages endpoint, answered or not."""

    path: str
    headers: dict[str, str]  # lower-case names
    form: dict[str, list[str]]
    username: str | None  # the basic auth user: an Account SID or an API key SID

    def value(self, name: str) -> str | None:
        values = self.form.get(name)
        return values[0] if values else None


@dataclass
class SentMessage:
    """A message Twilio took (answered 201, or LOST)."""

    sid: str
    to: str
    from_: str | None
    messaging_service_sid: str | None
    body: str
    status_callback: str | None
    status: str
    headers: dict[str, str]  # the request's, lower-case names


@dataclass
class Answer:
    what: int | str  # a code of ERRORS, or HANG, LOST, DROP, BAD_GATEWAY, GARBLED
    times: int | None = None  # None: every time
    retry_after: str | None = None


class FakeTwilio:
    account_sid = "AC" + "0123456789abcdef" * 2
    auth_token = "twilio-auth-token-for-tests"
    api_key_sid = "SK" + "fedcba9876543210" * 2
    api_key_secret = "twilio-api-key-secret-for-tests"
    sender = "+15005550006"  # the account's phone number
    messaging_service_sid = "MG" + "00112233445566778899aabbccddeeff"

    def __init__(self, *, context: ssl.SSLContext) -> None:
        self.lock = threading.Lock()
        self.requests: list[Received] = []
        self.sent: list[SentMessage] = []
        self.answers: dict[str, Answer] = {}
        self.senders = {self.sender}
        self.crashes: list[BaseException] = []  # the fake's own failures: a test's fixture fails
        self.released = threading.Event()  # lets hanging requests go
        self.request_ids = itertools.count(1)
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        # Handshakes happen in the handler threads (on first read), not in the accepting one.
        self.server.socket = context.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> "FakeTwilio":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.sent.clear()
            self.answers.clear()
            self.crashes.clear()
            self.senders = {self.sender}
            self.released.set()  # a request left hanging by the last test goes now
            self.released = threading.Event()

    def answer(
        self,
        to: str,
        what: int | str,
        *,
        times: int | None = None,
        retry_after: str | None = None,
    ) -> None:
        """Answer sends to `to` with `what` (a code of ERRORS, HANG, LOST, DROP, BAD_GATEWAY
        or GARBLED), `times` times (None: until reset)."""
        if not (isinstance(what, int) and what in ERRORS) and what not in (
            HANG,
            LOST,
            DROP,
            BAD_GATEWAY,
            GARBLED,
        ):
            raise ValueError(f"no such answer: {what!r}")
        with self.lock:
            self.answers[to] = Answer(what, times, retry_after)

    def sent_to(self, to: str) -> list[SentMessage]:
        return [message for message in self.sent if message.to == to]

    # -- the endpoint ------------------------------------------------------------------------

    def messages_create(self, request: Received) -> tuple[int, dict[str, str], Any]:
        """(HTTP status, headers, JSON body); status 0: no answer (see `what`), with the
        answer's kind in the body."""
        with self.lock:
            self.requests.append(request)
        match = MESSAGES_PATH.fullmatch(request.path)
        if match is None or match["account"] != self.account_sid:
            return _error(404, 20404, f"The requested resource {request.path} was not found")
        if not self._authorized(request.headers.get("authorization", "")):
            return _error(401, 20003, "Authenticate")
        to = request.value("To") or ""
        from_ = request.value("From")
        service = request.value("MessagingServiceSid")
        body = request.value("Body")
        if not to:
            return _error(400, 21604, "A 'To' phone number is required.")
        if not body and not request.value("MediaUrl") and not request.value("ContentSid"):
            return _error(400, 21602, "Message body is required.")
        if body and len(body) > BODY_MAX:
            return _error(
                400, 21617, "The concatenated message body exceeds the 1600 character limit."
            )
        if not from_ and not service:
            return _error(400, 21603, "A 'From' phone number is required.")
        if from_ and from_ not in self.senders:
            return _error(
                400,
                21606,
                f"The From phone number {from_} is not a valid, SMS-capable inbound phone number "
                "or short code for your account.",
            )
        answer = self._answer_for(to)
        if answer is None and to in MAGIC_TO:
            answer = Answer(MAGIC_TO[to])
        if answer is not None:
            if answer.what in (HANG, DROP):
                return 0, {}, answer.what
            if answer.what == BAD_GATEWAY:
                return (
                    502,
                    {"Content-Type": "text/html"},
                    "<html><body>502 Bad Gateway</body></html>",
                )
            if answer.what not in (LOST, GARBLED):
                error = ERRORS[int(answer.what)]
                status, headers, payload = _error(
                    error.status, error.code, error.message.format(to=to)
                )
                if answer.retry_after is not None:
                    headers["Retry-After"] = answer.retry_after
                return status, headers, payload
        if not E164.fullmatch(to):
            return _error(400, 21211, ERRORS[21211].message.format(to=to))
        message = SentMessage(
            sid="SM" + uuid.uuid4().hex,
            to=to,
            from_=from_,
            messaging_service_sid=service,
            body=body or "",
            status_callback=request.value("StatusCallback"),
            status="queued" if from_ else "accepted",
            headers=request.headers,
        )
        with self.lock:
            self.sent.append(message)
        if answer is not None and answer.what == LOST:
            return 0, {}, LOST
        if answer is not None and answer.what == GARBLED:
            return 201, {"Content-Type": "text/html"}, "<html><body>Message queued</body></html>"
        return 201, {}, self.resource(message)

    def resource(self, message: SentMessage) -> dict[str, Any]:
        """The Message resource, as Twilio answers a create."""
        now = format_datetime(datetime.now(UTC))  # RFC 2822, "+0000"
        uri = f"/{API_VERSION}/Accounts/{self.account_sid}/Messages/{message.sid}"
        return {
            "account_sid": self.account_sid,
            "api_version": API_VERSION,
            "body": message.body,
            "date_created": now,
            "date_sent": None,
            "date_updated": now,
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": message.from_,
            "messaging_service_sid": message.messaging_service_sid,
            "num_media": "0",
            # With a Messaging Service no sender is chosen yet: 0 until it is.
            "num_segments": "1" if message.from_ else "0",
            "price": None,
            "price_unit": "USD",
            "sid": message.sid,
            "status": message.status,
            "subresource_uris": {"media": f"{uri}/Media.json", "feedback": f"{uri}/Feedback.json"},
            "to": message.to,
            "uri": f"{uri}.json",
        }

    def _authorized(self, authorization: str) -> bool:
        return _basic_credentials(authorization) in {
            (self.account_sid, self.auth_token),
            (self.api_key_sid, self.api_key_secret),
        }

    def _answer_for(self, to: str) -> Answer | None:
        with self.lock:
            answer = self.answers.get(to)
            if answer is None:
                return None
            if answer.times is not None:
                answer.times -= 1
                if answer.times <= 0:
                    del self.answers[to]
            return answer


def _error(status: int, code: int, message: str) -> tuple[int, dict[str, str], Any]:
    """Twilio's JSON error answer."""
    body = {
        "code": code,
        "message": message,
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    return status, {}, body


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    """(user, password) of an HTTP basic Authorization header."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:
        return None
    return user, password


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up, or refused the certificate: nothing to tell


def _handler(fake: FakeTwilio) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Twilio's front ends

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {name.lower(): value for name, value in self.headers.items()}
            form = (
                urllib.parse.parse_qs(data.decode(), keep_blank_values=True)
                if headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
                else {}
            )
            credentials = _basic_credentials(headers.get("authorization", ""))
            request = Received(self.path, headers, form, credentials[0] if credentials else None)
            try:
                status, answer_headers, payload = fake.messages_create(request)
            except Exception as exc:
                fake.crashes.append(exc)  # not to pass for a dropped connection unseen
                raise
            if status == 0:
                if payload in (HANG, LOST):
                    fake.released.wait(10)
                self.close_connection = True  # read, never answered
                return
            if isinstance(payload, str):
                content = payload.encode()
                answer_headers.setdefault("Content-Type", "text/plain")
            else:
                content = json.dumps(payload).encode()
                answer_headers.setdefault("Content-Type", "application/json; charset=utf-8")
            self.send_response(status)
            self.send_header("Twilio-Request-Id", f"RQ{next(fake.request_ids):032x}")
            for name, value in answer_headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


# -- webhooks, as Twilio posts them ------------------------------------------------------------


@dataclass
class SignedWebhook:
    """A form post as Twilio makes it to one of our URLs: post `params` (form-encoded, `body`)
    to `url` with `headers`."""

    url: str
    params: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        return urllib.parse.urlencode(self.params).encode()

    @property
    def signature(self) -> str:
        return self.headers["X-Twilio-Signature"]


def signed(url: str, params: dict[str, str], *, auth_token: str) -> SignedWebhook:
    """`params` posted to `url`, signed with `auth_token` as Twilio signs its webhooks."""
    signature = RequestValidator(auth_token).compute_signature(url, params)
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "User-Agent": "TwilioProxy/1.1",
        "X-Twilio-Signature": signature,
        "I-Twilio-Idempotency-Token": str(uuid.uuid4()),
    }
    return SignedWebhook(url, dict(params), headers)


def opt_out_type(body: str) -> str | None:
    """What Advanced Opt-Out calls a reply: STOP, START or HELP when its whole body is one of
    the keywords (in any case), else None."""
    word = body.strip().upper()
    if word in OPT_OUT_KEYWORDS:
        return "STOP"
    if word in OPT_IN_KEYWORDS:
        return "START"
    if word in HELP_KEYWORDS:
        return "HELP"
    return None


def inbound_message(
    url: str,
    *,
    auth_token: str,
    account_sid: str,
    from_: str,
    to: str,
    body: str,
    messaging_service_sid: str | None = None,
    advanced_opt_out: bool = False,
) -> SignedWebhook:
    """A reply from `from_` (the person's number) to `to` (our sender), as Twilio posts it to
    the incoming message webhook. `OptOutType` is there only with Advanced Opt-Out (a
    Messaging Service's), and only when the reply is a keyword."""
    sid = "SM" + uuid.uuid4().hex
    params = {
        "ToCountry": "US",
        "ToState": "CA",
        "SmsMessageSid": sid,
        "NumMedia": "0",
        "ToCity": "",
        "FromZip": "",
        "SmsSid": sid,
        "FromState": "",
        "SmsStatus": "received",
        "FromCity": "",
        "Body": body,
        "FromCountry": "US",
        "To": to,
        "ToZip": "",
        "NumSegments": "1",
        "MessageSid": sid,
        "AccountSid": account_sid,
        "From": from_,
        "ApiVersion": API_VERSION,
    }
    if messaging_service_sid:
        params["MessagingServiceSid"] = messaging_service_sid
    kind = opt_out_type(body)
    if advanced_opt_out and kind is not None:
        params["OptOutType"] = kind
    return signed(url, params, auth_token=auth_token)


def status_callback(
    message: SentMessage,
    *,
    auth_token: str,
    account_sid: str,
    status: str,
    error_code: int | None = None,
) -> SignedWebhook:
    """A status callback for a message sent with a StatusCallback URL (delivered, undelivered,
    failed...; a failure with its ErrorCode, such as 30003, 30005 or 30006)."""
    if not message.status_callback:
        raise ValueError("the message was sent without a StatusCallback")
    params = {
        "SmsSid": message.sid,
        "SmsStatus": status,
        "MessageStatus": status,
        "To": message.to,
        "MessageSid": message.sid,
        "AccountSid": account_sid,
        "From": message.from_ or FakeTwilio.sender,
        "ApiVersion": API_VERSION,
    }
    if message.messaging_service_sid:
        params["MessagingServiceSid"] = message.messaging_service_sid
    if error_code is not None:
        params["ErrorCode"] = str(error_code)
    return signed(message.status_callback, params, auth_token=auth_token)
