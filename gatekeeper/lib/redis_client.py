"""The process-wide Redis client, built from settings.

One client per (URL, cluster flag) and process: connection pools are not fork-safe, so a
process that forks (gunicorn, Celery prefork) calls `reset_redis_clients()` in the child.
"""

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from django.conf import settings
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError

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


# Replies that mean a cluster's slot is served elsewhere now, or not at the moment: the command
# ran nothing and can be sent again once the cluster's map is read again.
_REDIRECTED = (redis.exceptions.AskError, redis.exceptions.TryAgainError, ClusterDownError)


def pipelined(client: RedisClient, commands: Iterable[Sequence[Any]]) -> list[Any]:
    """Run `commands` (each the arguments of one, as Redis takes them, its key second) in one
    round trip per node and return their replies in the order of the commands, as Redis sent
    them (bytes, ints, None); an error reply raises once all are read, as a pipeline does.

    The commands are packed and written in one go, the replies read back: redis-py's own
    pipeline spends about as long in Python per command (its command stack, its reply
    callbacks) as Redis spends running a SET, and its cluster pipeline more. On a cluster each
    command goes to the node that serves its key's slot; one refused because the slot moved
    ran nothing and is sent again after the cluster's map is read again (twice at most)."""
    commands = list(commands)
    if not isinstance(client, RedisCluster):
        return _raised(_packed(client, commands))
    replies: list[Any] = [None] * len(commands)
    todo = list(range(len(commands)))
    for _attempt in range(3):
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i in todo:
            node = client.get_node_from_key(commands[i][1])
            groups.setdefault(node.name, (node, []))[1].append(i)
        todo = []
        for node, indexes in groups.values():
            answers = _packed(client.get_redis_connection(node), [commands[i] for i in indexes])
            for i, answer in zip(indexes, answers, strict=True):
                if isinstance(answer, _REDIRECTED):
                    todo.append(i)
                else:
                    replies[i] = answer
        if not todo:
            return _raised(replies)
        client.nodes_manager.initialize()
    raise redis.exceptions.ClusterError(
        f"{len(todo)} commands were refused three times: their slots kept moving"
    )


def _raised(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
    return replies


def _packed(client: redis.Redis, commands: list[Sequence[Any]]) -> list[Any]:
    """Replies of one node to `commands`, error replies among them as exceptions."""
    if not commands:
        return []
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        packed: list[bytes] = []
        for command in commands:
            packed.extend(connection.pack_command(*command))
        connection.send_packed_command(packed)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        connection.disconnect()  # replies may be left unread: the connection is no use
        raise
    finally:
        pool.release(connection)
