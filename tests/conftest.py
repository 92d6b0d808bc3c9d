"""Fixtures shared by the whole suite.

Tests talk to real parts. The single-node Redis is the machine's (127.0.0.1:6379) unless
GATEKEEPER_TEST_REDIS_URL points elsewhere; tests use their own database number and flush it,
so they never touch the data of a running gatekeeper.
"""

import os
from collections.abc import Iterator

import boto3
import pytest
import redis
from moto.server import ThreadedMotoServer

from bench.servers import free_port

# The suite's shared fixtures, by theme (tests/support/).
pytest_plugins = [
    "tests.support.admin",
    "tests.support.api",
    "tests.support.browser",
    "tests.support.published",
    "tests.support.push",
    "tests.support.redis",
    "tests.support.sends",
    "tests.support.sms",
    "tests.support.stores",
    "tests.support.webhooks",
    "tests.support.worker_processes",
]

TEST_REDIS_URL = os.environ.get("GATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "live_server", "admin_client"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Mark every test that reaches the database, so `make test` can run them again on PostgreSQL.
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("django_db") or fixtures & DB_FIXTURES:
            item.add_marker(pytest.mark.database)


@pytest.fixture(autouse=True)
def _test_settings(settings, tmp_path):
    from limits.holds import holds_cache
    from limits.ledger.table import kinds_forget
    from limits.preferences import preference_cache
    from limits.selectors import policy_cache
    from limits.suppression import erasure_key_forget, suppression_cache

    # Rules, the suppression list and people's preferences are kept per process: never carry
    # one test's into the next.
    policy_cache().invalidate()
    suppression_cache().clear()
    preference_cache().clear()
    holds_cache().clear()  # the reservations' holds, as the plan wrote them
    erasure_key_forget()  # the erasure key the emptied database made
    kinds_forget()  # the ledger's kinds this process remembers, by id
    settings.REDIS_URL = TEST_REDIS_URL
    settings.GATEKEEPER_STORE_URL = str(tmp_path / "store")
    settings.GATEKEEPER_SNAPSHOT_CACHE_DIR = tmp_path / "snapshot-cache"
    settings.MEDIA_ROOT = tmp_path / "media"
    # No snapshot follower threads in the test process: a test swaps versions with refresh().
    settings.GATEKEEPER_SNAPSHOT_POLL_SECONDS = 0


@pytest.fixture(autouse=True)
def _fresh_index() -> Iterator[None]:
    """No test sees another's snapshot, tasks queued on the tests' broker, or counts not yet
    written."""
    from segments.index import reset_index
    from tests.support import broker
    from worker import latency, stats, timings
    from worker.delivery import answers

    broker.clear("sends", "builds")
    reset_index()
    stats.discard_pending()
    timings.discard_pending()
    latency.discard_pending()
    answers.discard_pending()
    yield
    reset_index()


@pytest.fixture
def redis_url() -> str:
    return TEST_REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_settings(settings, s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """Point the project's settings at a fresh bucket on the S3 server; returns the store URL."""
    bucket = f"gk-{request.node.name.lower().replace('_', '-')[:40].strip('-[]')}-{free_port()}"
    settings.GATEKEEPER_S3_ENDPOINT_URL = s3_endpoint
    settings.GATEKEEPER_S3_REGION = "us-east-1"
    settings.GATEKEEPER_S3_ACCESS_KEY_ID = "test"
    settings.GATEKEEPER_S3_SECRET_ACCESS_KEY = "test"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket=bucket)
    settings.GATEKEEPER_STORE_URL = f"s3://{bucket}/gatekeeper"
    return settings.GATEKEEPER_STORE_URL
