"""Running a send job's chunks: gate, claim, dispatch, settle; and a job's waiting sends
(deferred by the gate) grouped by release minute, expired, cancelled. The work of
`worker.tasks.send_chunk` and `worker.tasks.send_chunks_due`.

Celery delivers a task at least once (acks_late, so a killed worker's chunk is delivered
again). The message id is the idempotency key that keeps that from becoming a double send: the
gate's call claims each admitted send for the job in its user's log, and the chunk's record
says how far each got (worker/claims.py), so a redelivered chunk knows what a dead run already
sent (counted, not sent again) and what it was sending when it died (ambiguous, or sent again
with the same key where the provider deduplicates). The limiter answers `duplicate`, naming the
job, for a message id it already recorded, so the quota is not charged twice either.
"""

import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from gatekeeper.lib.binding import large_rows_created
from gatekeeper.lib.instants import instant_checked, instant_or_now
from gatekeeper.lib.leases import LeaseLost, RowLease, lease_free
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.channels import SMS
from limits.engine.limiter import Decision
from limits.engine.log import holder_of
from limits.models.people import Suppression
from limits.people.suppression import suppress
from limits.reasons import DEFERRABLE, HELD_BEFORE_GATE, JobOutcome, Outcome, Reason
from worker.claims import (
    NOT_SENT,
    SENDING_STATE,
    SENT_STATE,
    ChunkRecord,
    Left,
    RunLost,
    left_behind,
    record_read,
    state_at,
)
from worker.delivery.answers import answers_add
from worker.delivery.base import (
    AMBIGUOUS,
    PERMANENT,
    POSTPONED,
    THROTTLED,
    Dispatcher,
    DispatchError,
    Message,
    Recipient,
    opted_out_source,
    recipients_typed,
)
from worker.delivery.brakes import SENT, brake_count
from worker.delivery.dead_addresses import dead_addresses_record
from worker.delivery.deliverability import Delivery, delivery_give_back, delivery_read
from worker.delivery.registry import dispatcher_for
from worker.delivery.rendering import Renderer
from worker.delivery.sms_numbers import sms_numbers_record
from worker.delivery.throttle import (
    RETHROTTLED_MAX,
    Rate,
    Throttle,
    paced,
    taken_together,
    throttle_for,
    throttle_named,
)
from worker.gate import (
    gate_decided_before,
    gate_holders,
    gate_outcomes,
    gate_release,
    job_gate_check,
)
from worker.models import CompactJSONDecoder, SendChunk, SendJob
from worker.planned import repacked
from worker.round_entries import round_differences, round_split
from worker.stopping import WorkerStopping, stopping
from worker.timings import timed

logger = logging.getLogger(__name__)
R = TypeVar("R")  # a recipient, whatever its type

# Transient failures and Redis outages: then the recipient fails visibly. With the backoff
# (5 s doubling, RETRY_WAIT_MAX at most) a provider may refuse a send for about 10 minutes.
MAX_ATTEMPTS = 8
RETRY_WAIT_MAX = 600.0  # seconds
# A mailbox provider's rate that has no room for this long: its sends go in a later chunk
# instead of holding the run (and the other groups' sends behind it).
GROUP_WAIT_MAX = 2.0  # seconds
REDIS_DOWN_DELAY = 30  # seconds before a chunk that met an unavailable Redis is tried again
# What a waiting send ends as, when it never went.
EXPIRED, CANCELLED = JobOutcome.EXPIRED, JobOutcome.CANCELLED


class ChunkBusy(Exception):
    """Another delivery of this chunk's task holds its lease: try again after `retry_in` s."""

    def __init__(self, retry_in: float) -> None:
        super().__init__(f"chunk leased by another run for {retry_in:.0f} s more")
        self.retry_in = retry_in


def lease_length() -> timedelta:
    """How long a run's lease lasts (a chunk's, or a job's file being read)."""
    return timedelta(seconds=float(settings.GATEKEEPER_CHUNK_LEASE_SECONDS))


def chunks_free(now: datetime) -> Q:
    """Chunks no live run holds at `now`: never leased, or the lease ran out."""
    return lease_free(now)


def chunks_runnable_at(now: datetime) -> Q:
    """Chunks that may run at `now`: queued, due, not leased by a live run, their job not
    paused."""
    free = chunks_free(now)
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    return free & due & Q(status=SendChunk.Status.QUEUED, job__paused_at__isnull=True)


def _chunk_lease(chunk_id: int) -> RowLease:
    """A run's hold on its chunk. Two deliveries of one task (a broker redelivery, the sweeper)
    never run at once; a run renews only the lease it holds."""
    return RowLease(SendChunk.objects.filter(pk=chunk_id), lease_length())


def _taken_to_run(lease: RowLease, now: datetime) -> bool:
    """For a run, which may gate and send: counted in the chunk's `runs`."""
    return lease.take(now, where=chunks_runnable_at(now), runs=F("runs") + 1)


def _taken_to_close(lease: RowLease, now: datetime) -> bool:
    """For closing a waiting chunk (expired, cancelled) whatever its `not_before`: no run."""
    return lease.take(now, where=Q(status=SendChunk.Status.QUEUED))


def _given_back(lease: RowLease) -> None:
    """So the task's retry can take the chunk at once; nothing if another run holds it."""
    lease.give_back(where=Q(status=SendChunk.Status.QUEUED))


