"""The studies as the drain feeds them (a listener of limits/ledger/listeners.py, registered in
the app's `ready()`): in the drain's transaction, the members a round's decisions bring into
studies with their sends per day, and the outcome events the company posted (the ledger's
stream carries them as entries of their own, EVENTS_FIELD), each counted against the members
written before it in the stream's order."""

from datetime import datetime
from itertools import groupby
from typing import Any

from limits.ledger.listeners import Drained, DrainListener, Round
from limits.policy.selectors import holdout_view
from limits.studies.measures import (
    EVENTS_FIELD,
    PostedEvents,
    decisions_noted,
    events_counted,
    events_entry,
    events_prune,
)


class StudiesListener(DrainListener):
    field = EVENTS_FIELD

    def entry(self, packed: bytes) -> Any:
        return events_entry(packed)

    def written(self, done: Round, report: Drained) -> None:
        steps = done.steps_of(self)
        if not steps:
            return  # a drain that found nothing (every 2 s when idle) reads no control group
        group = holdout_view()
        for are_events, run in groupby(steps, key=lambda s: isinstance(s, PostedEvents)):
            if are_events:
                counted = events_counted([step for step in run if isinstance(step, PostedEvents)])
                report.events += counted.new
                report.events_repeated += counted.repeated
            else:
                decisions_noted(run, group)

    def upkeep(self, now: datetime, cutoff: datetime) -> None:
        # The outcome events' ids past the time a repeat must count once. (The studies' days
        # stay: a member's day of entry is what the report counts them by, and they are few.)
        events_prune(now=now)
