"""Email through email service providers (django-anymail), and their tracking webhooks feeding
the suppression list.

The real anymail backends, requests and boto3 talk over loopback sockets to local servers that
speak each ESP's API (tests/fakes/esp.py) and to moto's real SES server; the webhooks get each
ESP's real payloads through Django's test client, with the webhook secret."""

import base64
import email
import email.policy
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from django.core.management import call_command
from django.test import Client
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

from limits.models.people import Suppression
from tests.fakes.esp import (
    DROP,
    HANG,
    LOST,
    FakeEsp,
    FakeMailgun,
    FakePostmark,
    FakeResend,
    FakeSendGrid,
    FakeSesV2,
    Status,
    closed_port_url,
)
from worker.chunks import send_chunk_run
from worker.delivery.base import AMBIGUOUS, PERMANENT, THROTTLED, TRANSIENT, Recipient
from worker.delivery.esp import AnymailDispatcher, message_id_header
from worker.delivery.registry import dispatcher_class, dispatcher_for
from worker.delivery.rendering import Renderer
from worker.gate import gate_check
from worker.models import SendChunk
from worker.services import send_job_create

FROM = "Rides <marketing@example.com>"
WEBHOOK_SECRET = "hook:s3cret-for-tests"
MAILGUN_SIGNING_KEY = "mailgun-webhook-signing-key"
TIMEOUT = 0.5  # seconds the ESP may take: a hanging one costs a test no more
MOTO_TIMEOUT = 10.0  # seconds moto's SES may take to answer

pytestmark = pytest.mark.filterwarnings("ignore::anymail.exceptions.AnymailNotSupportedWarning")


# --- ESPs -------------------------------------------------------------------------------------


def _postmark(settings: Any, fake: FakePostmark, url: str) -> None:
    settings.EMAIL_BACKEND = "anymail.backends.postmark.EmailBackend"
    settings.ANYMAIL = {"POSTMARK_SERVER_TOKEN": fake.token, "POSTMARK_API_URL": url + "/"}


def _sendgrid(settings: Any, fake: FakeSendGrid, url: str) -> None:
    settings.EMAIL_BACKEND = "anymail.backends.sendgrid.EmailBackend"
    settings.ANYMAIL = {"SENDGRID_API_KEY": fake.api_key, "SENDGRID_API_URL": url + "/v3/"}


def _mailgun(settings: Any, fake: FakeMailgun, url: str) -> None:
    settings.EMAIL_BACKEND = "anymail.backends.mailgun.EmailBackend"
    settings.ANYMAIL = {"MAILGUN_API_KEY": fake.api_key, "MAILGUN_API_URL": url + "/v3"}


def _resend(settings: Any, fake: FakeResend, url: str) -> None:
    settings.EMAIL_BACKEND = "anymail.backends.resend.EmailBackend"
    settings.ANYMAIL = {"RESEND_API_KEY": fake.api_key, "RESEND_API_URL": url + "/"}


ESPS: dict[str, tuple[type[FakeEsp], Callable[[Any, Any, str], None]]] = {
    "postmark": (FakePostmark, _postmark),
    "sendgrid": (FakeSendGrid, _sendgrid),
    "mailgun": (FakeMailgun, _mailgun),
    "resend": (FakeResend, _resend),
}
BATCHING = ["postmark", "sendgrid", "mailgun"]


def point_at(settings: Any, name: str, fake: FakeEsp, url: str | None = None) -> None:
    settings.DEFAULT_FROM_EMAIL = FROM
    ESPS[name][1](settings, fake, url or fake.base)
    settings.ANYMAIL["REQUESTS_TIMEOUT"] = TIMEOUT


@pytest.fixture
def esp(request: pytest.FixtureRequest, settings: Any) -> Iterator[FakeEsp]:
    """The fake ESP named by the test's parameter, with the settings pointing at it."""
    fake = ESPS[request.param][0]()
    point_at(settings, request.param, fake)
    yield fake
    fake.close()


