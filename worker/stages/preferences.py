"""Preferences: what the person said, in memory, after the suppression list: a topic or a
channel they switched off (`preference`, naming what), a topic they must ask for and did not,
and a pause of their marketing or of this channel (`paused`, with the seconds until it ends).
Charged nothing; a required topic's sends pass (limits/people/preferences.py)."""

from limits.people.preferences import PreferencesUnavailable
from limits.reasons import Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    try:
        refusals = parts.preferences.refusals(
            batch.channel,
            batch.topic,
            [batch.requests[i][0] for i in batch.pending],
            batch.clock_ms,
        )
    except PreferencesUnavailable:
        # Never read in this process: a send to someone who said no is worse than a send
        # refused for now (the worker tries `unavailable` sends again).
        batch.refuse_pending(Reason.UNAVAILABLE)
        return
    if refusals is None:
        return  # nobody said anything that applies
    keep = []
    for i, refusal in zip(batch.pending, refusals, strict=True):
        if refusal is None:
            keep.append(i)
            continue
        reason, what, retry_after = refusal
        batch.refuse(i, reason, retry_after=retry_after, preference=what)
    batch.pending = keep


STAGE = Stage("preferences", (Reason.PREFERENCE, Reason.PAUSED, Reason.UNAVAILABLE), run)
