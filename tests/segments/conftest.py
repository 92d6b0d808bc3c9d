"""Segment fixtures: both snapshot stores, the S3 one a real S3 API over HTTP (moto's server)."""

import io
from collections.abc import Callable, Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from segments.models import Segment
from segments.services import user_list_import
from segments.store import LocalStore, S3Store, SnapshotStore
from tests.redis_servers import free_port


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


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, settings, tmp_path) -> SnapshotStore:
    """The store the settings point at: a local directory, then S3 over HTTP."""
    from segments.index import reset_index

    reset_index()
    if request.param == "local":
        settings.GATEKEEPER_STORE_URL = str(tmp_path / "store")
        return LocalStore(tmp_path / "store")
    url = request.getfixturevalue("s3_settings")
    bucket, prefix = url[len("s3://") :].split("/", 1)
    return S3Store(bucket, prefix)


@pytest.fixture
def make_segments(db) -> Callable[..., dict[str, Segment]]:
    """Segments with lists: make_segments(vip=(10, [1, 2]), active=(20, [2, 3]))."""

    def make(**spec: tuple[int, list[int]]) -> dict[str, Segment]:
        made = {}
        for slug, (priority, ids) in spec.items():
            segment = Segment.objects.create(slug=slug, name=slug.title(), priority=priority)
            if ids:
                body = "".join(f"{i}\n" for i in ids).encode()
                user_list_import(segment=segment, fileobj=io.BytesIO(body), name=f"{slug}.txt")
            made[slug] = segment
        return made

    return make


@pytest.fixture(autouse=True)
def _fresh_index() -> Iterator[None]:
    from segments.index import reset_index

    reset_index()
    yield
    reset_index()
