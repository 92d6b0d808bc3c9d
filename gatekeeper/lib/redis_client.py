"""The process-wide Redis client, built from settings.

One client per (URL, cluster flag) and process: connection pools are not fork-safe, so a
process that forks (gunicorn, Celery prefork) calls `reset_redis_clients()` in the child.
"""

import threading
from typing import Any

import redis
from django.conf import settings
from redis.cluster import RedisCluster

RedisClient = redis.Redis | RedisCluster

_lock = threading.Lock()
_clients: dict[tuple[str, bool], Any] = {}


def make_redis(url: str, *, cluster: bool = False) -> RedisClient:
    options: dict[str, Any] = {
        "socket_timeout": settings.REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": settings.REDIS_CONNECT_TIMEOUT,
        "health_check_interval": 30,
    }
    if cluster:
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def get_redis() -> RedisClient:
    key = (settings.REDIS_URL, bool(settings.REDIS_CLUSTER))
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = make_redis(key[0], cluster=key[1])
                _clients[key] = client
    return client


def reset_redis_clients() -> None:
    """Forget every client (after fork, or when a test points settings elsewhere)."""
    with _lock:
        _clients.clear()
