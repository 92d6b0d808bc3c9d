"""The limiter's Redis server as the send logs need it, checked by `manage.py check --deploy`
(docs/deploy.md, "Redis")."""

from typing import Any

from django.core.checks import CheckMessage, Warning, register
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from gatekeeper.lib.redis_client import get_redis
from limits.engine.log import GROUP_LISTPACK_VALUE


@register(deploy=True)
def limiter_redis_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The limiter's Redis server keeps a group of 16 users' logs as a listpack while each log
    fits its hash-max-listpack-value (docs/deploy.md, "Redis"); at the default, a group whose
    user got a few sends becomes a hash table, about 1.5 times the memory."""
    hint = (
        f"Set hash-max-listpack-value {GROUP_LISTPACK_VALUE} in redis.conf (or CONFIG SET it) "
        "on every node of the limiter's Redis (REDIS_URL)."
    )
    client = get_redis()
    nodes = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(client, RedisCluster) else {}
    try:
        reply = client.config_get("hash-max-listpack-value", **nodes)
    except RedisError as exc:
        return [
            Warning(
                f"The limiter's Redis could not be asked for hash-max-listpack-value: {exc}",
                hint=hint + " A managed Redis may refuse CONFIG: set it in its parameters.",
                id="limits.W002",
            )
        ]
    # One node's answer, or a cluster's: {node: answer}.
    answers: list[Any] = list(reply.values()) if isinstance(client, RedisCluster) else [reply]
    values = [int(a.get("hash-max-listpack-value") or 0) for a in answers if a]
    if not values or min(values) < GROUP_LISTPACK_VALUE:
        return [
            Warning(
                f"The limiter's Redis has hash-max-listpack-value {min(values, default=0)}: "
                f"the send logs take less memory at {GROUP_LISTPACK_VALUE}.",
                hint=hint,
                id="limits.W003",
            )
        ]
    return []