def rendered(template: str, *user_ids: int, campaign: str = "spring", **context: Any) -> list:
    """Marketing messages as the worker renders them, to u<id>@example.com."""
    renderer = Renderer(channel="email", template=template, campaign=campaign)
    return [
        renderer(
            Recipient(
                message_id=f"{campaign}:{u}",
                user_id=u,
                address=f"u{u}@example.com",
                context={k: v.format(u=u) for k, v in context.items()},
            )
        )
        for u in user_ids
    ]


def assert_own_copy(fake: FakeEsp, message: Any) -> None:
    """The recipient got exactly one copy, addressed to them alone, with their own headers."""
    (copy,) = fake.delivered_to(message.address)
    assert copy.to == [message.address]
    assert (copy.subject, copy.text, copy.html) == (message.subject, message.body, message.html)
    assert copy.headers["list-unsubscribe"] == message.headers["List-Unsubscribe"]
    assert copy.headers["list-unsubscribe-post"] == "List-Unsubscribe=One-Click"
    assert copy.headers["x-gatekeeper-message-id"] == message.message_id
    assert copy.headers["message-id"] == message_id_header(message.message_id, "example.com")
    assert copy.metadata["user_id"] == str(message.user_id)
    assert copy.metadata["message_id"] == message.message_id


@pytest.mark.parametrize("esp", BATCHING, indirect=True)
def test_identical_marketing_emails_go_as_one_call_each_copy_with_its_own_headers(esp):
    messages = rendered("offer", 1, 2, 3)
    dispatcher = dispatcher_for("email")
    assert dispatcher.provider == esp.name
    assert dispatcher.batch_size == {"postmark": 500, "sendgrid": 1000, "mailgun": 1000}[esp.name]
    assert dispatcher.idempotent is False
    assert dispatcher.send_many(messages) == [None, None, None]
    assert len(esp.requests) == 1
    for message in messages:
        assert_own_copy(esp, message)
    # Each user's one-click link is their own.
    assert len({m.headers["List-Unsubscribe"] for m in messages}) == 3


@pytest.mark.parametrize("esp", BATCHING, indirect=True)
def test_personalised_emails_go_one_call_each(esp):
    messages = rendered("welcome", 1, 2, 3, name="Rider {u}")
    assert dispatcher_for("email").send_many(messages) == [None, None, None]
    assert len(esp.requests) == 3
    for message in messages:
        assert_own_copy(esp, message)
    assert esp.delivered_to("u2@example.com")[0].subject == "Welcome aboard, Rider 2"


@pytest.mark.parametrize("esp", ["postmark"], indirect=True)
def test_a_batch_groups_identical_sends_and_names_each_address_once_a_call(esp):
    offers = rendered("offer", 1, 2, 4)
    again = rendered("offer", 1, campaign="autumn")  # the same text to u1 again, another send
    welcome = rendered("welcome", 3, name="Rider {u}")
    messages = [offers[0], welcome[0], offers[1], again[0], offers[2]]
    dispatcher = dispatcher_for("email")
    assert isinstance(dispatcher, AnymailDispatcher)
    assert dispatcher.calls(messages) == [[0, 2, 4], [1], [3]]
    assert dispatcher.send_many(messages) == [None] * 5
    assert [r.path for r in esp.requests] == ["/email/batch", "/email", "/email"]
    assert len(esp.delivered_to("u1@example.com")) == 2


def _refusal(name: str) -> Status:
    """The ESP refusing the request itself (a 4xx of its own kind)."""
    if name == "postmark":
        return Status(422, body={"ErrorCode": 300, "Message": "Invalid 'From' address: 'x'."})
    return Status(400)


