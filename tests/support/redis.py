"""Limiter fixtures: the machine's Redis, a real 3-master Redis Cluster, and one with replicas
to fail over."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from bench.servers import RedisClusterProcesses, RedisServer
from gatekeeper.lib.redis_client import get_redis, reset_redis_clients
from limits.engine.limiter import Limiter

PREFIX = "test:"


@pytest.fixture(scope="session")
def cluster_processes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterProcesses]:
    """The run's Redis Cluster (one per test process): starting one takes seconds, so every
    test on a cluster shares it, emptied before each (`redis_cluster`, `cluster_client`'s users)."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster(
    cluster_processes: RedisClusterProcesses, cluster_client: RedisCluster
) -> RedisClusterProcesses:
    """The run's Redis Cluster, every primary emptied for this test."""
    cluster_client.flushall(target_nodes=RedisCluster.PRIMARIES)
    return cluster_processes


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[RedisClusterProcesses]:
    """A cluster of the test's own, 3 primaries each with a replica, which it may fail over."""
    cluster = RedisClusterProcesses(tmp_path / "cluster", replicas=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def cluster_client(cluster_processes: RedisClusterProcesses) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_processes.url)
    yield client
    client.close()


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def limiter(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[Limiter]:
    """The limiter on one Redis node, then on a Redis Cluster: every behaviour test runs on both."""
    if request.param == "single":
        yield Limiter(redis_client, prefix=PREFIX)
        return
    client: RedisCluster = request.getfixturevalue("cluster_client")
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield Limiter(client, prefix=PREFIX)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may flush, stop and restart."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def settings_redis(
    request: pytest.FixtureRequest, redis_client: redis.Redis, settings: Any
) -> Iterator[Any]:
    """Settings (REDIS_URL, REDIS_CLUSTER) pointing at the test's Redis, then at a 3-master
    cluster; the process's client is built from them."""
    if request.param == "cluster":
        cluster: RedisCluster = request.getfixturevalue("cluster_client")
        cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        node = cluster.get_default_node()
        settings.REDIS_URL = f"redis://{node.host}:{node.port}/0"
        settings.REDIS_CLUSTER = True
    settings.GATEKEEPER_KEY_PREFIX = "test:"
    reset_redis_clients()
    yield get_redis()
    reset_redis_clients()
