import json
from datetime import timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from gatekeeper.lib.words import count
from limits.engine.table import DEFAULT_PRIORITY, PRIORITIES
from limits.reasons import JOB_OUTCOMES, Category

MESSAGE_ID_MAX = 200  # characters; the gate's limit too
# A send job's campaign leaves room in a message id for ":" and a 20-digit user id: the default
# message id is <campaign>:<user_id>.
JOB_CAMPAIGN_MAX = MESSAGE_ID_MAX - 21
# A job's sends that wait (deferred by the gate) are dropped as `expired` at its expiry: by
# default a day after it was created, at most EXPIRY_MAX after.
EXPIRY_DEFAULT = timedelta(hours=24)
EXPIRY_MAX = timedelta(days=90)
# A scheduled job starts at most this far ahead (its expiry at most EXPIRY_MAX after its start).
START_MAX = timedelta(days=90)
# The jobs a round decides at most (its choice takes a set of them as a bit mask).
ROUND_JOBS_MAX = 60


def expiry_default() -> Any:
    """A new job's expiry when its caller names none: EXPIRY_DEFAULT from now."""
    return timezone.now() + EXPIRY_DEFAULT


class Round(models.Model):
    """Competing send jobs decided by value per user (worker/rounds.py): jobs join it until it
    closes and wait as scheduled jobs; when it closes, each user gets, among the round's
    sends for them, the set of highest total value that fits every rule at `send_at`, and the
    others are refused as `outranked`. The chosen sends then go through the gate as usual when
    the jobs start at `send_at`."""

    class Status(models.TextChoices):
        OPEN = "open", "open: jobs join, leave or change their value until it closes"
        DECIDING = "deciding", "deciding: the best sends for each user are being chosen"
        DECIDED = "decided", "decided: its jobs start at its send time"
        CANCELLED = "cancelled", "cancelled: its jobs went back to waiting, or were cancelled"

    name = models.CharField(max_length=200)
    channel = models.CharField(
        max_length=32, help_text="The channel its jobs send on, or `all`: jobs on any channel."
    )
    closes_at = models.DateTimeField(help_text="When its jobs are decided; no job joins after.")
    send_at = models.DateTimeField(help_text="When its jobs start (at or after closes_at).")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A run decides the round until then (renewed as it runs)."
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    report = models.JSONField(
        null=True, blank=True, help_text="What the decision chose, per job (worker/rounds.py)."
    )
    differences = models.PositiveIntegerField(
        default=0, help_text="Chosen sends the gate refused when they went out."
    )
    projection = models.JSONField(
        null=True,
        blank=True,
        help_text="What the round would choose if it closed then, as its report says it, with "
        "the job values tried instead of theirs: {at, values, report} (worker/rounds.py).",
    )
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-closes_at", "-id"]
        indexes = [models.Index(fields=["status", "closes_at"], name="round_close_due")]

    def __str__(self) -> str:
        return f"{self.name} ({self.channel}, closes {self.closes_at:%Y-%m-%d %H:%M})"


