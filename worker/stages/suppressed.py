"""Suppressed: a user on the channel's suppression list (or on `all`'s) is refused, in memory,
before anything else is asked; charged nothing."""

from limits.reasons import Reason
from limits.suppression import SuppressionUnavailable
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    try:
        suppressed = parts.suppressions.suppressed(
            batch.channel, [batch.requests[i][0] for i in batch.pending]
        )
    except SuppressionUnavailable:
        # Never read in this process: a send to someone who opted out is worse than a send
        # refused for now (the worker tries `unavailable` sends again).
        batch.refuse_pending(Reason.UNAVAILABLE)
        return
    if suppressed is None:
        return  # nobody on the list
    keep = []
    for i, out in zip(batch.pending, suppressed, strict=True):
        if out:
            batch.refuse(i, Reason.SUPPRESSED)
        else:
            keep.append(i)
    batch.pending = keep


STAGE = Stage("suppressed", (Reason.SUPPRESSED, Reason.UNAVAILABLE), run)
