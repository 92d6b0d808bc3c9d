"""FCM and APNs: the real firebase_admin and httpx clients against local fakes over TLS (the
fakes check auth and payloads as the providers do), then whole send jobs through the worker."""

import json
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bench.servers import free_port
from tests.fakes.apns import FakeAPNs, device_token
from tests.fakes.fcm import FCM_SCOPES, FakeFCM, registration_token
from tests.support.push import APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC, FCM_CLIENT_EMAIL, pem
from worker.chunks import send_chunk_run
from worker.delivery.apns import APNsDispatcher, apns_id
from worker.delivery.base import AMBIGUOUS, PERMANENT, THROTTLED, TRANSIENT, DispatchError, Message
from worker.delivery.fcm import FCMDispatcher
from worker.delivery.registry import dispatcher_for
from worker.models import SendChunk
from worker.services import send_job_create

# firebase-admin 7.7 deprecates Message.token for Firebase installation ids (FIDs); the
# addresses here are registration tokens, which FCM still takes (see FCMDispatcher).
pytestmark = pytest.mark.filterwarnings("ignore:Message.token is deprecated:DeprecationWarning")


def message(n: int, address: str, **data: Any) -> Message:
    return Message(
        message_id=f"spring:{n}",
        user_id=n,
        address=address,
        subject="Spring sale",
        body="Everything 20% off.\n",
        data=data,
    )


def outcome(error: DispatchError | None) -> tuple[str, bool, float | None] | None:
    """What the worker reads of an outcome: (kind, invalid, retry_after), None when sent."""
    return None if error is None else (error.kind, error.invalid, error.retry_after)


# --- FCM ----------------------------------------------------------------------------------------


@pytest.fixture
def fcm_backend(fcm: FakeFCM):
    backend = FCMDispatcher()
    yield backend
    backend.close()


def test_fcm_sends_a_batch_and_says_what_each_failure_is_worth(fcm, fcm_backend):
    good, other_good, dead, mismatched, throttled, down, too_big = (
        registration_token(n) for n in range(1, 8)
    )
    fcm.answer(dead, "UNREGISTERED")
    fcm.answer(mismatched, "SENDER_ID_MISMATCH")
    fcm.answer(throttled, "QUOTA_EXCEEDED", retry_after="7")
    fcm.answer(down, "UNAVAILABLE")
    fcm.answer(too_big, "MESSAGE_TOO_BIG")
    messages = [
        message(1, good, name="Ann", visits=3, vip=True, offer=None, tags=["a"], **{"from": "x"}),
        message(2, other_good),
        message(3, dead),
        message(4, "not-a-registration-token"),
        message(5, mismatched),
        message(6, throttled),
        message(7, down),
        message(8, too_big),
    ]
    outcomes = fcm_backend.send_many(messages)
    assert [outcome(error) for error in outcomes] == [
        None,
        None,
        (PERMANENT, True, None),  # UNREGISTERED
        (PERMANENT, True, None),  # INVALID_ARGUMENT: "not a valid FCM registration token"
        (PERMANENT, True, None),  # SENDER_ID_MISMATCH
        (THROTTLED, False, 7.0),  # QUOTA_EXCEEDED, Retry-After: 7
        (TRANSIENT, False, None),  # UNAVAILABLE
        (PERMANENT, False, None),  # INVALID_ARGUMENT, not about the token
    ]
    # Exactly the good ones went out, each once: the library retried neither the 503 nor the
    # 429 (the worker does, at its pace).
    assert sorted(fcm.tokens_sent()) == sorted([good, other_good])
    assert fcm.requests == len(messages)
    sent = {accepted["message"]["token"]: accepted for accepted in fcm.accepted}
    assert sent[good]["message"]["notification"] == {
        "title": "Spring sale",
        "body": "Everything 20% off.",
    }
    # Data values as strings; nulls and FCM's reserved keys left out.
    assert sent[good]["message"]["data"] == {
        "name": "Ann",
        "visits": "3",
        "vip": "true",
        "tags": '["a"]',
    }
    assert "data" not in sent[other_good]["message"]
    # Authorized with the access token the token endpoint issued for the signed assertion.
    (assertion,) = fcm.assertions
    assert assertion["iss"] == FCM_CLIENT_EMAIL
    assert FCM_SCOPES & set(assertion["scope"].split())
    (access_token,) = fcm.access_tokens
    assert {a["authorization"] for a in fcm.accepted} == {f"Bearer {access_token}"}


