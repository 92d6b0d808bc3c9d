"""The process-wide Redis client, built from settings.

One client per (URL, cluster flag) and process: connection pools are not fork-safe, so a
process that forks (gunicorn, Celery prefork) calls `reset_redis_clients()` in the child.
"""

import threading
import time
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


# A connection that broke or a reply that did not come: the command may or may not have run.
BROKEN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# Refusals that say a cluster's slot map has changed: the command ran nothing and goes again to
# the node that the map, read again, names for its slot. MOVED names the new owner itself;
# READONLY comes from a primary that a failover demoted to replica while it stayed up (CLUSTER
# FAILOVER TAKEOVER, or one restarted after a crash) and names nobody. redis-py's RedisCluster
# and its pipelines follow MOVED but hand READONLY back as a plain error with the map untouched,
# so a process whose map is stale would keep asking the replica.
SLOT_MOVED = (redis.exceptions.MovedError, redis.exceptions.ReadOnlyError)
# Refusals that say a cluster's slot is briefly unserved: TRYAGAIN (a command declaring keys of a
# slot being migrated, some already moved and some not) and CLUSTERDOWN (a slot whose primary is
# lost and not yet failed over). The command ran nothing and goes again after BUSY_PAUSE seconds:
# at once, it would most likely be refused again.
SLOT_BUSY = (redis.exceptions.TryAgainError, ClusterDownError)
BUSY_PAUSE = 0.25
# Errors after which a call is answered as Redis being down (`unavailable`): the server is gone
# or not serving. RedisClusterException is not a RedisError: redis-py raises it when reading a
# cluster's map again reaches no node, or when the map leaves a slot unserved.
REDIS_DOWN = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)
ATTEMPTS = 3  # per command: a broken connection, a moved slot, a cluster busy failing over


def pipelined(client: RedisClient, commands: Iterable[Sequence[Any]]) -> list[Any]:
    """Run `commands` (each the arguments of one, as Redis takes them, its key second) in one
    round trip per node and return their replies in the order of the commands, as Redis sent
    them (bytes, ints, None); an error reply raises once all are read, as a pipeline does.

    The commands are packed and written in one go, the replies read back: redis-py's own
    pipeline spends about as long in Python per command (its command stack, its reply
    callbacks) as Redis spends running a SET, and its cluster pipeline more.

    Every command must be safe to run twice: as redis-py's pipeline does, a broken connection
    or a timeout sends a node's commands again (ATTEMPTS in all), and some of them may have run
    before it broke. On a cluster each command goes to the node that serves its key's slot; a
    command refused because its slot moved (MOVED, or READONLY from a primary a failover
    demoted: the cluster's map is read again, once for all of them), is being moved (ASK: sent
    to the importing node after ASKING) or is briefly unserved (TRYAGAIN, CLUSTERDOWN: after a
    quarter second) ran nothing and is sent again."""
    commands = list(commands)
    if not isinstance(client, RedisCluster):
        for _attempt in range(ATTEMPTS - 1):
            try:
                return _raised(_packed(client, commands))
            except BROKEN:
                pass  # on a new connection
        return _raised(_packed(client, commands))
    replies: list[Any] = [None] * len(commands)
    # Where each command still to run goes: (node, sent after ASKING).
    todo: dict[int, tuple[Any, bool]] = {
        i: (client.get_node_from_key(command[1]), False) for i, command in enumerate(commands)
    }
    for attempt in range(ATTEMPTS):
        groups: dict[tuple[str, bool], list[int]] = {}
        for i, (node, asking) in todo.items():
            groups.setdefault((node.name, asking), []).append(i)
        again: dict[int, tuple[Any, bool]] = {}
        refresh = pause = False
        for (_name, asking), indexes in groups.items():
            node = todo[indexes[0]][0]
            sent = [commands[i] for i in indexes]
            if asking:
                sent = [c for command in sent for c in (("ASKING",), command)]
            try:
                answers = _packed(client.get_redis_connection(node), sent)
            except BROKEN:
                if attempt == ATTEMPTS - 1:
                    raise
                refresh = True  # the node may have failed over
                again.update((i, (node, False)) for i in indexes)
                continue
            for i, answer in zip(indexes, answers[1::2] if asking else answers, strict=True):
                if isinstance(answer, SLOT_MOVED):
                    refresh = True
                    again[i] = (node, False)
                elif isinstance(answer, redis.exceptions.AskError):
                    target = client.get_node(host=answer.host, port=answer.port)
                    if target is None:
                        refresh = True
                        again[i] = (node, False)
                    else:
                        again[i] = (target, True)
                elif isinstance(answer, SLOT_BUSY):
                    pause = True
                    refresh = refresh or isinstance(answer, ClusterDownError)
                    again[i] = (node, False)
                else:
                    replies[i] = answer
        if not again:
            return _raised(replies)
        if attempt == ATTEMPTS - 1:
            break
        if pause:
            time.sleep(BUSY_PAUSE)
        if refresh:
            client.nodes_manager.initialize()
        todo = {
            i: (target, True) if asking else (client.get_node_from_key(commands[i][1]), False)
            for i, (target, asking) in again.items()
        }
    raise redis.exceptions.ClusterError(
        f"{len(again)} commands were refused {ATTEMPTS} times: their slots kept moving"
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
        # Packed into a few large writes, not one per command.
        connection.send_packed_command(connection.pack_commands(commands))
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