ERROR_CASES = {
    # case: (the answer, the kind every send of the batch gets, retry_after)
    "throttled": (Status(429, {"Retry-After": "7"}), THROTTLED, 7.0),
    "server error": (Status(503), TRANSIENT, None),
    "refused": (None, PERMANENT, None),
    "read timeout": (HANG, AMBIGUOUS, None),
    "connection lost": (DROP, AMBIGUOUS, None),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
@pytest.mark.parametrize("esp", BATCHING, indirect=True)
def test_a_failed_call_gives_every_send_of_the_batch_its_kind(esp, case):
    answer, kind, retry_after = ERROR_CASES[case]
    esp.then(answer if answer is not None else _refusal(esp.name))
    started = time.monotonic()
    outcomes = dispatcher_for("email").send_many(rendered("offer", 1, 2, 3))
    assert [(o.kind, o.retry_after, o.invalid) for o in outcomes] == [
        (kind, retry_after, False)
    ] * 3, outcomes
    assert len(esp.requests) == 1
    assert esp.deliveries == []
    assert time.monotonic() - started < TIMEOUT + 2


@pytest.mark.parametrize("name", BATCHING)
def test_an_esp_that_cannot_be_reached_is_transient(name, settings):
    fake = ESPS[name][0]()
    try:
        point_at(settings, name, fake, url=closed_port_url())
        outcomes = dispatcher_for("email").send_many(rendered("offer", 1, 2))
    finally:
        fake.close()
    assert [o.kind for o in outcomes] == [TRANSIENT, TRANSIENT]
    assert "nothing sent" in str(outcomes[0])


@pytest.mark.parametrize("esp", ["postmark"], indirect=True)
def test_postmark_refusing_one_inactive_address_fails_only_that_send_as_dead(esp):
    esp.inactive = {"u2@example.com"}
    one, two, three = dispatcher_for("email").send_many(rendered("offer", 1, 2, 3))
    assert (one, three) == (None, None)
    assert (two.kind, two.invalid) == (PERMANENT, True)
    # Alone (POST /email), Postmark answers 422 with the same ErrorCode 406.
    (alone,) = dispatcher_for("email").send_many(rendered("offer", 2, campaign="autumn"))
    assert (alone.kind, alone.invalid) == (PERMANENT, True)
    assert [r.path for r in esp.requests] == ["/email/batch", "/email"]


@pytest.mark.parametrize("esp", ["sendgrid", "mailgun"], indirect=True)
def test_a_refused_address_refuses_the_whole_call(esp):
    esp.invalid = {"u2@example.com"}
    outcomes = dispatcher_for("email").send_many(rendered("offer", 1, 2, 3))
    assert [o.kind for o in outcomes] == [PERMANENT] * 3
    assert esp.deliveries == []


@pytest.mark.parametrize("esp", ["resend"], indirect=True)
def test_resend_is_idempotent_a_send_again_after_a_lost_answer_goes_out_once(esp):
    dispatcher = dispatcher_for("email")
    assert (dispatcher.idempotent, dispatcher.batch_size) == (True, 1)
    messages = rendered("offer", 1, 2)
    esp.then(LOST)  # Resend takes the first and sends it, but its answer never comes
    first, second = dispatcher.send_many(messages)
    assert (first.kind, second) == (AMBIGUOUS, None)
    # The worker sends an unknown outcome again: with the same key, Resend sends nothing.
    assert dispatcher.send_many(messages[:1]) == [None]
    keys = [r.headers["idempotency-key"] for r in esp.requests]
    assert keys == ["spring:1", "spring:2", "spring:1"]
    assert len(esp.delivered_to("u1@example.com")) == 1
    for message in messages:
        assert_own_copy(esp, message)


def test_an_esp_anymail_has_no_dispatcher_of_ours_for_sends_one_message_a_call(settings):
    settings.EMAIL_BACKEND = "anymail.backends.sparkpost.EmailBackend"
    cls = dispatcher_class("email")
    assert issubclass(cls, AnymailDispatcher)
    assert (cls.provider, cls.batch_size, cls.idempotent, cls.batches) == (
        "sparkpost",
        1,
        False,
        False,
    )
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    assert dispatcher_class("email").provider == "smtp"


# --- Amazon SES: moto's server ----------------------------------------------------------------


def _ses_settings(settings: Any, endpoint: str, *, read_timeout: float = TIMEOUT) -> None:
    settings.DEFAULT_FROM_EMAIL = FROM
    settings.EMAIL_BACKEND = "anymail.backends.amazon_ses.EmailBackend"
    settings.ANYMAIL = {
        "AMAZON_SES_CLIENT_PARAMS": {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "test",
            "aws_secret_access_key": "test",
            "config": {"connect_timeout": 1, "read_timeout": read_timeout},
        },
    }


@pytest.fixture
def ses(settings, s3_endpoint: str) -> Callable[[], list[Any]]:
    """Settings pointing at moto's server (the suite's S3 one serves SES too), the sender's
    domain verified there; returns what gives the raw messages SES took since."""
    boto3.client(
        "sesv2",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_email_identity(EmailIdentity="example.com")
    # moto answers every call (no hang to wait out), but on a busy machine its first answer
    # of a kind can take longer than a hanging fake's bound.
    _ses_settings(settings, s3_endpoint, read_timeout=MOTO_TIMEOUT)
    backend = ses_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    start = len(backend.sent_messages)
    return lambda: list(backend.sent_messages[start:])


def test_amazon_ses_sends_each_message_alone_with_its_headers_and_metadata(ses):
    messages = rendered("offer", 1, 2)
    dispatcher = dispatcher_for("email")
    assert (dispatcher.provider, dispatcher.batch_size, dispatcher.idempotent) == (
        "amazon_ses",
        1,
        False,
    )
    assert dispatcher.send_many(messages) == [None, None]
    sent = ses()
    assert len(sent) == 2
    for message, raw in zip(messages, sent, strict=True):
        mime = email.message_from_string(raw.raw_data, policy=email.policy.default)
        # (moto lists the To header's addresses after SendEmail's destinations)
        assert set(raw.destinations) == {message.address}
        # (Django folds the long header before its value: the same value, unfolded)
        assert mime["List-Unsubscribe"].strip() == message.headers["List-Unsubscribe"]
        assert mime["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert mime["X-Gatekeeper-Message-Id"] == message.message_id
        assert mime["Message-ID"] == message_id_header(message.message_id, "example.com")
        assert json.loads(mime["X-Metadata"]) == {
            "user_id": str(message.user_id),
            "message_id": message.message_id,
        }


def test_amazon_ses_refusing_an_unverified_sender_is_permanent(ses, settings):
    settings.DEFAULT_FROM_EMAIL = "marketing@not-verified.test"
    (outcome,) = dispatcher_for("email").send_many(rendered("offer", 1))
    assert outcome.kind == PERMANENT and "MessageRejected" in str(outcome)
    assert ses() == []


SES_CASES = {
    "throttled": (
        Status(
            429,
            {"x-amzn-ErrorType": "TooManyRequestsException", "Retry-After": "3"},
            {"message": "Maximum sending rate exceeded."},
        ),
        THROTTLED,
    ),
    "server error": (
        Status(500, {"x-amzn-ErrorType": "InternalFailure"}, {"message": "oops"}),
        TRANSIENT,
    ),
    "read timeout": (HANG, AMBIGUOUS),
    "connection lost": (DROP, AMBIGUOUS),
}


@pytest.mark.parametrize("case", list(SES_CASES))
def test_amazon_ses_failures_are_classified_and_never_retried_by_botocore(case, settings):
    answer, kind = SES_CASES[case]
    fake = FakeSesV2()
    try:
        _ses_settings(settings, fake.base)
        fake.then(answer, Status(200, body={"MessageId": "second-copy"}))
        (outcome,) = dispatcher_for("email").send_many(rendered("offer", 1))
    finally:
        fake.close()
    assert outcome.kind == kind, outcome
    if kind == THROTTLED:
        assert outcome.retry_after == 3.0
    # botocore would have sent it again (a second copy): one request, the worker decides.
    assert len(fake.requests) == 1


def test_amazon_ses_out_of_reach_is_transient(settings):
    _ses_settings(settings, closed_port_url())
    (outcome,) = dispatcher_for("email").send_many(rendered("offer", 1))
    assert outcome.kind == TRANSIENT


# --- Send jobs through the chunk code ---------------------------------------------------------


@pytest.fixture
def riders(published) -> list[int]:
    users = [1, 2, 3, 4]
    published(vip=(10, users, {"email": (None, None)}))
    return users


def offer_job(users: list[int], campaign: str = "spring") -> Any:
    job = send_job_create(
        channel="email",
        campaign=campaign,
        template="offer",
        recipients=[{"user_id": u, "address": f"u{u}@example.com"} for u in users],
        queue=False,
    )
    for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
        send_chunk_run(chunk_id=chunk.pk)
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("esp", ["postmark"], indirect=True)
def test_a_job_goes_out_in_one_batch_call_and_counts_a_dead_address_failed(esp, riders):
    esp.inactive = {"u3@example.com"}
    job = offer_job(riders)
    assert (job.status, job.sent, job.failed, job.ambiguous) == ("done", 3, 1, 0)
    assert [r.path for r in esp.requests] == ["/email/batch"]
    assert sorted(a for d in esp.deliveries for a in d.to) == [
        "u1@example.com",
        "u2@example.com",
        "u4@example.com",
    ]


@pytest.mark.parametrize("esp", ["sendgrid"], indirect=True)
def test_a_job_refused_for_the_rate_pauses_and_sends_the_batch_again(esp, riders):
    esp.then(Status(429, {"Retry-After": "1"}))
    job = offer_job(riders)
    assert (job.status, job.sent, job.failed) == ("done", 4, 0)
    assert len(esp.requests) == 2
    assert len(esp.deliveries) == 4


@pytest.mark.parametrize("esp", ["mailgun"], indirect=True)
def test_a_job_whose_call_timed_out_counts_ambiguous_and_sends_nothing_again(esp, riders):
    esp.then(LOST)
    job = offer_job(riders)
    assert (job.status, job.sent, job.ambiguous) == ("done", 0, 4)
    assert len(esp.requests) == 1
    assert len(esp.deliveries) == 4  # Mailgun did take them: not sent twice


# --- Tracking webhooks -> suppression list ----------------------------------------------------

USER = 7
ADDRESS = f"u{USER}@example.com"
METADATA = {"user_id": str(USER), "message_id": f"spring:{USER}"}


def _postmark_event(kind: str, metadata: dict[str, str]) -> dict[str, Any]:
    if kind == "unsubscribe":
        return {
            "RecordType": "SubscriptionChange",
            "MessageID": str(uuid.uuid4()),
            "ServerID": 23,
            "MessageStream": "broadcast",
            "ChangedAt": "2026-06-10T10:00:00Z",
            "Recipient": ADDRESS,
            "Origin": "Recipient",
            "SuppressSending": True,
            "SuppressionReason": "ManualSuppression",
            "Tag": "",
            "Metadata": metadata,
        }
    record, type_, code = {
        "bounce": ("Bounce", "HardBounce", 1),
        "soft bounce": ("Bounce", "SoftBounce", 4096),
        "complaint": ("SpamComplaint", "SpamComplaint", 512),
    }[kind]
    return {
        "RecordType": record,
        "ID": 4323372036854775807,
        "Type": type_,
        "TypeCode": code,
        "Name": type_,
        "Tag": "",
        "MessageID": str(uuid.uuid4()),
        "Metadata": metadata,
        "ServerID": 23,
        "MessageStream": "broadcast",
        "Description": "The server was unable to deliver your message.",
        "Details": "smtp;550 5.1.1 The email account that you tried to reach does not exist.",
        "Email": ADDRESS,
        "From": "marketing@example.com",
        "BouncedAt": "2026-06-10T10:00:00Z",
        "DumpAvailable": False,
        "Inactive": type_ != "SoftBounce",
        "CanActivate": True,
        "Subject": "A ride offer for you",
    }


def _sendgrid_events(kind: str, metadata: dict[str, str]) -> list[dict[str, Any]]:
    event: dict[str, Any] = {
        "email": ADDRESS,
        "timestamp": 1781085600,
        "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
        "sg_event_id": uuid.uuid4().hex,
        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
        "anymail_id": str(uuid.uuid4()),
        **metadata,  # SendGrid merges the custom_args into each event
    }
    if kind in ("bounce", "soft bounce"):
        event.update(
            event="bounce",
            reason="550 5.1.1 unknown recipient",
            status="5.1.1",
            type="bounce" if kind == "bounce" else "blocked",
        )
    else:
        event["event"] = {"complaint": "spamreport", "unsubscribe": "unsubscribe"}[kind]
    return [event]


def _mailgun_event(kind: str, metadata: dict[str, str]) -> dict[str, Any]:
    timestamp, token = str(int(time.time())), uuid.uuid4().hex
    signature = hmac.new(
        MAILGUN_SIGNING_KEY.encode(), f"{timestamp}{token}".encode(), hashlib.sha256
    ).hexdigest()
    data: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "timestamp": 1781085600.5,
        "recipient": ADDRESS,
        "message": {"headers": {"message-id": "20260610.1@example.com", "to": ADDRESS}},
        "user-variables": metadata,
        "tags": [],
    }
    if kind in ("bounce", "soft bounce"):
        data.update(
            {
                "event": "failed",
                "severity": "permanent" if kind == "bounce" else "temporary",
                "reason": "bounce" if kind == "bounce" else "generic",
                "delivery-status": {
                    "code": 550 if kind == "bounce" else 452,
                    "message": "5.1.1 The email account does not exist",
                    "description": "",
                },
            }
        )
    else:
        data["event"] = {"complaint": "complained", "unsubscribe": "unsubscribed"}[kind]
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature},
        "event-data": data,
    }