def test_fcm_keeps_its_access_token_and_connections_between_batches(fcm, fcm_backend):
    for n in range(3):
        assert fcm_backend.send_many([message(n, registration_token(n))]) == [None]
    assert len(fcm.assertions) == 1
    assert len(fcm.tokens_sent()) == 3


def test_fcm_send_raises_what_send_many_returns(fcm, fcm_backend):
    fcm.answer(registration_token(1), "UNREGISTERED")
    fcm_backend.send(message(2, registration_token(2)))
    with pytest.raises(DispatchError) as failed:
        fcm_backend.send(message(1, registration_token(1)))
    assert (failed.value.kind, failed.value.invalid) == (PERMANENT, True)


def test_an_fcm_connection_lost_after_the_request_is_ambiguous_and_never_resent(fcm, fcm_backend):
    fcm.answer(registration_token(1), "DROP")
    outcomes = fcm_backend.send_many([message(1, registration_token(1))])
    assert outcome(outcomes[0]) == (AMBIGUOUS, False, None)
    assert fcm.requests == 1  # not POSTed again: FCM has no idempotency key


def test_an_fcm_endpoint_that_refuses_connections_is_transient(fcm, settings):
    settings.GATEKEEPER_FCM_URL = f"https://127.0.0.1:{free_port()}"
    backend = FCMDispatcher()
    try:
        outcomes = backend.send_many([message(1, registration_token(1))] * 2)
    finally:
        backend.close()
    assert [outcome(error) for error in outcomes] == [(TRANSIENT, False, None)] * 2


def test_fcm_credentials_the_token_endpoint_refuses_send_nothing(fcm, settings, tmp_path):
    forged = json.loads(Path(settings.GATEKEEPER_FCM_CREDENTIALS).read_text())
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged["private_key"] = pem(other_key).decode()
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged))
    settings.GATEKEEPER_FCM_CREDENTIALS = str(path)
    backend = FCMDispatcher()
    try:
        outcomes = backend.send_many([message(1, registration_token(1))])
    finally:
        backend.close()
    assert outcome(outcomes[0]) == (TRANSIENT, False, None)
    assert (fcm.assertions, fcm.requests) == ([], 0)


# --- APNs ---------------------------------------------------------------------------------------


@pytest.fixture
def apns_backend(apns: FakeAPNs):
    backend = APNsDispatcher()
    yield backend
    backend.close()


def test_apns_sends_a_batch_and_says_what_each_failure_is_worth(apns, apns_backend):
    good, other_good, gone, bad, wrong_app, throttled, down = (device_token(n) for n in range(1, 8))
    apns.answer(gone, "Unregistered")
    apns.answer(bad, "BadDeviceToken")
    apns.answer(wrong_app, "DeviceTokenNotForTopic")
    apns.answer(throttled, "TooManyRequests")
    apns.answer(down, "ServiceUnavailable")
    messages = [
        message(1, good, name="Ann", visits=3, aps="not ours"),
        message(2, other_good),
        message(3, gone),
        message(4, bad),
        message(5, "<0123 4567>"),  # not a token: refused before sending
        message(6, wrong_app),
        message(7, throttled),
        message(8, down),
    ]
    outcomes = apns_backend.send_many(messages)
    assert [outcome(error) for error in outcomes] == [
        None,
        None,
        (PERMANENT, True, None),  # 410 Unregistered
        (PERMANENT, True, None),  # 400 BadDeviceToken
        (PERMANENT, True, None),  # not a device token
        (PERMANENT, True, None),  # 400 DeviceTokenNotForTopic
        (TRANSIENT, False, None),  # 429 TooManyRequests: too many to this one device
        (TRANSIENT, False, None),  # 503 ServiceUnavailable
    ]
    assert sorted(apns.tokens_sent()) == sorted([good, other_good])
    assert apns.requests == len(messages) - 1
    assert apns.connections == 1  # the whole batch over one HTTP/2 connection
    sent = {accepted["token"]: accepted for accepted in apns.accepted}
    assert sent[good]["payload"] == {
        "aps": {"alert": {"title": "Spring sale", "body": "Everything 20% off."}},
        "name": "Ann",
        "visits": 3,
    }
    assert sent[other_good]["payload"] == {
        "aps": {"alert": {"title": "Spring sale", "body": "Everything 20% off."}}
    }
    headers = sent[good]["headers"]
    # apns-id: the same UUID for every attempt of a send (version 5, from its message id).
    assert headers["apns-id"] == apns_id("spring:1") != apns_id("spring:2")
    assert uuid.UUID(headers["apns-id"]).version == 5
    assert (headers["apns-push-type"], headers["apns-topic"]) == ("alert", APNS_TOPIC)
    # The fake verified the provider token (ES256, kid, iss) before taking any push.
    token = headers["authorization"].removeprefix("bearer ")
    assert jwt.get_unverified_header(token)["kid"] == APNS_KEY_ID
    assert jwt.decode(token, options={"verify_signature": False})["iss"] == APNS_TEAM_ID


