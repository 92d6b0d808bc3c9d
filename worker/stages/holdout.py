"""Holdout: users of the global control group get no marketing (`holdout`), charged nothing;
the users of its excluded segments and sends carrying one of its excluded tags pass
(limits/policy/holdout.py). After the snapshot check: a user's segment decides whether they may be
held out.

Each refusal says what the send would have got (the ledger keeps it, for the control group's
report): the rules stage asks for them as a dry run (`Batch.dry`), in its own round trip, so a
decision of `holdout` with no rule would have been sent, and one naming a rule would have been
refused by it; nothing is charged."""

import numpy as np

from limits.reasons import Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    group = batch.table.holdout
    if group is None or not batch.pending:
        return
    held = group.held(
        [batch.requests[i][0] for i in batch.pending],
        # Read only when some segment is excluded.
        [batch.segment(i) for i in batch.pending] if group.exclude_segments else [],
        batch.tags,
    )
    if held is None:
        return  # nobody here is held out
    positions = np.asarray(batch.pending)
    # Refused by the rules stage, with what it would have got from them (a dry run).
    batch.dry.update(dict.fromkeys(positions[held].tolist(), Reason.HOLDOUT))
    batch.pending = positions[~held].tolist()


STAGE = Stage("holdout", (Reason.HOLDOUT, Reason.UNAVAILABLE), run)