def _ses_notification(kind: str, metadata: dict[str, str]) -> dict[str, Any]:
    mail = {
        "timestamp": "2026-06-10T10:00:00.000Z",
        "source": "marketing@example.com",
        "messageId": "0100018f-1234",
        "destination": [ADDRESS],
        "headersTruncated": False,
        "headers": [
            {"name": "To", "value": ADDRESS},
            {"name": "X-Metadata", "value": json.dumps(metadata)},
        ],
    }
    if kind == "complaint":
        event: dict[str, Any] = {
            "eventType": "Complaint",
            "complaint": {
                "complainedRecipients": [{"emailAddress": ADDRESS}],
                "timestamp": "2026-06-10T10:01:00.000Z",
                "feedbackId": "0100018f-feedback",
                "complaintFeedbackType": "abuse",
            },
        }
    else:
        event = {
            "eventType": "Bounce",
            "bounce": {
                "bounceType": "Permanent" if kind == "bounce" else "Transient",
                "bounceSubType": "General" if kind == "bounce" else "MailboxFull",
                "bouncedRecipients": [
                    {
                        "emailAddress": ADDRESS,
                        "action": "failed",
                        "status": "5.1.1",
                        "diagnosticCode": "smtp; 550 5.1.1 user unknown",
                    }
                ],
                "timestamp": "2026-06-10T10:01:00.000Z",
                "feedbackId": "0100018f-feedback",
            },
        }
    return {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:ses-events",
        "Message": json.dumps({**event, "mail": mail}),
        "Timestamp": "2026-06-10T10:01:01.000Z",
        "SignatureVersion": "1",
        "Signature": "not-checked",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/cert.pem",
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
    }


