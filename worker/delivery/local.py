"""Dispatchers that deliver nothing outside this process, for any channel: the console
(development: `make run`), a list in memory (tests) and nothing at all (benchmarks)."""

from collections.abc import Sequence
from typing import ClassVar

from worker.delivery.base import DispatchError, Message, OneAtATime, SendsInBatches


class ConsoleDispatcher(OneAtATime):
    """Prints each send (development)."""

    provider: ClassVar[str] = "console"

    def send(self, message: Message) -> None:
        title = f"{message.subject} | " if message.subject else ""
        print(f"send to {message.address} (user {message.user_id}): {title}{message.body.strip()}")


class MemoryDispatcher(OneAtATime):
    """Keeps the sends in a list shared by every instance (tests)."""

    outbox: ClassVar[list[Message]] = []
    batch_size: ClassVar[int] = 1000
    provider: ClassVar[str] = "memory"

    def send(self, message: Message) -> None:
        self.outbox.append(message)


class NullDispatcher(SendsInBatches):
    """Drops every send (benchmarks)."""

    batch_size: ClassVar[int] = 1000
    provider: ClassVar[str] = "null"

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        return [None] * len(messages)