def test_apns_reuses_its_connection_and_provider_token_between_batches(apns, apns_backend):
    for n in range(3):
        assert apns_backend.send_many([message(n, device_token(n))] * 2) == [None, None]
    assert apns.connections == 1
    assert len({accepted["headers"]["authorization"] for accepted in apns.accepted}) == 1


def test_an_apns_connection_lost_after_the_request_is_ambiguous_and_never_resent(
    apns, apns_backend
):
    apns.answer(device_token(2), "DROP")
    outcomes = apns_backend.send_many([message(1, device_token(1)), message(2, device_token(2))])
    assert [outcome(error) for error in outcomes] == [None, (AMBIGUOUS, False, None)]
    assert apns.requests == 2
    # The next batch opens a new connection.
    assert apns_backend.send_many([message(3, device_token(3))]) == [None]
    assert apns.connections == 2


def test_an_apns_endpoint_that_refuses_connections_is_transient_for_the_whole_batch(apns, settings):
    settings.GATEKEEPER_APNS_URL = f"https://127.0.0.1:{free_port()}"
    backend = APNsDispatcher()
    try:
        outcomes = backend.send_many([message(n, device_token(n)) for n in range(3)])
    finally:
        backend.close()
    assert [outcome(error) for error in outcomes] == [(TRANSIENT, False, None)] * 3


def test_a_provider_token_apns_cannot_verify_is_refused_permanently(apns, settings, tmp_path):
    other_key = tmp_path / "other.p8"
    other_key.write_bytes(pem(ec.generate_private_key(ec.SECP256R1())))
    settings.GATEKEEPER_APNS_KEY = str(other_key)
    backend = APNsDispatcher()
    try:
        (error,) = backend.send_many([message(1, device_token(1))])
    finally:
        backend.close()
    assert outcome(error) == (PERMANENT, False, None)
    assert "InvalidProviderToken" in str(error)
    assert apns.accepted == []


def test_apns_device_tokens_are_whole_bytes_in_hex():
    assert APNsDispatcher.address_problem(device_token(1)) is None
    assert APNsDispatcher.address_problem("AB" * 100) is None  # longer tokens Apple may issue
    for bad in ("ab" * 31, "ab" * 101, "a" * 65, "g" * 64, "<" + "ab" * 32 + ">", ""):
        assert APNsDispatcher.address_problem(bad)
    assert FCMDispatcher.address_problem(registration_token(1)) is None


# --- through the worker -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("provider", ["fcm", "apns"])
def test_a_send_job_through_the_worker_counts_the_dead_tokens_as_failed(
    provider, request, published, settings
):
    fake = request.getfixturevalue(provider)
    # As earlier versions documented the setting: still read.
    settings.GATEKEEPER_PUSH_BACKEND = {
        "fcm": "worker.push_providers.FCMPushBackend",
        "apns": "worker.push_providers.APNsPushBackend",
    }[provider]
    token = registration_token if provider == "fcm" else device_token
    published(vip=(10, list(range(1, 30)), {"push": (None, None)}))
    dead = {token(3), token(7), token(11)}
    for address in dead:
        fake.answer(address, "UNREGISTERED" if provider == "fcm" else "Unregistered")
    job = send_job_create(
        channel="push",
        campaign="spring",
        template="welcome",
        recipients=[
            {"user_id": u, "address": token(u), "context": {"name": f"User {u}"}}
            for u in range(1, 21)
        ],
        queue=False,
    )
    dispatcher = dispatcher_for("push")  # what a chunk run builds from the settings
    try:
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, dispatcher=dispatcher)
    finally:
        dispatcher.close()
    job.refresh_from_db()
    good = {token(u) for u in range(1, 21)} - dead
    assert (job.status, job.sent, job.failed, job.ambiguous) == ("done", 17, 3, 0)
    assert sorted(fake.tokens_sent()) == sorted(good)
    if provider == "fcm":
        first = next(a["message"] for a in fake.accepted if a["message"]["token"] == token(1))
        assert first["notification"]["title"] == "Welcome aboard"
        assert first["data"] == {"name": "User 1"}
    else:
        first = next(a["payload"] for a in fake.accepted if a["token"] == token(1))
        assert first["aps"]["alert"]["title"] == "Welcome aboard"
        assert first["name"] == "User 1"