PAYLOADS: dict[str, Callable[[str, dict[str, str]], Any]] = {
    "postmark": _postmark_event,
    "sendgrid": _sendgrid_events,
    "mailgun": _mailgun_event,
    "amazon_ses": _ses_notification,
}
ESP_NAMES = {
    "postmark": "Postmark",
    "sendgrid": "SendGrid",
    "mailgun": "Mailgun",
    "amazon_ses": "Amazon SES",
}


def post_event(
    esp: str, kind: str, metadata: dict[str, str] = METADATA, secret: str | None = WEBHOOK_SECRET
) -> Any:
    payload = PAYLOADS[esp](kind, metadata)
    extra: dict[str, Any] = {}
    if secret is not None:
        extra["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(secret.encode()).decode()
    if esp == "amazon_ses":
        extra["HTTP_X_AMZ_SNS_MESSAGE_TYPE"] = payload["Type"]
        extra["HTTP_X_AMZ_SNS_MESSAGE_ID"] = payload["MessageId"]
    return Client().post(
        f"/anymail/{esp}/tracking/",
        data=json.dumps(payload),
        content_type="application/json",
        **extra,
    )


@pytest.fixture
def webhooks(settings, published) -> None:
    settings.ANYMAIL = {
        "WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MAILGUN_WEBHOOK_SIGNING_KEY": MAILGUN_SIGNING_KEY,
    }
    published(vip=(10, [USER], {"email": (5, 10)}))


TRACKING_CASES = [
    (esp, kind, reason)
    for esp in PAYLOADS
    for kind, reason in (
        ("bounce", "bounced"),
        ("soft bounce", None),
        ("complaint", "complained"),
        ("unsubscribe", "unsubscribed"),
    )
    if not (esp == "amazon_ses" and kind == "unsubscribe")
]


@pytest.mark.parametrize(("esp", "kind", "reason"), TRACKING_CASES)
def test_a_tracking_event_suppresses_the_user_for_a_hard_bounce_a_complaint_or_an_unsubscribe(
    esp, kind, reason, webhooks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post_event(esp, kind)
    assert response.status_code == 200, response.content
    decision = gate_check(channel="email", requests=[(USER, "after-the-event")])[0]
    if reason is None:
        assert not Suppression.objects.filter(user_id=USER).exists()
        assert decision.reason == "allowed"
        return
    row = Suppression.objects.get(channel="email", user_id=USER)
    assert (row.reason, row.source) == (reason, f"esp:{ESP_NAMES[esp]}")
    assert (decision.allowed, decision.reason) == (False, "suppressed")


@pytest.mark.parametrize("esp", list(PAYLOADS))
def test_a_tracking_webhook_without_the_secret_is_refused(esp, webhooks):
    response = post_event(esp, "bounce", secret="hook:wrong")
    assert response.status_code in (400, 401)
    assert not Suppression.objects.exists()


@pytest.mark.filterwarnings("ignore::anymail.exceptions.AnymailInsecureWebhookWarning")
def test_without_a_webhook_secret_every_event_is_refused(webhooks, settings):
    settings.ANYMAIL = {}
    response = post_event("postmark", "bounce", secret=None)
    assert response.status_code == 400
    assert not Suppression.objects.exists()


def test_an_event_without_our_metadata_is_logged_and_ignored(webhooks, caplog):
    response = post_event("postmark", "bounce", metadata={})
    assert response.status_code == 200
    assert not Suppression.objects.exists()
    assert "carries no gatekeeper user id" in caplog.text


# --- Settings ---------------------------------------------------------------------------------


def test_a_bad_email_provider_stops_start_up_with_a_clear_message(settings):
    from django.core.management.base import SystemCheckError

    settings.GATEKEEPER_EMAIL_PROVIDER = "postmrk"
    with pytest.raises(SystemCheckError, match=r"worker\.E002.*'postmrk' is no dispatcher"):
        call_command("check")
    settings.GATEKEEPER_EMAIL_PROVIDER = "postmark"
    settings.ANYMAIL = {"WEBHOOK_SECRET": WEBHOOK_SECRET}
    call_command("check")
