"""Holdout: users of the global control group get no marketing (`holdout`), charged nothing;
the users of its excluded segments and sends carrying one of its excluded tags pass
(limits/holdout.py). After the snapshot check: a user's segment decides whether they may be
held out.

Each refusal says what the send would have got (the ledger keeps it, for the control group's
report): the rules are asked as a dry run, so a decision of `holdout` with no rule would have
been sent, and one naming a rule would have been refused by it; nothing is charged."""

from limits.reasons import Reason
from worker.stages import rules
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    group = batch.table.holdout
    if group is None or not batch.pending:
        return
    held = group.held(
        [batch.requests[i][0] for i in batch.pending],
        [batch.segment(i) for i in batch.pending],
        batch.tags,
    )
    if held is None:
        return  # nobody here is held out
    out = [i for i, h in zip(batch.pending, held, strict=True) if h]
    for i, would in zip(out, rules.asked(batch, parts, out, dry_run=True), strict=True):
        if would.reason == Reason.UNAVAILABLE:
            batch.decisions[i] = would  # the limiter away: as any other send (tried again)
            continue
        batch.refuse(i, Reason.HOLDOUT, would=would)
    batch.pending = [i for i, h in zip(batch.pending, held, strict=True) if not h]


STAGE = Stage("holdout", (Reason.HOLDOUT, Reason.UNAVAILABLE), run)
