"""Quiet hours: a send that falls in the user's quiet hours (their segment's and every segment's,
on the channel and `all`, on the user's own clock) is held, not recorded, with `retry_after` the
end of the quiet window plus the user's own place in its spread. Decided in Python: it costs
Redis nothing."""

from limits.engine.quiet import QuietView, release_at
from limits.reasons import Reason
from worker.stages.base import Batch, Parts, Stage


def run(batch: Batch, parts: Parts) -> None:
    table = batch.table
    if not table.has_quiet(channel=batch.channel):
        return
    quiet: dict[str | None, tuple[QuietView, ...]] = {}
    # Per (segment, zone): when its quiet hours let go (None: they hold nobody now).
    held: dict[tuple[str | None, str], tuple[int, int] | None] = {}
    keep = []
    for i in batch.pending:
        segment = batch.segment(i)
        entries = quiet.get(segment)
        if entries is None:
            entries = quiet[segment] = table.quiet_for(segment=segment, channel=batch.channel)
        if not entries:
            keep.append(i)
            continue
        zone = batch.zone(i)
        key = (segment, zone)
        if key in held:
            until = held[key]
        else:
            until = held[key] = table.quiet_release(
                segment=segment, channel=batch.channel, zone=zone, now_ms=batch.clock_ms
            )
        if until is None:
            keep.append(i)
            continue
        end, spread = until
        # Both in whole milliseconds: a send retried after `retry_after` is never early.
        release_ms = release_at(end, spread, batch.requests[i][0])
        batch.refuse(i, Reason.QUIET_HOURS, retry_after=(release_ms - batch.clock_ms) / 1000)
    batch.pending = keep


STAGE = Stage("quiet_hours", (Reason.QUIET_HOURS,), run)
