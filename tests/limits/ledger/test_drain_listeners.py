"""What the drain feeds besides the ledger's table comes to it as listeners
(limits/ledger/listeners.py), registered in the app's `ready()`: the event stream's and the
studies' by default; a listener's own stream entries reach it in the stream's order among the
decisions, in the drain's transaction, with the round's rows; a listener that fails rolls the
whole round back, its entries kept."""

from collections.abc import Iterator
from typing import Any

import pytest

from limits.ledger import listeners
from limits.ledger.drain import FAILED, GROUP, ledger_drain
from limits.ledger.listeners import Drained, DrainListener, Round, drain_listen, drain_listeners
from limits.ledger.stream import Decided, stream_key
from limits.models.ledger import LedgerEntry
from limits.stream.events import StreamListener
from limits.studies.drain import StudiesListener
from tests.support.clocks import instant
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_764_577_600.0  # 2025-12-01 08:26:40 UTC


class Noting(DrainListener):
    """Notes what it is fed; fails its round when told to."""

    field = "t"

    def __init__(self) -> None:
        self.rounds: list[Round] = []
        self.begun_at: list[int] = []
        self.fail = False

    def begun(self) -> None:
        self.begun_at.append(LedgerEntry.objects.count())

    def entry(self, packed: bytes) -> Any:
        if packed == b"bad":
            raise ValueError("not an entry of this listener's")
        return packed.decode()

    def written(self, done: Round, report: Drained) -> None:
        if self.fail:
            raise RuntimeError("this listener failed")
        self.rounds.append(done)


@pytest.fixture
def noting() -> Iterator[Noting]:
    listener = Noting()
    kept = list(listeners._LISTENERS)
    drain_listen(listener)
    yield listener
    listeners._LISTENERS[:] = kept


def test_the_app_registers_the_stream_and_the_studies_in_that_order() -> None:
    assert [type(listener) for listener in drain_listeners()] == [StreamListener, StudiesListener]
    drain_listen(StreamListener())  # a second ready() registers nothing twice
    assert len(drain_listeners()) == 2


def test_own_entries_come_in_the_streams_order_among_the_decisions(
    noting: Noting, published: Any, redis_client: Any
) -> None:
    published(vip=(10, [1, 2, 3], {"email": (5, None)}))
    gate_check(channel="email", requests=[(1, "a1"), (2, "a2")], campaign="c", now=instant(NOW))
    redis_client.xadd(stream_key(), {"t": b"first"})
    gate_check(channel="email", requests=[(3, "b3")], campaign="c", now=instant(NOW + 1))
    redis_client.xadd(stream_key(), {"t": b"second"})
    redis_client.xadd(stream_key(), {"t": b"bad"})

    report = ledger_drain()

    assert report.entries == 5 and report.rows == 3 and report.unreadable == 1
    assert noting.begun_at == [0]  # before anything was written
    (done,) = noting.rounds
    kinds = [step if isinstance(step, str) else len(step.users) for step in done.steps_of(noting)]
    assert kinds == [2, "first", 1, "second"]
    assert [len(call.users) for call in done.calls] == [2, 1]
    assert all(isinstance(call, Decided) for call in done.calls)
    assert done.rows == 3
    rows = sorted(LedgerEntry.objects.values_list("id", flat=True))
    assert rows[0] == done.first and rows[-1] == done.first + done.rows - 1


def test_a_listener_that_fails_rolls_the_round_back(
    noting: Noting, published: Any, redis_client: Any
) -> None:
    published(vip=(10, [1, 2], {"email": (5, None)}))
    gate_check(channel="email", requests=[(1, "a1"), (2, "a2")], campaign="c", now=instant(NOW))
    noting.fail = True
    with pytest.raises(RuntimeError, match="this listener failed"):
        ledger_drain()
    assert LedgerEntry.objects.count() == 0  # nothing of the round stays
    # Its entry is kept (a failure that may come of the entries: left to CLAIM_IDLE_MS).
    pending = redis_client.xpending(stream_key(), GROUP)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == FAILED.encode()
