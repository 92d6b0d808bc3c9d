"""A chunk sent through a provider with a rate: at that rate, and a provider's "too many"
pauses every worker and the refused sends go again, each once. The clock is passed in."""

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from tests.support.clocks import Clock, throttles_on
from worker.chunks import send_chunk_run
from worker.delivery.base import THROTTLED, DispatchError, Message, retry_after_seconds
from worker.delivery.local import MemoryDispatcher
from worker.delivery.webhook import WebhookDispatcher
from worker.models import SendChunk
from worker.services import send_job_create

pytestmark = pytest.mark.django_db


class RefusingOncePushBackend(MemoryDispatcher):
    """A provider that answers its first batch "too many, come back in 3 s" (HTTP 429)."""

    batch_size: ClassVar[int] = 10
    calls: ClassVar[list[tuple[int, list[str]]]] = []  # (ms, message ids) per call
    clock: ClassVar[Clock]

    def send_many(self, messages: Sequence[Message]) -> list[DispatchError | None]:
        self.calls.append((self.clock.ms, [m.message_id for m in messages]))
        if len(self.calls) == 1:
            return [DispatchError("429", kind=THROTTLED, retry_after=3.0)] * len(messages)
        self.outbox.extend(messages)
        return [None] * len(messages)


@pytest.fixture
def provider(published, settings, monkeypatch) -> Clock:
    published(vip=(10, list(range(1, 100)), {"push": (None, None)}))
    clock = Clock()
    RefusingOncePushBackend.calls, RefusingOncePushBackend.clock = [], clock
    MemoryDispatcher.outbox.clear()
    settings.GATEKEEPER_PUSH_BACKEND = f"{__name__}.RefusingOncePushBackend"
    settings.GATEKEEPER_PROVIDER_RATES = "memory=250"  # a burst of 10
    throttles_on(clock, settings, monkeypatch)
    return clock


def test_a_chunk_goes_at_its_provider_rate_and_a_refusal_pauses_it(provider: Clock) -> None:
    job = send_job_create(
        channel="push",
        campaign="rated",
        template="welcome",
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in range(1, 41)],
        queue=False,
    )
    (chunk,) = SendChunk.objects.filter(job=job)
    started = provider.ms
    assert send_chunk_run(chunk_id=chunk.pk) == {"sent": 40}
    calls = RefusingOncePushBackend.calls
    # The first batch of 10 was refused, paused 3 s (the bucket held for every worker), and
    # sent again; then at 250 a second.
    assert calls[0][1] == calls[1][1] and calls[1][0] - calls[0][0] == 3000
    # Batches stay batches: half a burst's tokens (5) at a time at least, not one by one.
    assert [len(ids) for _, ids in calls] == [10, 10] + [5] * 6
    assert [ms - calls[1][0] for ms, _ in calls[1:]] == [0, 20, 40, 60, 80, 100, 120]
    sent = [message_id for _, ids in calls[1:] for message_id in ids]
    assert sorted(sent) == sorted(f"rated:{u}" for u in range(1, 41))  # each once
    assert len(MemoryDispatcher.outbox) == 40
    assert provider.ms - started == 3000 + 120  # the pause, then 30 sends at 250 a second


def test_a_push_relay_that_answers_429_throttles_with_its_retry_after() -> None:
    import http.server
    import threading

    class TooMany(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(429)
            self.send_header("Retry-After", "7")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), TooMany)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = WebhookDispatcher(url=f"http://127.0.0.1:{server.server_port}/push")
        with pytest.raises(DispatchError) as refused:
            backend.send(Message(message_id="m:1", user_id=1, address="t", subject="s", body="b"))
        assert (refused.value.kind, refused.value.retry_after) == (THROTTLED, 7.0)
    finally:
        server.shutdown()
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds("999999") == 3600.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None
