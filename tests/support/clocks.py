"""A clock in milliseconds that moves only when the code under test waits (worker/throttle.py's
`clock` and `sleep`), so rate tests pass time in instead of sleeping through it; the
workers' provider throttles put on it; and a test's instant written in epoch seconds as the
services take it."""

from datetime import UTC, datetime
from typing import Any

import pytest

from worker import chunks
from worker.delivery.throttle import Rate, Throttle, group_bucket_key, parse_rates


class Clock:
    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms
        self.waits: list[float] = []  # seconds, as asked

    def __call__(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.ms += round(seconds * 1000)


def throttles_on(clock: Clock, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk runs throttle providers by GATEKEEPER_PROVIDER_RATES (as the test sets it), and
    mailbox providers by their rates, on `clock`: a pause passes on it, not in real time."""

    def throttle_for(provider: Any) -> Throttle | None:
        rates = parse_rates(settings.GATEKEEPER_PROVIDER_RATES)
        if provider not in rates:
            return None
        return Throttle(provider, rates[provider], clock=clock, sleep=clock.sleep)

    def throttle_named(provider: str, group: str, rate: Rate) -> Throttle:
        return Throttle(
            f"{provider}:{group}",
            rate,
            clock=clock,
            sleep=clock.sleep,
            key=group_bucket_key(provider, group),
        )

    monkeypatch.setattr(chunks, "throttle_for", throttle_for)
    monkeypatch.setattr(chunks, "throttle_named", throttle_named)


def instant(seconds: float) -> datetime:
    """A test's instant written in epoch seconds (as the engine's tests write them), as the gate
    and every other service take it: an aware datetime in UTC."""
    return datetime.fromtimestamp(seconds, UTC)