class SendJob(models.Model):
    """A campaign's sends handed to the worker: gated in chunks, dispatched, counted.

    Every recipient ends in exactly one outcome, so at every moment
    sent + failed + capped + ambiguous + duplicate + invalid + expired + cancelled + pending
    == total, also after a worker was killed (a chunk's outcomes are added in the transaction
    that closes it, once):
    - sent: went out (counted by the claim, so a send a killed run made still counts);
    - failed: did not go out and will not (its quota is given back);
    - capped: refused by the gate (caps, blocked) and not deferred;
    - ambiguous: may or may not have gone out (a worker died during the send, or the provider
      timed out after taking it) on a transport that cannot deduplicate: kept, not repeated;
    - duplicate: its message id had already gone out, by another job, or the job lists the
      same user with the same message id twice (one send);
    - invalid: refused when the job was created (`on_invalid: skip`), with the reason kept;
    - expired: deferred by the gate (caps, quiet hours) and still waiting at `expires_at`, or
      released only after it;
    - cancelled: deferred and waiting when its waiting sends were cancelled (or deferred after);
    - pending: not settled yet (queued, retrying, or waiting: deferred until its release).
    """

    class Status(models.TextChoices):
        PREPARING = (
            "preparing",
            "preparing: its file is being read; what was read is sent meanwhile",
        )
        SCHEDULED = (
            "scheduled",
            "scheduled: waits for its start; can be edited, rescheduled or cancelled until then",
        )
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused", "paused: no chunk is handed out until it is resumed"
        DONE = "done"
        CANCELLED = "cancelled", "cancelled: what had not gone out never will"
        FAILED = (
            "failed",
            "failed: its file was refused; nothing after the bad line was sent",
        )

    class OnCapped(models.TextChoices):
        DROP = "drop", "drop capped sends"
        DEFER = "defer", "send them when a slot frees"

    class OnInvalid(models.TextChoices):
        REJECT = "reject", "refuse the whole job"
        SKIP = "skip", "count bad rows as invalid and send the rest"

    OUTCOMES = JOB_OUTCOMES

    channel = models.CharField(max_length=32)
    campaign = models.CharField(max_length=200)
    template = models.CharField(max_length=100)
    category = models.CharField(max_length=16, default=Category.MARKETING)
    tags = models.JSONField(
        default=list, blank=True, help_text="The sends' tags, which tag rules count."
    )
    priority = models.PositiveSmallIntegerField(
        default=DEFAULT_PRIORITY,
        validators=[MinValueValidator(PRIORITIES[0]), MaxValueValidator(PRIORITIES[1])],
        help_text=f"{PRIORITIES[0]} to {PRIORITIES[1]}, higher is more important; only a rule's "
        "reserve reads it.",
    )
    topic = models.CharField(
        max_length=64, blank=True, help_text="What the sends are about (a topic's slug)."
    )
    on_capped = models.CharField(max_length=8, choices=OnCapped.choices, default=OnCapped.DROP)
    on_invalid = models.CharField(max_length=8, choices=OnInvalid.choices, default=OnInvalid.REJECT)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    total = models.PositiveIntegerField(default=0)
    sent = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    capped = models.PositiveIntegerField(default=0)
    ambiguous = models.PositiveIntegerField(default=0, help_text="May or may not have gone out.")
    duplicate = models.PositiveIntegerField(
        default=0,
        help_text="Already sent under its message id by another job, or listed twice.",
    )
    invalid = models.PositiveIntegerField(default=0, help_text="Rows refused at creation.")
    expired = models.PositiveIntegerField(
        default=0, help_text="Deferred sends still waiting when the job expired."
    )
    cancelled = models.PositiveIntegerField(
        default=0, help_text="Deferred sends waiting when their waiting was cancelled."
    )
    start_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When it starts (empty: as soon as it is handed over); until then it is "
        "scheduled, and can be edited, rescheduled or cancelled.",
    )
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="When its chunks were first handed out."
    )
    round = models.ForeignKey(
        Round,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="jobs",
        help_text="The round it competes in: it waits until the round is decided and its send "
        "time comes; its sends the round did not choose are refused as `outranked`.",
    )
    value = models.FloatField(
        null=True,
        blank=True,
        help_text="In a round, what one of its sends is worth (at least 0); a recipient's own "
        "`value` (a campaign file's column) replaces it.",
    )
    reserve = models.BooleanField(
        default=False,
        help_text="Until it starts, its predicted sends hold their slots: an earlier send of a "
        "lower priority that would take one is refused as `reserved`.",
    )
    expires_at = models.DateTimeField(
        default=expiry_default,
        help_text="Sends still waiting (deferred by the gate) then are dropped as expired.",
    )
    waiting_cancelled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its waiting sends were cancelled (then every later deferral is too).",
    )
    waiting_cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    invalid_rows = models.JSONField(
        default=list,
        blank=True,
        help_text="The first 100 invalid rows: row, field, message (and line, from a file).",
    )
    # A job handed over as a file (an upload, or an object in the store): read in the
    # background while the job is `preparing`, its recipients staged in chunks that are handed
    # to the workers as they are written (worker/preparing.py).
    file = models.FileField(
        upload_to="send-files/",
        blank=True,
        help_text="An uploaded recipients file, kept until it is read.",
    )
    source = models.CharField(
        max_length=1024,
        blank=True,
        help_text="Where the recipients came from: the uploaded file's name, or store:<key>.",
    )
    source_bytes = models.BigIntegerField(
        default=0, help_text="The recipients file's size, as handed over (0: not a file)."
    )
    read_bytes = models.BigIntegerField(default=0, help_text="Of it, read so far.")
    error = models.TextField(blank=True, help_text="Why the job failed (its file was refused).")
    prepare_lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A run reads the file until then (renewed as it reads)."
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the whole job was cancelled: nothing more of it goes out.",
    )
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    reasons = models.JSONField(default=dict, blank=True, help_text="Gate decisions by reason.")
    segments = models.JSONField(default=dict, blank=True, help_text="Gate decisions by segment.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # Beat's look for scheduled jobs whose start has come, every few seconds.
            models.Index(fields=["status", "start_at"], name="job_start_due"),
        ]
        permissions = [
            ("cancel_sendjob", "Can pause, resume and cancel a send job, or its waiting sends")
        ]

    def __str__(self) -> str:
        return f"{self.campaign} ({self.channel}, {count(self.total, 'recipient')})"

    @property
    def processed(self) -> int:
        """Recipients with a final outcome."""
        return sum(getattr(self, outcome) for outcome in self.OUTCOMES)

    @property
    def pending(self) -> int:
        return self.total - self.processed

    @property
    def progress(self) -> int:
        """Percent: of the file read while the job is preparing, else of its recipients settled."""
        if self.status == self.Status.PREPARING:
            return (
                min(99, int(100 * self.read_bytes / self.source_bytes)) if self.source_bytes else 0
            )
        return 100 if not self.total else min(100, int(100 * self.processed / self.total))

    @property
    def waits_to_start(self) -> bool:
        """Not started yet, and to start later: scheduled, or being read with a start ahead.
        Until then the job can be edited and rescheduled."""
        return self.started_at is None and (
            self.status == self.Status.SCHEDULED
            or (self.status == self.Status.PREPARING and self.start_at is not None)
        )

    @property
    def ended(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.CANCELLED, self.Status.FAILED)


