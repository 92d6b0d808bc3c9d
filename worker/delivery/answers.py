"""What the providers answered: every send handed to a provider, by provider and answer, summed
over every worker process (`<prefix>worker:answers`; gatekeeper/lib/counters.py), for /metrics
(`gatekeeper_provider_answers_total`) and the alerts on a provider that fails or refuses.

The answers are the delivery contract's (worker/delivery/base.py): `sent`, or the kind of the
DispatchError: `transient`, `permanent`, `ambiguous`, `throttled`. Every call to a provider is
counted, so a send refused for the provider's rate and taken when sent again counts once
`throttled` and once `sent`. Counting costs the worker a Counter per provider call and one
HINCRBYFLOAT per provider and answer a second.
"""

from collections import Counter
from collections.abc import Sequence

from gatekeeper.lib.counters import RedisCounters
from worker.delivery.base import AMBIGUOUS, PERMANENT, THROTTLED, TRANSIENT, DispatchError

SENT = "sent"
ANSWERS = (SENT, TRANSIENT, PERMANENT, AMBIGUOUS, THROTTLED)

_counters = RedisCounters("worker:answers")


def answers_add(provider: str, answers: Sequence[DispatchError | None]) -> None:
    """Count one provider call's answers (None: sent), in the order the dispatcher gave them."""
    counted = Counter(SENT if answer is None else answer.kind for answer in answers)
    _counters.add({f"{provider or 'unnamed'}|{answer}": n for answer, n in counted.items()})


def answers_read() -> dict[tuple[str, str], int]:
    """Every process's counts: (provider, answer) -> sends."""
    found: dict[tuple[str, str], int] = {}
    for field, value in _counters.read().items():
        provider, _, answer = field.rpartition("|")
        found[(provider, answer)] = int(value)
    return found


def flush() -> None:
    _counters.flush()


def discard_pending() -> None:
    _counters.discard_pending()
