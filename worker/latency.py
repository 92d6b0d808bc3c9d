"""How long the gate takes: a histogram of its calls' seconds, by channel and batch size, summed
over every process (`<prefix>gate:seconds`; gatekeeper/lib/counters.py), for /metrics
(`gatekeeper_gate_seconds`).

A call is timed from the gate's start to its end, the ledger's append included: what a caller
of /api/v1/gate/check/ waits for less the HTTP around it, or a send job's chunk's `gate` step.
Dry runs (the what-if, the plan) are not timed. Recording a call costs a bisect and two
counters added under a lock, about 5 us on a 2-core test machine where a one-request gate call
takes 1.3 ms (10 alternated runs of 1,000 calls each way: medians 1,287 us timed and 1,297 us
not, runs from 877 to 1,972 us: nothing measurable), and one HINCRBYFLOAT per field a second.

Calls are told apart by batch size, since one request and a chunk of 5,000 take a hundred times
apart and a percentile over both would describe neither.
"""

from bisect import bisect_left

from gatekeeper.lib.counters import RedisCounters

# Upper bounds of the buckets, in seconds (Prometheus's `le`); one more bucket holds the rest.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Batch sizes: the largest of each class, and its label.
BATCHES = ((1, "1"), (100, "2-100"), (1000, "101-1000"))
LARGEST = "1001+"

_counters = RedisCounters("gate:seconds")


def batch_label(size: int) -> str:
    for largest, label in BATCHES:
        if size <= largest:
            return label
    return LARGEST


# (channel, batch label) -> its fields: one per bucket, then the sum's (made once each).
_fields: dict[tuple[str, str], tuple[list[str], str]] = {}


def observe(channel: str, size: int, seconds: float) -> None:
    """Count one gate call of `size` requests on `channel` that took `seconds`."""
    label = batch_label(size)
    fields = _fields.get((channel, label))
    if fields is None:
        where = f"{channel}|{label}"
        fields = ([f"{where}|{b}" for b in range(len(BUCKETS) + 1)], f"{where}|sum")
        _fields[(channel, label)] = fields
    _counters.add({fields[0][bisect_left(BUCKETS, seconds)]: 1, fields[1]: seconds})


def histograms() -> dict[tuple[str, str], tuple[list[tuple[str, float]], float]]:
    """Every process's calls: (channel, batch) -> (cumulative buckets as Prometheus writes them,
    `le` to calls at or under it, +Inf last; the seconds summed)."""
    counts: dict[tuple[str, str], list[float]] = {}
    sums: dict[tuple[str, str], float] = {}
    for field, value in _counters.read().items():
        channel, batch, slot = field.split("|")
        if slot == "sum":
            sums[(channel, batch)] = value
        else:
            counts.setdefault((channel, batch), [0.0] * (len(BUCKETS) + 1))[int(slot)] = value
    found = {}
    for where, per_bucket in counts.items():
        cumulative, total = [], 0.0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), per_bucket, strict=True):
            total += count
            cumulative.append((bound, total))
        found[where] = (cumulative, sums.get(where, 0.0))
    return found


def flush() -> None:
    _counters.flush()


def discard_pending() -> None:
    _counters.discard_pending()
