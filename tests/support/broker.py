"""What the tests' own broker database holds (tests/settings.py points CELERY_BROKER_URL at it):
the tasks a test queued, read back from Redis as a worker would take them."""

import base64
import json
from typing import Any

import redis
from django.conf import settings


def _broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def queued(queue: str) -> list[tuple[str, list[Any]]]:
    """(task name, args) of each task waiting on `queue`, oldest first."""
    tasks = []
    for raw in reversed(_broker().lrange(queue, 0, -1)):  # kombu pushes on the left
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        tasks.append((message["headers"]["task"], args))
    return tasks


def clear(*queues: str) -> None:
    _broker().delete(*queues)