class CompactJSONEncoder(json.JSONEncoder):
    """JSON as `json.dumps` writes it, without the spaces, by msgspec: a chunk holds thousands
    of recipients, and encoding them was a third of storing a campaign file's chunks."""

    def encode(self, o: Any) -> str:
        return msgspec.json.encode(o).decode()


class CompactJSONDecoder(json.JSONDecoder):
    """JSON read by msgspec (twice as fast as `json.loads` on a chunk's recipients)."""

    def decode(self, s: str, *args: Any) -> Any:
        try:
            return msgspec.json.decode(s)
        except msgspec.DecodeError:
            return json.loads(s)  # rows written before: json.dumps also wrote NaN


class RoundEntry(models.Model):
    """What a decided round chose for one of its jobs (worker/rounds.py): the users whose send
    it chose (they go through the gate when the job runs; a refusal there is a difference), and
    those outranked, each with the job that won their slot and that send's value to them. The
    job's run refuses the outranked as `outranked` before the gate, records them in the ledger
    and counts them as it counts a refusal."""

    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="entries")
    job = models.OneToOneField(SendJob, on_delete=models.CASCADE, related_name="round_entry")
    chosen = models.BinaryField(
        default=b"", help_text="The users chosen: little-endian uint64, ascending."
    )
    outranked = models.BinaryField(
        default=b"",
        help_text="The users outranked (uint64, ascending), then per user the winning job "
        "(int64) and its value (float64), little-endian.",
    )

    def __str__(self) -> str:
        return f"job {self.job_id} in round {self.round_id}"


