"""A dispatcher for end-to-end tests with real worker processes: it delivers nothing and writes
every send it is handed to a file the test reads afterwards, one line a send (`<user id>
<message id>`), appended a batch at a time. The file is named by the environment variable
DISPATCH_LOG in the worker's environment; name the class in GATEKEEPER_DISPATCHERS
(`{"push": "tests.support.dispatch_log.FileDispatcher"}`)."""

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from worker.delivery.base import DispatchError, Message, SendsInBatches

DISPATCH_LOG = "DISPATCH_LOG"
FILE_DISPATCHER = f"{__name__}.FileDispatcher"


class FileDispatcher(SendsInBatches):
    """Takes up to 1,000 sends a call, as the null and memory dispatchers do (nothing goes
    outside the machine), and writes them down."""

    batch_size: ClassVar[int] = 1000
    provider: ClassVar[str] = "file"

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        lines = "".join(f"{m.user_id} {m.message_id}\n" for m in messages)
        with open(os.environ[DISPATCH_LOG], "a", encoding="utf-8") as log:
            log.write(lines)
        return [None] * len(messages)


def file_dispatch_env(log: Path, rate: float | None = None) -> dict[str, str]:
    """A worker's environment for pushes handed to FileDispatcher, written to `log`, at most
    `rate` a second for every worker together (none: as fast as they go)."""
    env = {"GATEKEEPER_DISPATCHERS": json.dumps({"push": FILE_DISPATCHER}), DISPATCH_LOG: str(log)}
    if rate is not None:
        env["GATEKEEPER_PROVIDER_RATES"] = f"{FileDispatcher.provider}={rate}"
    return env


def dispatched(path: Path) -> Counter[tuple[int, str]]:
    """What the worker handed to FileDispatcher: how often each (user id, message id)."""
    if not path.exists():
        return Counter()
    with open(path, encoding="utf-8") as log:
        return Counter((int(user), message) for user, message in map(str.split, log))
