"""Fixtures for the push providers: the FCM and APNs fakes on loopback over TLS, with freshly
made credentials (an RSA service-account key for FCM, an EC P-256 signing key for APNs), and the
project's settings pointed at them.

The servers, the CA and the keys live for the session; each test starts from an empty fake."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.fakes.apns import FakeAPNs
from tests.fakes.fcm import FakeFCM
from tests.fakes.tls import LocalTLS

FCM_PROJECT = "gatekeeper-test"
FCM_CLIENT_EMAIL = f"push@{FCM_PROJECT}.iam.gserviceaccount.com"
APNS_TEAM_ID, APNS_KEY_ID, APNS_TOPIC = "TEAM123456", "KEY1234567", "com.example.app"


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="session")
def local_tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTLS:
    return LocalTLS(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def fcm_server(
    local_tls: LocalTLS, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FakeFCM, Path]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    fake = FakeFCM(
        context=local_tls.server_context(),
        project_id=FCM_PROJECT,
        client_email=FCM_CLIENT_EMAIL,
        public_key=key.public_key(),
    ).start()
    # A service-account file as the Google Cloud console gives it, but for the fake's
    # token endpoint (google-auth posts its signed assertion to `token_uri`).
    credentials = tmp_path_factory.mktemp("fcm") / "service-account.json"
    credentials.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": FCM_PROJECT,
                "private_key_id": "test-key-1",
                "private_key": pem(key).decode(),
                "client_email": FCM_CLIENT_EMAIL,
                "client_id": "1",
                "token_uri": fake.token_uri,
            }
        )
    )
    yield fake, credentials
    fake.stop()


@pytest.fixture
def fcm(fcm_server: tuple[FakeFCM, Path], local_tls: LocalTLS, settings) -> FakeFCM:
    """The FCM fake, empty, with the settings of FCMDispatcher pointed at it."""
    fake, credentials = fcm_server
    fake.reset()
    settings.GATEKEEPER_FCM_CREDENTIALS = str(credentials)
    settings.GATEKEEPER_FCM_PROJECT_ID = ""
    settings.GATEKEEPER_FCM_URL = fake.url
    settings.GATEKEEPER_FCM_CA_BUNDLE = str(local_tls.ca_bundle)
    settings.GATEKEEPER_PUSH_TIMEOUT_SECONDS = 5.0
    return fake


@pytest.fixture(scope="session")
def apns_server(
    local_tls: LocalTLS, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FakeAPNs, Path]]:
    key = ec.generate_private_key(ec.SECP256R1())
    fake = FakeAPNs(
        context=local_tls.server_context(alpn=["h2"]),
        team_id=APNS_TEAM_ID,
        key_id=APNS_KEY_ID,
        public_key=key.public_key(),
        topic=APNS_TOPIC,
    ).start()
    p8 = tmp_path_factory.mktemp("apns") / f"AuthKey_{APNS_KEY_ID}.p8"
    p8.write_bytes(pem(key))
    yield fake, p8
    fake.stop()


@pytest.fixture
def apns(apns_server: tuple[FakeAPNs, Path], local_tls: LocalTLS, settings) -> FakeAPNs:
    """The APNs fake, empty, with the settings of APNsDispatcher pointed at it."""
    fake, p8 = apns_server
    fake.reset()
    settings.GATEKEEPER_APNS_KEY = str(p8)
    settings.GATEKEEPER_APNS_KEY_ID = APNS_KEY_ID
    settings.GATEKEEPER_APNS_TEAM_ID = APNS_TEAM_ID
    settings.GATEKEEPER_APNS_TOPIC = APNS_TOPIC
    settings.GATEKEEPER_APNS_SANDBOX = False
    settings.GATEKEEPER_APNS_URL = fake.url
    settings.GATEKEEPER_APNS_CA_BUNDLE = str(local_tls.ca_bundle)
    settings.GATEKEEPER_PUSH_TIMEOUT_SECONDS = 5.0
    return fake