class SendChunk(models.Model):
    """Up to CHUNK_SIZE recipients of a job, gated in one gate call."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        DONE = "done"
        FAILED = "failed"
        STAGED = "staged"  # read from its job's file, which is still being read: not queued yet
        EXPIRED = "expired"  # waiting when its job expired: its unsent recipients expired
        CANCELLED = "cancelled"  # waiting when its job's waiting sends were cancelled

    class Kind(models.TextChoices):
        SEND = "send", "the job's first pass"
        RETRY = "retry", "sends tried again (a transient failure, Redis missing)"
        DEFERRED = "deferred", "sends the gate deferred (caps, quiet hours): waiting"

    job = models.ForeignKey(SendJob, on_delete=models.CASCADE, related_name="chunks")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.SEND)
    part = models.PositiveIntegerField(
        default=0,
        db_default=0,  # the previous release's INSERTs leave it out while both run
        help_text="The part of its job's file it was read from (SendJobPart.index).",
    )
    recipients = models.JSONField(
        encoder=CompactJSONEncoder,
        decoder=CompactJSONDecoder,
        help_text="[{user_id, address, message_id, context, time_zone (when given)}]",
    )
    size = models.PositiveIntegerField(default=0, help_text="How many recipients it holds.")
    plan = models.BinaryField(
        null=True,  # the previous release's INSERTs leave it out while both run
        blank=True,
        editable=False,
        help_text="A staged chunk of a job with a start: its recipients' users, message hashes "
        "and zones as arrays, which the forward plan reads instead of the JSON "
        "(worker/planned.py; empty: read from the JSON).",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    failures = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,  # the previous release's INSERTs leave it out while both run
        help_text="Runs that stopped on an error (the database or Redis gone mid-chunk): it is "
        "run again after a backoff, and given up after the last.",
    )
    not_before = models.DateTimeField(null=True, blank=True, help_text="Deferred until then.")
    held = models.CharField(
        max_length=300,
        blank=True,
        default="",
        db_default="",  # the previous release's INSERTs leave it out while both run
        help_text="What its waiting sends wait for, when not the gate: `warmup:<domain>:<group>` "
        "(the next day of a warm-up plan), `brake:<group>` (a paused mailbox provider) "
        "(worker/delivery/deliverability.py).",
    )
    error = models.TextField(blank=True, help_text="Why the chunk was given up.")
    queued_at = models.DateTimeField(
        null=True, blank=True, help_text="Last handed to the broker (empty: not yet)."
    )
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A run holds the chunk until then (renewed as it runs)."
    )
    runs = models.PositiveIntegerField(
        default=0,
        help_text="Runs that took it to gate and send (0: nothing of it was gated or sent, so it "
        "can be expired or cancelled without asking Redis).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Waiting sends: a job's (its page, cancel), every job's (the dashboard, expiry).
            models.Index(fields=["kind", "status", "not_before"], name="chunk_waiting"),
        ]

    def __str__(self) -> str:
        return f"chunk {self.pk} of job {self.job_id}"


def chunks_waiting() -> "models.QuerySet[SendChunk]":
    """Waiting sends: the queued deferred chunks (the gate's deferrals and the holds)."""
    return SendChunk.objects.filter(kind=SendChunk.Kind.DEFERRED, status=SendChunk.Status.QUEUED)


class SendJobPart(models.Model):
    """A byte range of a job's campaign file, read by whichever send worker is free: its
    recipients staged in chunks (`SendChunk.part`), its counts and the user ids it listed kept
    here, until the job's reading run takes it in, in file order (worker/preparing.py). Part 0,
    from the file's start, is read by that run itself and has no row."""

    class Status(models.TextChoices):
        WAITING = "waiting", "not read yet"
        READ = "read", "read: its chunks staged"
        FAILED = "failed", "could not be read as CSV"
        TAKEN = "taken", "taken in by the reading run: its chunks are the job's"

    job = models.ForeignKey(SendJob, on_delete=models.CASCADE, related_name="parts")
    index = models.PositiveIntegerField()
    start = models.BigIntegerField(help_text="Its first byte in the file.")
    end = models.BigIntegerField(help_text="The byte after its last.")
    first_line = models.PositiveBigIntegerField(help_text="The file's line number it starts on.")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.WAITING)
    lease_until = models.DateTimeField(null=True, blank=True)
    rows = models.PositiveIntegerField(default=0)
    invalid = models.PositiveIntegerField(default=0)
    repeats = models.PositiveIntegerField(default=0, help_text="Users it lists twice.")
    invalid_rows = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, help_text="Why it could not be read.")
    users = models.BinaryField(
        default=b"", help_text="The user ids of its valid rows: a serialized roaring bitmap."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="send_job_part_index"),
        ]

    def __str__(self) -> str:
        return f"part {self.index} of job {self.job_id}"


