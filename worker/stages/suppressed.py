"""Suppressed: a user on the channel's suppression list (or on `all`'s), or an erased person
(kept as a keyed hash: refused on every channel), is refused, in memory, before anything else
is asked; charged nothing. An erased person's refusal is not kept in the ledger (it would name
them again)."""

from limits.people.suppression import SuppressionUnavailable
from limits.reasons import Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    try:
        users = [batch.requests[i][0] for i in batch.pending]
        suppressed = parts.suppressions.suppressed(batch.channel, users)
        erased = parts.suppressions.erased(users)
    except SuppressionUnavailable:
        # Never read in this process: a send to someone who opted out is worse than a send
        # refused for now (the worker tries `unavailable` sends again).
        batch.refuse_pending(Reason.UNAVAILABLE)
        return
    if suppressed is None and erased is None:
        return  # nobody on the list
    keep = []
    for k, i in enumerate(batch.pending):
        if erased is not None and erased[k]:
            batch.refuse(i, Reason.SUPPRESSED)
            batch.decisions[i].erased = True  # type: ignore[union-attr]
        elif suppressed is not None and suppressed[k]:
            batch.refuse(i, Reason.SUPPRESSED)
        else:
            keep.append(i)
    batch.pending = keep


STAGE = Stage("suppressed", (Reason.SUPPRESSED, Reason.UNAVAILABLE), run)
