"""Fixtures shared by the whole suite.

Tests talk to real parts. The single-node Redis is the machine's (127.0.0.1:6379) unless
GATEKEEPER_TEST_REDIS_URL points elsewhere; tests use their own database number and flush it,
so they never touch the data of a running gatekeeper.
"""

from collections.abc import Iterator

import boto3
import pytest
import redis
from hypothesis import settings as hypothesis_settings
from moto.server import ThreadedMotoServer

from bench.servers import free_port
from tests.settings import per_worker

# The suite's shared fixtures, by theme (tests/support/).
pytest_plugins = [
    "tests.support.admin",
    "tests.support.api",
    "tests.support.backtests",
    "tests.support.browser",
    "tests.support.dns",
    "tests.support.published",
    "tests.support.push",
    "tests.support.redis",
    "tests.support.sends",
    "tests.support.sms",
    "tests.support.stores",
    "tests.support.timing",
    "tests.support.webhooks",
    "tests.support.worker_processes",
]

# Hypothesis's profiles (docs/testing.md): `ci`, the default and `make test`'s, runs every test's
# full count of examples, the same ones every run (derandomized: a failure in CI is found again by
# running the test, and no run meets luckier examples than another); `check` (`make check`) runs a
# tenth of them; `explore` draws new examples each run, for looking for bugs on purpose. None has
# a deadline: an example slowed by a busy machine is not a failure.
hypothesis_settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
hypothesis_settings.register_profile(
    "check", deadline=None, derandomize=True, print_blob=True, max_examples=10
)
hypothesis_settings.register_profile("explore", deadline=None)
hypothesis_settings.load_profile("ci")  # --hypothesis-profile chooses another


def examples(full: int) -> int:
    """A test's count of examples under the profile in force: `full` but under `check`."""
    if hypothesis_settings.get_current_profile_name() == "check":
        return max(3, full // 10)
    return full


TEST_REDIS_URL = per_worker(
    "GATEKEEPER_TEST_REDIS_URL",
    "redis://127.0.0.1:6379/15,redis://127.0.0.1:6379/14,redis://127.0.0.1:6379/11",
)
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "live_server", "admin_client"}
# Fixtures that start processes of their own (Redis servers and clusters, Celery workers,
# Chromium): a test asking for one is `processes`, and `make check` leaves it to `make test`.
PROCESS_FIXTURES = {
    "browser",
    "own_redis",
    "redis_cluster",
    "cluster_processes",
    "cluster_client",
    "replicated_cluster",
    "start_worker",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        # Every test that reaches the database; those whose behaviour depends on the database
        # are marked `postgres` by hand (docs/testing.md) and run again on PostgreSQL.
        if item.get_closest_marker("django_db") or fixtures & DB_FIXTURES:
            item.add_marker(pytest.mark.database)
        elif item.get_closest_marker("postgres"):
            raise pytest.UsageError(
                f"{item.nodeid} is marked postgres but never touches the database"
            )
        # A test on the Redis Cluster may start it (the run's first does).
        if fixtures & PROCESS_FIXTURES or any(
            item.get_closest_marker(name) for name in ("browser", "cluster")
        ):
            item.add_marker(pytest.mark.processes)


@pytest.fixture(autouse=True)
def _processes_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a process must say so (`processes`): `make check` runs only those
    that start none. Starting one unmarked fails the test, naming the command."""
    if request.node.get_closest_marker("processes"):
        return
    import subprocess

    def refuse(self, args, *rest, **kwargs):
        command = args if isinstance(args, str) else " ".join(map(str, args))
        raise AssertionError(
            f"this test starts a process ({command[:120]}): mark it "
            "`@pytest.mark.processes` (or its module's pytestmark)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(autouse=True)
def _test_settings(settings, tmp_path):
    from limits.engine.reservations import holds_cache
    from limits.ledger.table import kinds_forget
    from limits.people.preferences import preference_cache
    from limits.people.suppression import erasure_key_forget, suppression_cache
    from limits.policy.selectors import policy_cache
    from worker.delivery.mailboxes import mailboxes_forget
    from worker.delivery.mx import mx_forget
    from worker.delivery.warmup import warmup_forget

    # Rules, the suppression list and people's preferences are kept per process: never carry
    # one test's into the next.
    policy_cache().invalidate()
    suppression_cache().clear()
    preference_cache().clear()
    holds_cache().clear()  # the reservations' holds, as the plan wrote them
    erasure_key_forget()  # the erasure key the emptied database made
    kinds_forget()  # the ledger's kinds this process remembers, by id
    mailboxes_forget()  # the mailbox providers and warm-up plans, as this process read them
    warmup_forget()
    mx_forget()  # recipient domains' mail servers
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