class DeadAddress(models.Model):
    """An address or push token the provider said is dead (an unregistered token, an unknown
    mailbox) during one of the job's sends: the send failed for good, and the campaign system
    should stop sending to it. Listed on the job (GET /api/v1/sends/<id>/), an event of the
    event stream (`dead_address`, posted to the webhook endpoints that take it), and, for one
    version more, POSTed to the deprecated GATEKEEPER_DEAD_ADDRESS_WEBHOOK when set. Its writers
    take DeadAddressLock first, so its ids commit in order: the stream reads it as a journal."""

    job = models.ForeignKey(SendJob, on_delete=models.CASCADE, related_name="dead_addresses")
    user_id = models.PositiveBigIntegerField()
    address = models.CharField(max_length=4096)
    reason = models.CharField(max_length=300, help_text="What the provider said.")
    at = models.DateTimeField(auto_now_add=True)
    reported = models.BooleanField(
        default=False, help_text="Delivered to GATEKEEPER_DEAD_ADDRESS_WEBHOOK."
    )

    def __str__(self) -> str:
        return f"{self.address[:40]} (user {self.user_id}): {self.reason[:60]}"


class DeadAddressLock(models.Model):
    """One row that every write of dead addresses locks first, so that they commit in the order
    of their ids and the event stream, which takes them by ranges of ids, misses none."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)

    def __str__(self) -> str:
        return "dead address lock"


class SmsNumber(models.Model):
    """A phone number an sms send went to (or may have), and the user it was for: a reply such
    as STOP carries only the number (worker/delivery/sms_numbers.py)."""

    number = models.CharField(max_length=16, help_text="E.164: a + and up to 15 digits.")
    user_id = models.PositiveBigIntegerField()
    last_sent_at = models.DateTimeField(help_text="When this user was last texted at it.")

    class Meta:
        constraints = [
            # Also the index a reply's lookup by number uses (its first column).
            models.UniqueConstraint(fields=["number", "user_id"], name="sms_number_user"),
        ]

    def __str__(self) -> str:
        return f"{self.number} (user {self.user_id})"


class Backtest(models.Model):
    """A draft of the policy replayed on the ledger's days (worker/backtest.py): the draft as
    given, the period, its progress part by part, and the result once every part is done."""

    class Status(models.TextChoices):
        QUEUED = "queued", "waiting for a worker"
        RUNNING = "running", "replaying the ledger"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    start = models.DateField(help_text="The period's first UTC day.")
    end = models.DateField(help_text="Its last UTC day (included).")
    changes = models.JSONField(default=dict, blank=True, help_text="The draft, as given.")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    parts = models.PositiveSmallIntegerField(help_text="Its users split by id into this many.")
    expected = models.BigIntegerField(
        default=0, help_text="The ledger's decisions in the period (its hourly counts)."
    )
    policy_mark = models.BigIntegerField(
        default=0, help_text="The last setting change when it was asked for (0: none)."
    )
    partial = models.TextField(
        blank=True, help_text="What the ledger does not hold of what the replay needs."
    )
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    origin = models.JSONField(
        null=True,
        blank=True,
        help_text="The admin form it was tried from: {kind, id (null: a new one), label}.",
    )
    saved_as = models.ForeignKey(
        "limits.SettingChange",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="backtests",
        help_text="The change it was saved as, which it is kept with.",
    )

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"backtest {self.pk}: {self.start} to {self.end}"


class BacktestPart(models.Model):
    """The users of one `user_id % parts` of a backtest: how far its replay is, and its sums."""

    backtest = models.ForeignKey(Backtest, on_delete=models.CASCADE, related_name="part_rows")
    index = models.PositiveSmallIntegerField()
    done = models.BigIntegerField(default=0, help_text="Decisions replayed so far.")
    result = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["backtest", "index"], name="backtest_part_index"),
        ]

    def __str__(self) -> str:
        return f"part {self.index} of backtest {self.backtest_id}"


class MailboxProvider(models.Model):
    """A group of recipients' mailbox domains (gmail, microsoft, yahoo, apple, other): the
    email sent to it is held to its rates per dispatcher, stopped by its brake, and counted by
    a sending domain's warm-up plan (worker/delivery/mailboxes.py, deliverability.py). `other`
    takes every domain no group names and cannot be deleted."""

    slug = models.SlugField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    domains = models.JSONField(
        default=list,
        blank=True,
        help_text="Recipient domains, lowercase: `gmail.com`, or `hotmail.*` for every last "
        "label (hotmail.com, hotmail.co.uk).",
    )
    mx_hosts = models.JSONField(
        default=list,
        blank=True,
        help_text="MX host suffixes (`google.com`): a domain no group names is matched by its "
        "mail servers, when GATEKEEPER_MAILBOX_MX_LOOKUP is on.",
    )
    rates = models.JSONField(
        default=list,
        blank=True,
        help_text='[{"dispatcher": "smtp" or "*", "per_second", "per_minute", "per_hour"}]: '
        "messages to this group that all workers together send through that dispatcher.",
    )
    paused_at = models.DateTimeField(
        null=True, blank=True, help_text="Its brake stopped its sends then (empty: sending)."
    )
    paused_why = models.JSONField(
        null=True, blank=True, help_text="The figures the brake read when it stopped it."
    )
    resumed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A person resumed it then: the brake counts only mail sent since.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug


class WarmupPlan(models.Model):
    """A new sending domain warmed up: for each day since `starts_on` (in `time_zone`), how many
    messages each mailbox provider may get from it; sends beyond the day's volume wait for the
    next day. A group's ramp ends once a day's sends reach its last day's volume
    (worker/delivery/warmup.py)."""

    domain = models.CharField(max_length=253, unique=True, help_text="The sending domain.")
    time_zone = models.CharField(max_length=64, default="UTC", help_text="Where its days start.")
    starts_on = models.DateField(help_text="Its first day.")
    volumes = models.JSONField(
        help_text='{"gmail": [50, 100, ...], ...}: each group\'s volume for each day; a group '
        "not named is not held."
    )
    ended = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"gmail": "2027-01-20"}: groups whose ramp ended, and the day it did.',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"warm-up of {self.domain}"


class SendingDomain(models.Model):
    """A domain the email goes out from, checked in DNS: SPF, DKIM for the selectors its email
    provider names, DMARC, and whether they align with it (worker/delivery/dns_checks.py)."""

    domain = models.CharField(max_length=253, unique=True)
    dkim_selectors = models.JSONField(
        default=list, blank=True, help_text="The DKIM selectors the email provider signs with."
    )
    return_path = models.CharField(
        max_length=253,
        blank=True,
        help_text="The bounce (envelope sender) domain the provider uses, when not the domain.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return self.domain