def send_chunk_run(
    *, chunk_id: int, dispatcher: Dispatcher | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Gate one chunk, dispatch the admitted sends, and settle the rest. Returns outcome counts.

    Safe to run again for the same chunk (a redelivered task): a finished chunk does nothing, a
    chunk not due yet does nothing (`send_chunks_due` queues it when it is), one leased by a run
    still alive raises ChunkBusy, and an interrupted one sends only what it had not claimed.
    `now` (tests, replays) is the time the chunk's lease, due date and its job's expiry are
    judged at, and the gate's clock (its windows, calendar days and quiet hours), from which
    deferred sends' releases count; without it the gate reads the clocks of Redis and of this
    process, and releases count from the gate's answer.

    A deferred chunk (waiting sends) whose job expired or whose waiting was cancelled is not
    gated again: its sends are counted as expired or cancelled.
    """
    clock = None if now is None else instant_checked(now)
    now = instant_or_now(clock)
    lease = _chunk_lease(chunk_id)
    with timed("fetch"):
        taken = _taken_to_run(lease, now)
    if not taken:
        chunk = SendChunk.objects.filter(pk=chunk_id).first()
        if chunk is None or chunk.status != SendChunk.Status.QUEUED:
            return {}
        if chunk.not_before is not None and chunk.not_before > now:
            return {}
        if SendJob.objects.filter(pk=chunk.job_id, paused_at__isnull=False).exists():
            return {}  # its job is paused: resuming it hands the chunk out again
        until = chunk.lease_until or now
        raise ChunkBusy(max(1.0, (until - now).total_seconds() + 1))
    try:
        return _run_leased(chunk_id, dispatcher, lease, clock)
    except (LeaseLost, RunLost) as lost:
        # A send outlived the lease (a stalled provider): the run that took over counts it.
        logger.warning("%s; this run stops", lost)
        return {}
    except BaseException:
        _given_back(lease)
        raise


class _Keeper:
    """Keeps a run's lease while it sends and while it waits for its provider's rate."""

    def __init__(self, chunk_id: int, lease: RowLease, throttle: Throttle | None) -> None:
        self.chunk_id, self.lease, self.throttle = chunk_id, lease, throttle
        self.every = lease.length.total_seconds() / 3
        self.renewed = time.monotonic()

    def renew_if_due(self) -> None:
        """Renew the lease once a third of it passed. Raises LeaseLost when it ran out and
        another run took the chunk over."""
        if time.monotonic() - self.renewed > self.every:
            if not self.lease.renew():
                raise LeaseLost(f"chunk {self.chunk_id}: the lease ran out and was taken over")
            self.renewed = time.monotonic()

    def wait(self, seconds: float, throttle: Throttle | None = None) -> None:
        """Wait `seconds` (the throttle's sleep: `throttle`'s, else the provider's), renewing
        the lease as often as due."""
        throttle = throttle or self.throttle
        sleep = throttle.sleep if throttle is not None else time.sleep
        while seconds > 0:
            self.renew_if_due()
            step = min(seconds, self.every)
            sleep(step)
            seconds -= step


class _Run:
    """One run of one chunk: its outcomes so far, and what is left to settle after sending."""

    def __init__(
        self,
        chunk: SendChunk,
        recipients: list[Recipient],
        dispatcher: Dispatcher,
        record: ChunkRecord,
        lease: RowLease,
        delivery: Delivery | None = None,
    ) -> None:
        self.chunk, self.job = chunk, chunk.job
        self.dispatcher = dispatcher
        self.record = record
        # Each recipient's position in the chunk, by message id (unique within a job).
        self.position = {r.message_id: i for i, r in enumerate(recipients)}
        # A provider that deduplicates by message id gets unknown outcomes sent again.
        self.resend_unknown = dispatcher.idempotent
        self.throttle = throttle_for(dispatcher.provider)
        # Keeps the lease while sending and while waiting for the provider's rate.
        self.keeper = _Keeper(chunk.pk, lease, self.throttle)
        self.last_attempt = chunk.attempts + 1 >= MAX_ATTEMPTS
        self.outcomes: Counter[str] = Counter()
        self.released: list[tuple[int, str]] = []  # quota to give back: did not go out
        self.dispatched: list[tuple[int, str, str]] = []  # (user, message, outcome): the ledger's
        self.retry: list[Recipient] = []  # transient failures: a later chunk
        self.dead: list[tuple[int, str, str]] = []  # (user, address, why): the provider's word
        self.opted_out: list[int] = []  # users the provider said opted out of the channel
        self.reached: list[tuple[int, str]] = []  # (user, address): went out, or may have
        # Mailbox providers: each recipient's group (by place), and their throttles.
        self.delivery = delivery
        self.group_throttles: dict[str, Throttle | None] = {}
        self.sent_to: Counter[str] = Counter()  # sends that went out, by group (the brakes')
        self.postponed: list[Recipient] = []  # their group's rate had no room soon
        self.postponed_for = 0.0  # seconds: the longest wait they were told

    def _group_of(self, message_id: str) -> str:
        """The mailbox provider of a send of this chunk (the run has its groups)."""
        assert self.delivery is not None
        return self.delivery.groups[self.position[message_id]]

    def batches(self, sending: list[Recipient], size: int) -> list[list[Recipient]]:
        """Dispatcher batches of `size`, each of one mailbox provider (its own rate), the groups
        taking turns: a group's bucket fills while the others' batches go, and the first group
        is another one chunk by chunk, so that runs side by side wait on different buckets."""
        if self.delivery is None:
            return [sending[i : i + size] for i in range(0, len(sending), size)]
        by_group: dict[str, list[Recipient]] = {}
        for recipient in sending:
            by_group.setdefault(self._group_of(recipient.message_id), []).append(recipient)
        parts = [
            [part[i : i + size] for i in range(0, len(part), size)] for part in by_group.values()
        ]
        if len(parts) > 1:
            first = self.chunk.pk % len(parts)
            parts = parts[first:] + parts[:first]
        return [batch for turn in itertools.zip_longest(*parts) for batch in turn if batch]

    def _group_throttle(self, messages: list[Message]) -> Throttle | None:
        """The throttle of the mailbox provider of a batch's sends (one group a batch)."""
        if self.delivery is None or not messages:
            return None
        return self._throttle_of(self._group_of(messages[0].message_id))

    def _throttle_of(self, group: str) -> Throttle | None:
        if group not in self.group_throttles:
            assert self.delivery is not None
            provider = self.dispatcher.provider
            rate: Rate | None = self.delivery.boxes.rate_for(provider, group)
            self.group_throttles[group] = (
                None if rate is None else throttle_named(provider, group, rate)
            )
        return self.group_throttles[group]

    def take_ahead(self, batches: list[list[Recipient]]) -> None:
        """What each mailbox provider's bucket has now for the run's sends, taken in one call
        before the first batch: a run whose groups have room asks Redis once, not per batch."""
        if self.delivery is None:
            return
        wanted: Counter[str] = Counter()
        for batch in batches:
            if batch:
                wanted[self._group_of(batch[0].message_id)] += len(batch)
        taking = [
            (throttle, n)
            for group, n in wanted.items()
            if (throttle := self._throttle_of(group)) is not None
        ]
        with contextlib.suppress(*REDIS_DOWN):  # each batch asks again (and waits for it)
            taken_together(taking)

    def to_send(self, admitted: list[tuple[Recipient, Decision]], states: bytes) -> list[Recipient]:
        """The admitted recipients to send now; the others are counted by what is known of
        them: the chunk's record (an earlier run's), the holder of a duplicate, and for a holder
        nobody named, the previous version's claim (worker/claims.py)."""
        with timed("claims"):
            found = left_behind(
                self.job.channel,
                self.job.pk,
                [
                    (r.message_id, state_at(states, self.position[r.message_id]), d.holder)
                    for r, d in admitted
                ],
            )
        sending = []
        for (recipient, _decision), left in zip(admitted, found, strict=True):
            if left == Left.SENT:
                self._went_out(recipient)  # an earlier run sent it and died before counting
            elif left == Left.OTHER_JOB:
                # Another job has sent (or is sending) this message id to this user.
                self.outcomes[JobOutcome.DUPLICATE] += 1
            elif left == Left.CUT_OFF and not self.resend_unknown:
                # A run died (or lost its lease) during this very send: it may have gone out.
                # Not sending it again keeps the promise that matters more for marketing.
                logger.warning(
                    "Send %s was cut off by the death of an earlier run; it may have gone out "
                    "and is counted as ambiguous, not sent again",
                    recipient.message_id,
                )
                self._ambiguous(recipient)
            else:
                sending.append(recipient)  # sent again with the same key if it was cut off
        return sending

    def send_all(self, batches: list[list[Recipient]], renderer: Renderer) -> None:
        """Mark, send and settle the dispatcher batches in turn: one call to mark the first
        as sending, then one per batch that settles it and marks the next (the next batch is
        rendered while this one is still unsent, so that its marks go in the same call)."""
        if not batches:
            return
        batch, messages = self._rendered(batches[0], renderer)
        with timed("claims"):
            self.record.mark(self._states(batch, SENDING_STATE))
        for k in range(len(batches)):
            sent, unsent = self._sent(batch, messages)
            # At once, not after the next batch: a worker killed now leaves these sends known.
            marks = self._states(sent, SENT_STATE) + self._states(unsent, NOT_SENT)
            try:
                self.keeper.renew_if_due()
            except LeaseLost:
                with timed("claims"):
                    self.record.mark(marks)  # what went out is known; the next is not marked
                raise
            if k + 1 < len(batches) and stopping():
                # The worker is stopping: what went out is known, the rest is another run's.
                with timed("claims"):
                    self.record.mark(marks)
                raise WorkerStopping(f"chunk {self.chunk.pk} handed back: the worker stops")
            if k + 1 < len(batches):
                batch, messages = self._rendered(batches[k + 1], renderer)
                marks += self._states(batch, SENDING_STATE)
            with timed("claims"):
                self.record.mark(marks)

    def _states(self, recipients: list[Recipient], state: int) -> list[tuple[int, int]]:
        return [(self.position[r.message_id], state) for r in recipients]

    def _rendered(
        self, recipients: list[Recipient], renderer: Renderer
    ) -> tuple[list[Recipient], list[Message]]:
        """The recipients whose message renders, and their messages; the others failed.
        Rendered before marking: a message that cannot be rendered never went out."""
        batch, messages = [], []
        with timed("rendering"):
            for recipient in recipients:
                try:
                    messages.append(renderer(recipient))
                    batch.append(recipient)
                except Exception as exc:
                    logger.warning("Send %s cannot be rendered: %s", recipient.message_id, exc)
                    self._fail(recipient)
        return batch, messages

    def _sent(
        self, to_send: list[Recipient], messages: list[Message]
    ) -> tuple[list[Recipient], list[Recipient]]:
        """Dispatch and count: (recipients sent, recipients not sent, marked so again)."""
        sent, unsent = [], []
        with timed("dispatch"):
            errors = self._dispatch(messages)
        for recipient, error in zip(to_send, errors, strict=True):
            message_id = recipient.message_id
            if error is None:
                sent.append(recipient)
                self._went_out(recipient)
            elif error.kind == POSTPONED:
                unsent.append(recipient)
                self.postponed.append(recipient)
                self.postponed_for = max(self.postponed_for, error.retry_after or 1.0)
            elif error.kind == AMBIGUOUS and (not self.resend_unknown or self.last_attempt):
                logger.warning("Send %s may or may not have gone out: %s", message_id, error)
                self._ambiguous(recipient)  # marked sending: never sent again
            else:
                unsent.append(recipient)
                if error.kind == PERMANENT and error.invalid:
                    self.dead.append((recipient.user_id, recipient.address, str(error)))
                if error.kind == PERMANENT and error.opted_out:
                    self.opted_out.append(recipient.user_id)
                if error.kind == PERMANENT or self.last_attempt:
                    self._fail(recipient)
                else:
                    self.retry.append(recipient)
        if sent and self.delivery is not None:  # a batch is of one group
            self.sent_to[self._group_of(sent[0].message_id)] += len(sent)
        return sent, unsent

    def _dispatch(self, messages: list[Message]) -> list[DispatchError | None]:
        """Send at the provider's rate; sends it refused for its rate are sent again after
        the pause it asked for (every worker pauses), RETHROTTLED_MAX times at most."""

        def send(part: Sequence[Message]) -> list[DispatchError | None]:
            answers = self.dispatcher.send_many(part)
            answers_add(self.dispatcher.provider, answers)  # for the operator (/metrics)
            return answers

        def provider_paced(part: Sequence[Message]) -> list[DispatchError | None]:
            return paced(self.throttle, part, send, waiting=self.keeper.wait)

        def postponed(left: Sequence[Message], wait: float) -> list[DispatchError | None]:
            why = f"its mailbox provider's rate has room in {wait:.1f} s"
            return [DispatchError(why, kind=POSTPONED, retry_after=wait) for _ in left]

        group_throttle = self._group_throttle(messages)
        errors = paced(
            group_throttle,
            messages,
            provider_paced,
            waiting=lambda seconds: self.keeper.wait(seconds, group_throttle),
            later=postponed,
            waits_max=GROUP_WAIT_MAX,
        )
        for _round in range(RETHROTTLED_MAX):
            refused = [i for i, e in enumerate(errors) if e is not None and e.kind == THROTTLED]
            if not refused:
                break
            pause = max(errors[i].retry_after or 1.0 for i in refused)  # type: ignore[union-attr]
            logger.info(
                "Provider %s refused %d sends for its rate; all workers pause %.1f s",
                self.dispatcher.provider,
                len(refused),
                pause,
            )
            if self.throttle is not None:
                self.throttle.hold(pause)  # the next tokens come after it, for every worker
            else:
                self.keeper.wait(pause)
            again = paced(
                self.throttle, [messages[i] for i in refused], send, waiting=self.keeper.wait
            )
            for i, error in zip(refused, again, strict=True):
                errors[i] = error
        return errors

    def _went_out(self, recipient: Recipient) -> None:
        self.outcomes[JobOutcome.SENT] += 1
        self.dispatched.append((recipient.user_id, recipient.message_id, Outcome.SENT))
        self.reached.append((recipient.user_id, recipient.address))

    def _fail(self, recipient: Recipient) -> None:
        self.released.append((recipient.user_id, recipient.message_id))
        self.outcomes[JobOutcome.FAILED] += 1
        self.dispatched.append((recipient.user_id, recipient.message_id, Outcome.FAILED))

    def _ambiguous(self, recipient: Recipient) -> None:
        self.outcomes[JobOutcome.AMBIGUOUS] += 1
        self.dispatched.append((recipient.user_id, recipient.message_id, Outcome.AMBIGUOUS))
        self.reached.append((recipient.user_id, recipient.address))


def _run_leased(
    chunk_id: int, dispatcher: Dispatcher | None, lease: RowLease, clock: datetime | None
) -> dict[str, int]:
    with timed("fetch"):
        # The recipients as the database's text, decoded straight into Recipients (through
        # dicts they took twice as long); `chunk.recipients` is loaded only if asked for.
        chunk = (
            SendChunk.objects.select_related("job")
            .defer("recipients")
            .annotate(stored=Cast("recipients", output_field=TextField()))
            .get(pk=chunk_id)
        )
    job = chunk.job
    if job.status == SendJob.Status.QUEUED:
        SendJob.objects.filter(pk=job.pk, status=SendJob.Status.QUEUED).update(
            status=SendJob.Status.RUNNING
        )
    ended = _chunk_end(job, chunk.kind, clock or timezone.now())
    if ended is not None:
        # Its job was cancelled, or (a waiting chunk) expired or had its waiting sends
        # cancelled: it is not gated again. An earlier run may have sent part of it (it died or
        # raised).
        outcomes = _closing_outcomes(chunk, ended, earlier_runs=chunk.runs > 1)
        _close(chunk, ended, outcomes)
        return dict(outcomes)
    # Before gating: a missing template or a dispatcher that cannot start fails the chunk
    # without charging anybody's quota.
    renderer = Renderer(
        channel=job.channel, template=job.template, campaign=job.campaign, category=job.category
    )
    with timed("fetch"):
        recipients = _recipients_decoded(chunk.stored)
    if dispatcher is not None:
        return _run_gated(chunk, recipients, dispatcher, renderer, lease, clock)
    own = dispatcher_for(job.channel)  # built for this run: closed once its sends are done
    try:
        return _run_gated(chunk, recipients, own, renderer, lease, clock)
    finally:
        _closed(own)


def _closed(dispatcher: Dispatcher) -> None:
    """Let a dispatcher go (its connections, a provider client's app); a failure to close
    loses no send."""
    try:
        dispatcher.close()
    except Exception:
        logger.warning("Closing the %s dispatcher failed", type(dispatcher).__name__, exc_info=True)


_RECIPIENTS = msgspec.json.Decoder(list[Recipient])


def _recipients_decoded(stored: str) -> list[Recipient]:
    """A chunk's recipients from their stored JSON text."""
    try:
        return _RECIPIENTS.decode(stored)
    except msgspec.DecodeError:
        return recipients_typed(CompactJSONDecoder().decode(stored))  # NaN, from older rows


def _run_gated(
    chunk: SendChunk,
    recipients: list[Recipient],
    dispatcher: Dispatcher,
    renderer: Renderer,
    lease: RowLease,
    clock: datetime | None,
) -> dict[str, int]:
    job = chunk.job
    # No later than the decision that admitted each send, for the ledger, which finds an outcome
    # on the send's decision at or after it: this run's gate call, or an earlier run's (one that
    # died or failed, or the chunk this retry chunk came from), whose sends this run's gate call
    # answers `duplicate` and this run sends. Every decision of the job is after its making.
    gating = min(
        clock if clock is not None else timezone.now() - timedelta(seconds=1),
        job.created_at - timedelta(seconds=1),
    )
    # A decided round's job: its outranked sends are refused before the gate; email to a
    # braked mailbox provider, or beyond the day's warm-up volume, waits before it.
    split = round_split(job, recipients)
    before = split[0] if split is not None else None
    delivery = delivery_read(
        channel=job.channel,
        retries=chunk.kind == SendChunk.Kind.RETRY,
        recipients=recipients,
        before=before,
        now=clock or timezone.now(),
    )
    if delivery is not None:
        before = delivery.before
    with timed("gate"):
        if before is None:
            decisions = job_gate_check(job, recipients, now=clock)
        else:
            decisions = _gated_around(job, recipients, before, clock)
        if split is not None:
            refused = sum(
                1 for d, c in zip(decisions, split[1].tolist(), strict=True) if c and not d.allowed
            )
            assert job.round_id is not None  # a job no round decided is not split
            round_differences(job.round_id, refused)
        if delivery is not None:
            delivery_give_back(delivery, decisions)
    # What `retry_after` counts from: the gate's clock (taken after it answered, so that a
    # release read from it is never early).
    gated_at = clock or timezone.now()
    record = ChunkRecord(chunk, uuid.uuid4().hex[:16])
    run = _Run(chunk, recipients, dispatcher, record, lease, delivery)
    admitted = [(r, d) for r, d in zip(recipients, decisions, strict=True) if d.allowed]
    states = b""
    if admitted:
        with timed("claims"):
            states = record.take()  # how far an earlier run got; from now on, this run's
    sending = run.to_send(admitted, states)
    batches = run.batches(sending, max(1, dispatcher.batch_size))
    run.take_ahead(batches)
    run.send_all(batches, renderer)
    if run.sent_to:
        brake_count(SENT, run.sent_to, at=clock)
    if run.dead:
        dead_addresses_record(job, run.dead)
    # The ledger first: what went out is known there even if the writes below fail.
    with timed("ledger"):
        # Outcomes before releases: `released` does not replace an outcome the ledger knows.
        gate_outcomes(channel=job.channel, since=gating, outcomes=run.dispatched)
        if run.released:
            # Quota back for marketing; a transactional send's claim dropped, so that another
            # job may send its message id.
            gate_release(
                channel=job.channel, requests=run.released, job=job.pk, category=job.category
            )
    if run.opted_out:
        # The provider's word that they opted out: the gate refuses their next send on this
        # channel (from every process within GATEKEEPER_SUPPRESSION_TTL_SECONDS).
        suppress(
            channel=job.channel,
            user_ids=run.opted_out,
            reason=Suppression.Reason.UNSUBSCRIBED,
            source=opted_out_source(dispatcher.provider),
            note=f"opted out, said {dispatcher.provider} (job {job.pk})",
        )
    if job.channel == SMS and run.reached:
        # A reply (STOP) names only the number: which users it was texted for.
        sms_numbers_record(sends=run.reached, at=clock or timezone.now())
    outcomes = run.outcomes
    deferred: list[tuple[Recipient, datetime, str]] = []  # (recipient, its release, held)
    unavailable: list[Recipient] = []
    for i, (recipient, decision) in enumerate(zip(recipients, decisions, strict=True)):
        if decision.allowed:
            continue
        if decision.reason in HELD_BEFORE_GATE:
            assert delivery is not None  # only it holds sends before the gate
            held, release = delivery.holds[i]
            deferred.append((recipient, release, held))
        elif (
            decision.reason in DEFERRABLE
            and job.on_capped == SendJob.OnCapped.DEFER
            and decision.retry_after is not None
        ):
            deferred.append((recipient, gated_at + timedelta(seconds=decision.retry_after), ""))
        elif decision.reason == Reason.UNAVAILABLE and not run.last_attempt:
            # Redis or the snapshot is missing: try again soon instead of dropping the send.
            unavailable.append(recipient)
        elif decision.reason == Reason.UNAVAILABLE:
            outcomes[JobOutcome.FAILED] += 1
        else:
            # Dropped, blocked, or refused by a rule that never has room for it (no
            # retry_after: a reserve keeps every slot from this priority): deferring that
            # would wait forever.
            outcomes[JobOutcome.CAPPED] += 1
    retries: list[tuple[list[Recipient], float, int]] = []
    if run.retry:  # transient failures: backoff, and an attempt spent
        retries.append((run.retry, min(RETRY_WAIT_MAX, 5 * 2**chunk.attempts), chunk.attempts + 1))
    if unavailable:  # Redis or the snapshot missing: soon, and an attempt spent
        retries.append((unavailable, float(REDIS_DOWN_DELAY), chunk.attempts + 1))
    if run.postponed:  # their mailbox provider's rate: after its wait, no attempt spent
        retries.append((run.postponed, run.postponed_for, chunk.attempts))
    with timed("settle"):
        _settle(chunk, decisions, outcomes, retries, deferred, clock or timezone.now())
    return dict(outcomes)


def _gated_around(
    job: SendJob,
    recipients: list[Recipient],
    before: list[Decision | None],
    clock: datetime | None,
) -> list[Decision]:
    """A chunk some of whose sends were decided before the gate (`before`: a decision, or None
    for the gate to decide): a round's outranked (kept in the ledger as the gate's own), and
    email held for its mailbox provider (gated when its hold ends)."""
    gated = [r for r, d in zip(recipients, before, strict=True) if d is None]
    answers = iter(job_gate_check(job, gated, now=clock) if gated else [])
    decisions = [d if d is not None else next(answers) for d in before]
    outranked = [d for d in before if d is not None and d.reason == Reason.OUTRANKED]
    if outranked:
        gate_decided_before(job, outranked, now=clock)
    return decisions


def _still_queued(chunk_id: int) -> bool:
    """Inside the job's lock: False when another delivery already settled or gave up the chunk."""
    return SendChunk.objects.filter(pk=chunk_id, status=SendChunk.Status.QUEUED).exists()


def _count_on_job(job: SendJob, outcomes: Counter[str]) -> None:
    """Add a chunk's outcomes to its (locked) job; the job is done once all have one (not one
    whose file is still being read, its total still growing, nor one waiting for its start, nor
    one whose file was refused)."""
    unknown = set(outcomes) - set(SendJob.OUTCOMES)
    if unknown:
        raise ValueError(f"not outcomes of a send job: {', '.join(sorted(unknown))}")
    for outcome, count in outcomes.items():
        setattr(job, outcome, getattr(job, outcome) + count)
    # A failed job (its file refused after some of it was handed out) stays failed.
    waits = job.status in (
        SendJob.Status.SCHEDULED,
        SendJob.Status.PREPARING,
        SendJob.Status.FAILED,
    )
    if job.processed >= job.total and not waits:
        job.status = SendJob.Status.CANCELLED if job.cancelled_at else SendJob.Status.DONE
    job.save()


def release_groups(deferred: Iterable[tuple[R, datetime]]) -> list[tuple[datetime, list[R]]]:
    """Deferred recipients grouped by the minute of their release, each group with the latest
    release in it: (not_before, recipients), earliest first. Nobody of a group goes before their
    own release, and nobody more than a minute after it; a spread of releases (quiet hours'
    morning) stays a spread instead of one burst at its end."""
    groups: dict[int, list[tuple[R, datetime]]] = {}
    for recipient, release in deferred:
        groups.setdefault(int(release.timestamp() // 60), []).append((recipient, release))
    return [
        (max(release for _, release in group), [recipient for recipient, _ in group])
        for _, group in sorted(groups.items())
    ]


def _settle(
    chunk: SendChunk,
    decisions: list[Any],
    outcomes: Counter[str],
    retries: list[tuple[list[Recipient], float, int]],
    deferred: list[tuple[Recipient, datetime, str]],
    now: datetime,
) -> None:
    """Record the chunk's results on the job and store its follow-up chunks, in one
    transaction: retries (recipients, delay from `now`, attempts) and the deferred sends
    (recipient, release, what holds them: "" for the gate), grouped by hold and release
    minute. Follow-ups wait in the database, not in
    the broker: `send_chunks_due` queues each when its `not_before` comes.

    Read under the job's lock, so that a cancel or an expiry never misses a deferral made at the
    same moment: once the job's waiting sends are cancelled, a deferral is cancelled at once; a
    release after the job's expiry is expired at once (it could never go out)."""
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if not _still_queued(chunk.pk):
            return  # another delivery of this chunk's task finished first and counted it
        reasons = Counter(job.reasons)
        # A send an earlier run of this job admitted (and may have sent) is held by this job: the
        # gate says duplicate, but the job's reason for it is the earlier run's, allowed.
        mine = holder_of(job.pk)
        reasons.update(
            Reason.ALLOWED if d.reason == Reason.DUPLICATE and d.holder == mine else d.reason
            for d in decisions
        )
        segments = Counter(job.segments)
        segments.update(
            d.segment or "unknown" for d in decisions if d.reason not in HELD_BEFORE_GATE
        )
        waiting = []
        ended = _waiting_end(job, now)
        for recipient, release, held in deferred:
            if ended is not None:
                outcomes[ended] += 1
            elif release > job.expires_at:
                outcomes[EXPIRED] += 1
            else:
                waiting.append((recipient, release, held))
        reasons.update({o: outcomes[o] for o in (EXPIRED, CANCELLED) if outcomes[o]})
        job.reasons, job.segments = dict(reasons), dict(segments)
        follow_ups = [
            SendChunk(
                job=job,
                kind=SendChunk.Kind.RETRY,
                recipients=recipients,
                size=len(recipients),
                attempts=attempts,
                not_before=now + timedelta(seconds=delay),
            )
            for recipients, delay, attempts in retries
        ]
        holds: dict[str, list[tuple[Recipient, datetime]]] = {}
        for recipient, release, held in waiting:
            holds.setdefault(held, []).append((recipient, release))
        follow_ups.extend(
            # Waiting for a slot or the morning is not a failure: no attempt spent.
            SendChunk(
                job=job,
                kind=SendChunk.Kind.DEFERRED,
                recipients=recipients,
                size=len(recipients),
                attempts=chunk.attempts,
                not_before=not_before,
                held=held,
            )
            for held, group in holds.items()
            for not_before, recipients in release_groups(group)
        )
        large_rows_created(SendChunk, follow_ups)
        chunk.status = SendChunk.Status.DONE
        chunk.lease_until = None
        chunk.save(update_fields=["status", "lease_until"])
        _count_on_job(job, outcomes)


def chunks_due(*, now: datetime | None = None) -> list[int]:
    """The chunks that should be queued now (beat's `send_chunks_due` queues them, every few
    seconds): follow-ups whose `not_before` has come, chunks whose run died (killed: its lease
    ran out without being given back, since it was last queued), and chunks queued long ago
    whose task was lost (a broker or database failure at the wrong moment). Marked as queued
    now. A chunk run twice is harmless: the lease lets one run, and a finished chunk does
    nothing.

    A dead run's chunk is not left to its task: the broker gives a killed worker's messages
    back only after its visibility timeout (hours) on Redis."""
    now = instant_or_now(now)
    stale = now - timedelta(seconds=settings.GATEKEEPER_CHUNK_REQUEUE_SECONDS)
    died = Q(lease_until__lt=now, lease_until__gt=F("queued_at"))
    waiting = Q(queued_at__isnull=True) | Q(queued_at__lt=stale) | died
    ids = list(
        SendChunk.objects.filter(chunks_runnable_at(now), waiting)
        .order_by("pk")
        .values_list("pk", flat=True)[:1000]
    )
    SendChunk.objects.filter(pk__in=ids).update(queued_at=now)
    return ids


def chunk_run_later(chunk_id: int, *, seconds: float, now: datetime | None = None) -> None:
    """The chunk's next run, due in `seconds`, waits in the database: beat's `send_chunks_due`
    queues it then. Not as a message with a countdown: the broker hands such a message to one
    worker at once, which holds it until it is due, and a worker killed meanwhile has its
    messages given back only after the broker's visibility timeout (hours): the chunk would
    wait as long (`make bench BENCH_ARGS="chaos"` met it)."""
    now = instant_or_now(now)
    SendChunk.objects.filter(pk=chunk_id, status=SendChunk.Status.QUEUED).update(
        not_before=now + timedelta(seconds=seconds), queued_at=None
    )


def chunk_failed(chunk_id: int) -> int:
    """A run of the chunk stopped on an error: its failures so far, this one counted."""
    SendChunk.objects.filter(pk=chunk_id).update(failures=F("failures") + 1)
    found = SendChunk.objects.filter(pk=chunk_id).values_list("failures", flat=True).first()
    return found or 0


def chunks_runnable(*, job_id: int, now: datetime | None = None) -> list[int]:
    """A job's chunks that may run now (a resumed job's), marked as handed out now."""
    now = instant_or_now(now)
    runnable = SendChunk.objects.filter(chunks_runnable_at(now), job_id=job_id)
    ids = list(runnable.order_by("pk").values_list("pk", flat=True))
    chunks_update(ids, queued_at=now)
    return ids


def chunks_update(ids: list[int], **fields: Any) -> None:
    """Set `fields` on the chunks `ids`, a few thousand at a time: a job of 100M recipients has
    100,000 chunks, more than a database takes as parameters of one statement."""
    for start in range(0, len(ids), 5000):
        SendChunk.objects.filter(pk__in=ids[start : start + 5000]).update(**fields)


# --- waiting sends: expiry and cancelling ----------------------------------------------------


def _waiting_end(job: SendJob, now: datetime) -> str | None:
    """How the job's waiting sends end at `now`: EXPIRED, CANCELLED, or None (they still wait).
    Whichever came first decides."""
    cancelled_at = job.waiting_cancelled_at
    if job.expires_at <= now and (cancelled_at is None or job.expires_at < cancelled_at):
        return EXPIRED
    return CANCELLED if cancelled_at is not None else None


def _chunk_end(job: SendJob, kind: str, now: datetime) -> str | None:
    """How a chunk of `kind` ends at `now` without being gated: every chunk of a cancelled job
    as CANCELLED; a waiting one as its waiting sends end (_waiting_end); else None."""
    if kind == SendChunk.Kind.DEFERRED:
        return _waiting_end(job, now)
    return CANCELLED if job.cancelled_at is not None else None


def _ended(now: datetime) -> Q:
    """Chunks that end at `now` without being gated (a SendChunk lookup): the waiting ones of
    jobs that expired or had their waiting sends cancelled, and every chunk of a cancelled job."""
    waiting_ended = Q(job__expires_at__lte=now) | Q(job__waiting_cancelled_at__isnull=False)
    return Q(kind=SendChunk.Kind.DEFERRED) & waiting_ended | Q(job__cancelled_at__isnull=False)


def waiting_close(*, now: datetime | None = None, job_id: int | None = None) -> Counter[str]:
    """End the waiting sends of jobs that expired or whose waiting was cancelled (of one job
    with `job_id`), whatever their chunks' `not_before`. Returns how many ended as what.

    A waiting chunk no run ever took (the usual case) is closed in bulk in the database: none
    of it was gated or sent, every recipient is expired or cancelled. One an earlier run took
    (it died or raised midway) is closed by its claims, as a given-up chunk is: what went out
    counts as sent, what another job sent as a duplicate, what was cut off as ambiguous; Redis
    must answer for that, else it is left for the next call. A chunk a live run holds is left
    to that run, which settles it (its new deferrals are expired or cancelled then)."""
    now = instant_or_now(now)
    waiting = SendChunk.objects.filter(_ended(now), status=SendChunk.Status.QUEUED)
    if job_id is not None:
        waiting = waiting.filter(job_id=job_id)
    free = chunks_free(now)
    ended: Counter[str] = Counter()
    for job in list(waiting.values_list("job_id", flat=True).distinct()[:1000]):
        ended.update(_close_never_run(job, waiting.filter(free, job_id=job, runs=0), now))
    for chunk_id in list(waiting.filter(free, runs__gt=0).values_list("pk", flat=True)[:100]):
        lease = _chunk_lease(chunk_id)
        if not _taken_to_close(lease, now):
            continue
        chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
        how = _chunk_end(chunk.job, chunk.kind, now)
        if how is None:  # cannot be: the job's expiry and cancels are never undone
            _given_back(lease)
            continue
        try:
            outcomes = _closing_outcomes(chunk, how, earlier_runs=True)
        except REDIS_DOWN as exc:
            logger.warning("Chunk %s stays waiting until Redis answers: %s", chunk_id, exc)
            _given_back(lease)
            continue
        if _close(chunk, how, outcomes):
            ended[how] += outcomes[how]
    return ended


def _close_never_run(job_id: int, chunks: Any, now: datetime) -> Counter[str]:
    """Close a job's waiting chunks that no run took, in one transaction under the job's lock.
    Their rows are locked too: a run taking one meanwhile finds it closed and does nothing."""
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=job_id)
        outcomes: Counter[str] = Counter()
        closing: dict[str, list[int]] = {}  # how -> chunk ids
        for pk, size, kind in chunks.select_for_update().values_list("pk", "size", "kind"):
            how = _chunk_end(job, kind, now)
            if how is not None:
                closing.setdefault(how, []).append(pk)
                outcomes[how] += size
        if not outcomes:
            return Counter()
        for how, ids in closing.items():
            # expired or cancelled, as the outcome
            chunks_update(ids, status=SendChunk.Status(how), lease_until=None)
        reasons = Counter(job.reasons)
        reasons.update(outcomes)
        job.reasons = dict(reasons)
        _count_on_job(job, outcomes)
    logger.info("Job %s: %s", job_id, ", ".join(f"{n} sends {how}" for how, n in outcomes.items()))
    return outcomes


def _closing_outcomes(chunk: SendChunk, how: str, *, earlier_runs: bool) -> Counter[str]:
    """The outcomes of a waiting chunk that ends as `how` (EXPIRED, CANCELLED). With no earlier
    run, every recipient ends so; otherwise each by its claim (raises redis errors)."""
    if not earlier_runs:
        return Counter({how: len(chunk.recipients)})
    outcomes, unclaimed = _by_claims(chunk, unclaimed_as=how)
    _give_back(chunk.job, unclaimed)  # an earlier run may have charged them
    return outcomes


def _give_back(job: SendJob, unclaimed: list[tuple[int, str]]) -> None:
    """Release the quota (or, transactional, the claims) of sends that did not go out; a
    failure is logged, not raised (the sends' outcomes stand either way)."""
    if not unclaimed:
        return
    try:
        gate_release(channel=job.channel, requests=unclaimed, job=job.pk, category=job.category)
    except Exception:
        logger.warning("Could not give back the quota of %d sends", len(unclaimed))


def _close(chunk: SendChunk, how: str, outcomes: Counter[str]) -> bool:
    """Settle a waiting chunk as expired or cancelled, under the job's lock. False when another
    delivery settled it first (then its outcomes are not counted here)."""
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if not _still_queued(chunk.pk):
            return False
        reasons = Counter(job.reasons)
        reasons[how] += outcomes[how]
        job.reasons = dict(reasons)
        _count_on_job(job, outcomes)
        status = SendChunk.Status(how)  # expired or cancelled, as the outcome
        SendChunk.objects.filter(pk=chunk.pk).update(status=status, lease_until=None)
    return True


def _by_claims(
    chunk: SendChunk, *, unclaimed_as: str
) -> tuple[Counter[str], list[tuple[int, str]]]:
    """Each recipient of a chunk a run may have left midway, by what is known of it
    (worker/claims.py): sent (by this job) as sent, sent or being sent by another job as a
    duplicate, cut off while sending as ambiguous (kept), the rest as `unclaimed_as`. Also the
    (user id, message id)s this job charged and never sent, whose quota goes back. Raises redis
    errors."""
    recipients, channel = recipients_typed(chunk.recipients), chunk.job.channel
    record = record_read(chunk)
    states = [state_at(record, i) for i in range(len(recipients))]
    unmarked = [i for i, state in enumerate(states) if state == NOT_SENT]
    holders: list[int | None] = [None] * len(recipients)
    looked_up = gate_holders(
        channel=channel,
        requests=[(recipients[i].user_id, recipients[i].message_id) for i in unmarked],
    )
    for i, holder in zip(unmarked, looked_up, strict=True):
        holders[i] = holder
    found = left_behind(
        channel,
        chunk.job_id,
        [(r.message_id, states[i], holders[i]) for i, r in enumerate(recipients)],
    )
    outcomes: Counter[str] = Counter()
    unclaimed: list[tuple[int, str]] = []
    mine = holder_of(chunk.job_id)
    for i, left in enumerate(found):
        if left == Left.NOTHING:
            outcomes[unclaimed_as] += 1
            if holders[i] == mine:  # charged by this job, never sent
                unclaimed.append((recipients[i].user_id, recipients[i].message_id))
        else:
            outcomes[_LEFT_OUTCOMES[left]] += 1
    return outcomes, unclaimed


# How a send an earlier run left ends, when it was handed over or is another job's.
_LEFT_OUTCOMES = {
    Left.SENT: JobOutcome.SENT,
    Left.CUT_OFF: JobOutcome.AMBIGUOUS,
    Left.OTHER_JOB: JobOutcome.DUPLICATE,
}


def send_chunk_fail(*, chunk_id: int, error: str) -> None:
    """Give a chunk up after its task failed for good, so the job still finishes. What the
    claims say decides each recipient: sent (by this job) counts as sent, sent by another job
    as a duplicate, `sending` as ambiguous (kept), and an unclaimed one as failed with its quota
    given back (the gate may have charged it). With Redis unreachable too, every recipient
    counts as failed and nothing is released."""
    if not _taken_to_run(_chunk_lease(chunk_id), timezone.now()):
        return  # finished, or held by a live run (a later delivery), which settles it
    chunk = SendChunk.objects.select_related("job").get(pk=chunk_id)
    try:
        outcomes, unclaimed = _by_claims(chunk, unclaimed_as=JobOutcome.FAILED)
    except REDIS_DOWN:
        outcomes = Counter({JobOutcome.FAILED: len(chunk.recipients)})
    else:
        _give_back(chunk.job, unclaimed)
    with transaction.atomic():
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        if not _still_queued(chunk_id):
            return
        _count_on_job(job, outcomes)
        SendChunk.objects.filter(pk=chunk_id).update(
            status=SendChunk.Status.FAILED, error=error[:2000], lease_until=None
        )


# --- an erasure -------------------------------------------------------------------------------

# What an erased person's recipient record becomes in a chunk that will never run again: its
# place kept (the chunk's size and its counts stay), nothing of them in it.
ERASED_RECIPIENT = {"user_id": 0, "address": "", "message_id": ""}
FINISHED = (
    SendChunk.Status.DONE,
    SendChunk.Status.FAILED,
    SendChunk.Status.EXPIRED,
    SendChunk.Status.CANCELLED,
)


def chunk_withdraw(
    chunk_id: int, user_ids: set[int], *, now: datetime | None = None
) -> tuple[int, int]:
    """Take erased people's recipient records out of one chunk, under its row lock: blanked in
    a chunk that will not run again; removed from one that never ran and no run holds (a queued
    or staged chunk, waiting sends included), each counted `cancelled` on its job; left, for a
    later try, in one a run holds or ran (its record keeps sends by place): the gate refuses
    them there meanwhile. Returns (records removed or blanked, records left)."""
    now = instant_or_now(now)
    with transaction.atomic():
        chunk = SendChunk.objects.select_for_update().filter(pk=chunk_id).first()
        if chunk is None:
            return 0, 0
        theirs = [i for i, r in enumerate(chunk.recipients) if r["user_id"] in user_ids]
        if not theirs:
            return 0, 0
        if chunk.status in FINISHED:
            for i in theirs:
                chunk.recipients[i] = ERASED_RECIPIENT
            chunk.plan = None  # only a staged chunk is planned
            chunk.save(update_fields=["recipients", "plan"])
            return len(theirs), 0
        held = chunk.lease_until is not None and chunk.lease_until >= now
        if held or chunk.runs:
            return 0, len(theirs)
        chunk.recipients = [r for r in chunk.recipients if r["user_id"] not in user_ids]
        chunk.size = len(chunk.recipients)
        if not chunk.recipients:
            chunk.status = SendChunk.Status.CANCELLED
        chunk.plan = repacked(chunk)  # what the plan reads, made again without them
        chunk.save(update_fields=["recipients", "size", "status", "plan"])
        job = SendJob.objects.select_for_update().get(pk=chunk.job_id)
        _count_on_job(job, Counter({JobOutcome.CANCELLED: len(theirs)}))
        return len(theirs), 0
