from typing import Any

from django.conf import settings
from django.db import models

from limits.channels import validate_scope
from segments.models import Segment


class Cap(models.Model):
    """How many marketing messages a segment's users may get on one channel (or `all`).

    Each window is rolling: daily is the last 24 hours, weekly the last 7 x 24 hours.
    An empty limit means no cap for that window; 0 means no marketing at all.
    """

    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="caps")
    # Validated against settings rather than `choices`, so adding a channel needs no migration.
    channel = models.CharField(max_length=32, validators=[validate_scope])
    daily = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most sends in any 24 hours. Empty: no daily cap."
    )
    weekly = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most sends in any 7 days. Empty: no weekly cap."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["segment__priority", "channel"]
        permissions = [
            ("use_gate", "Can call the gate and hand over send jobs"),
            ("reset_quota", "Can reset a user's quota"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["segment", "channel"], name="limits_one_cap_per_scope"),
        ]

    def __str__(self) -> str:
        return f"{self.segment.slug} / {self.channel}"


class CapChange(models.Model):
    """One edit of a cap: who, when, and the values before and after. Written by `cap_set`."""

    cap = models.ForeignKey(Cap, on_delete=models.SET_NULL, null=True, related_name="changes")
    segment_slug = models.CharField(max_length=64)
    channel = models.CharField(max_length=32)
    old_daily = models.PositiveIntegerField(null=True, blank=True)
    old_weekly = models.PositiveIntegerField(null=True, blank=True)
    new_daily = models.PositiveIntegerField(null=True, blank=True)
    new_weekly = models.PositiveIntegerField(null=True, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    via = models.CharField(max_length=16, default="admin", help_text="admin, api or command")
    changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.segment_slug}/{self.channel}: {self.old_daily}/{self.old_weekly} -> {self.new_daily}/{self.new_weekly}"


class Authored(models.Model):
    """Who created a row and who changed it last, and when (rules, quiet hours)."""

    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
    )
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="+",
    )

    class Meta:
        abstract = True


class ChangeRecord(models.Model):
    """One change of an authored row: the action, the row before and after (as the REST API
    shows it), what it read as, who made it, through what and when. Written by limits.authored in
    the same transaction as the change."""

    class Action(models.TextChoices):
        CREATED = "created"
        CHANGED = "changed"
        DELETED = "deleted"

    action = models.CharField(max_length=8, choices=Action.choices)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    label = models.CharField(max_length=100, help_text="The row as it read at the change.")
    via = models.CharField(max_length=16, default="admin", help_text="admin, api, cap or command")

    class Meta:
        abstract = True
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.label}: {self.action}"


class Rule(Authored):
    """A cap rule: for the users of one segment (or of every segment), on one channel (or all
    channels together), count the marketing sends that match over a window and admit at most
    `limit`. Validated by `limits.rules.rule_problems`; written through `limits.services`.

    A classic cap is stored as two of these (rolling 24 h and 7 d, every send), tied to their
    Cap row: they change with the cap and only through it.
    """

    class Match(models.TextChoices):
        ANY = "any", "every send"
        TAG = "tag", "sends carrying a tag"
        CAMPAIGN = "campaign", "each campaign on its own"

    class WindowKind(models.TextChoices):
        ROLLING = "rolling", "rolling"
        CALENDAR = "calendar", "calendar, in the user's time zone"

    class Unit(models.TextChoices):
        DAY = "day"
        WEEK = "week"
        MONTH = "month"

    name = models.CharField(max_length=100, help_text='In your words: "1 promo a day".')
    segment = models.ForeignKey(
        Segment,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="rules",
        help_text="Empty: every segment.",
    )
    # Validated against settings rather than `choices`, so adding a channel needs no migration.
    channel = models.CharField(max_length=32, validators=[validate_scope])
    match = models.CharField(max_length=16, choices=Match.choices, default=Match.ANY)
    tag = models.CharField(max_length=64, blank=True, help_text="The tag a tag rule counts.")
    window_kind = models.CharField(
        max_length=16, choices=WindowKind.choices, default=WindowKind.ROLLING
    )
    window_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="A rolling window's length: 60 to 7,776,000 (90 days)."
    )
    window_unit = models.CharField(max_length=8, choices=Unit.choices, blank=True)
    limit = models.PositiveIntegerField(help_text="Most sends in the window; 0 blocks them all.")
    reserve_below_priority = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Sends below this priority (1-9) may not use the reserve."
    )
    reserve_slots = models.PositiveIntegerField(
        null=True, blank=True, help_text="Slots kept for sends of that priority or above."
    )
    enabled = models.BooleanField(default=True)
    cap = models.ForeignKey(
        Cap, on_delete=models.CASCADE, null=True, blank=True, editable=False, related_name="rules"
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cap", "window_seconds"],
                condition=models.Q(cap__isnull=False),
                name="limits_one_rule_per_classic_window",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def classic(self) -> bool:
        return self.cap_id is not None

    def window(self) -> dict[str, Any]:
        if self.window_kind == self.WindowKind.CALENDAR:
            return {"kind": "calendar", "unit": self.window_unit}
        return {"kind": "rolling", "seconds": self.window_seconds}

    def reserve(self) -> dict[str, int] | None:
        if self.reserve_below_priority is None or self.reserve_slots is None:
            return None
        return {"below_priority": self.reserve_below_priority, "slots": self.reserve_slots}


class RuleChange(ChangeRecord):
    """One change of a rule (its label: the rule's name then)."""

    rule = models.ForeignKey(
        Rule, on_delete=models.SET_NULL, null=True, blank=True, related_name="changes"
    )


class QuietHours(Authored):
    """Quiet hours: the local times at which the users of one segment (or of every segment)
    get no marketing on one channel (or `all` channels), and the spread over which sends held
    until the end go out. Validated by `limits.quiet.quiet_problems`; written through
    `limits.services`, each change audited."""

    segment = models.ForeignKey(
        Segment,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="quiet_hours",
        help_text="Empty: every segment.",
    )
    # Validated against settings rather than `choices`, so adding a channel needs no migration.
    channel = models.CharField(max_length=32, validators=[validate_scope])
    start = models.TimeField(help_text="Local time the quiet hours start, e.g. 21:00.")
    end = models.TimeField(help_text="Local time they end, e.g. 08:00 (the next morning).")
    spread_minutes = models.PositiveSmallIntegerField(
        default=0, help_text="Held sends go out over this many minutes after the end."
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "quiet hours"
        verbose_name_plural = "quiet hours"

    def __str__(self) -> str:
        who = self.segment.slug if self.segment is not None else "every segment"
        return f"{who} / {self.channel}: {self.start:%H:%M}-{self.end:%H:%M}"


class QuietHoursChange(ChangeRecord):
    """One change of a quiet-hours entry."""

    quiet_hours = models.ForeignKey(
        QuietHours, on_delete=models.SET_NULL, null=True, blank=True, related_name="changes"
    )


class Topic(Authored):
    """What a marketing send is about (limits/topics.py): a person's preferences say which
    topics they want on which channels. Validated by `limits.topics.topic_problems`; written
    through `limits.services.TOPICS`, each change audited. Its slug never changes."""

    class Default(models.TextChoices):
        SUBSCRIBED = "subscribed", "subscribed: everyone gets it until they switch it off"
        UNSUBSCRIBED = "unsubscribed", "unsubscribed: only those who switch it on"
        REQUIRED = "required", "required: no preference can switch it off"

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, help_text="As people read it on their page.")
    description = models.TextField(blank=True)
    channels = models.JSONField(
        default=list, blank=True, help_text="The channels it is sent on; none: every channel."
    )
    default = models.CharField(max_length=16, choices=Default.choices, default=Default.SUBSCRIBED)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"


class TopicChange(ChangeRecord):
    """One change of a topic."""

    topic = models.ForeignKey(
        Topic, on_delete=models.SET_NULL, null=True, blank=True, related_name="changes"
    )


class QuotaReset(models.Model):
    """Audit record of an admin resetting one user's quota: who, when, why, and what was used."""

    user_id = models.PositiveBigIntegerField(help_text="The end user whose logs were forgotten.")
    segment_slug = models.CharField(max_length=64)
    usage = models.JSONField(default=dict, help_text="Per scope: daily and weekly used before.")
    reason = models.CharField(max_length=300)
    reset_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    reset_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-reset_at", "-id"]

    def __str__(self) -> str:
        return f"quota of user {self.user_id} reset at {self.reset_at:%Y-%m-%d %H:%M}"


# A send's outcome in the ledger, by the code it is stored as: a code is never reused or
# reordered, for rows written by every version are read by its position here.
LEDGER_OUTCOMES: tuple[str, ...] = ("", "sent", "failed", "ambiguous", "released")
LEDGER_OUTCOME_CODES: dict[str, int] = {name: code for code, name in enumerate(LEDGER_OUTCOMES)}


class OutcomeField(models.PositiveSmallIntegerField):
    """A send's outcome, read and written as its name ('' while unknown, or one of
    limits.reasons.OUTCOMES) and stored as its code in LEDGER_OUTCOMES: two bytes a row, not
    a string."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> str | None:
        return None if value is None else LEDGER_OUTCOMES[value]

    def to_python(self, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return LEDGER_OUTCOMES[int(value)]

    def get_prep_value(self, value: Any) -> int | None:
        if value is None or isinstance(value, int):
            return value
        try:
            return LEDGER_OUTCOME_CODES[str(value)]
        except KeyError:
            raise ValueError(
                f"unknown send outcome {value!r}; one of {', '.join(LEDGER_OUTCOMES[1:])}"
            ) from None


class LedgerKind(models.Model):
    """What decisions of the send ledger have in common, kept once however many share it: the
    gate call's own fields (channel, campaign, tags, priority, category, snapshot version,
    topic) and the decision's segment, reason and deciding rule. A blast's million decisions name a few
    dozen kinds. Found or added by the drain (limits/ledger/table.py) by `digest`; deleted by
    the ledger's upkeep once no day kept uses it (`last_day`)."""

    id = models.AutoField(primary_key=True)  # four bytes on each row that names it
    digest = models.CharField(max_length=40, unique=True, help_text="SHA-1 of the fields.")
    channel = models.CharField(max_length=32)
    campaign = models.CharField(max_length=200, blank=True)
    tags = models.JSONField(default=list, blank=True)
    priority = models.PositiveSmallIntegerField()
    category = models.CharField(max_length=16)
    snapshot_version = models.CharField(max_length=64, blank=True)
    segment = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=16)
    rule_id = models.IntegerField(null=True, blank=True, help_text="The deciding rule, if any.")
    topic = models.CharField(max_length=64, blank=True, help_text="What the sends were about.")
    experiment = models.IntegerField(
        null=True, blank=True, help_text="The running experiment the users were in, if any."
    )
    arm = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Their arm's place in that experiment."
    )
    last_day = models.DateField(help_text="The last UTC day a decision of this kind was kept.")

    def __str__(self) -> str:
        return f"{self.channel} {self.campaign} {self.segment} {self.reason}"


class LedgerEntry(models.Model):
    """One gate decision of a marketing send (or an exempt transactional one), kept durably:
    the send ledger (limits/ledger/). What it shares with other decisions is its `kind`; the
    row itself is when, who, the message and what became of it (about 90 bytes on PostgreSQL,
    indexes included; docs/ledger.md). On PostgreSQL the table is partitioned by day (`at`),
    old days are dropped whole, and `id` has no index (rows are found by user, and by time).
    Read through limits.ledger.table.decisions(), which puts the kind's fields and the message
    id back on each row."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(help_text="When the gate decided.")
    user_id = models.PositiveBigIntegerField()
    kind = models.ForeignKey(
        LedgerKind, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    outcome = OutcomeField(
        default="",
        help_text="What became of an admitted send, when known: sent, failed or ambiguous "
        "(dispatched by the worker), released (its quota given back before it went out).",
    )
    # NULL, not "": not stored but derived, and a NULL costs a row no byte.
    message_id = models.CharField(  # noqa: DJ001
        max_length=200,
        null=True,
        blank=True,
        help_text="Empty (NULL) when it is the campaign's own `<campaign>:<user id>`.",
    )

    class Meta:
        indexes = [models.Index(fields=["user_id"], name="limits_ledger_user")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.user_id} kind {self.kind_id}"


class LedgerCount(models.Model):
    """How many decisions of one kind the ledger took in one UTC hour: the decisions report and
    the dashboard's chart read these, never the ledger itself. Counted by the drain in the
    transaction that writes the decisions, so a count is exact."""

    hour = models.DateTimeField(help_text="The UTC hour's start.")
    channel = models.CharField(max_length=32)
    campaign = models.CharField(max_length=200, blank=True)
    segment = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=16)
    count = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "channel", "campaign", "segment", "reason"],
                name="limits_ledgercount_key",
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.hour:%Y-%m-%d %H}h {self.channel} {self.campaign} {self.reason}: {self.count}"
        )


class LedgerBatch(models.Model):
    """The id of a ledger stream entry already written, in the transaction that wrote it: a
    drainer that died before acknowledging the entry does not get it written twice."""

    stream_id = models.CharField(max_length=40, unique=True)
    drained_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return self.stream_id


class StreamBatch(models.Model):
    """A run of the event stream's events (limits/ledger/events.py), written by the drain in
    the transaction that writes what they tell of: a range of ledger rows (decisions), the rows
    that took an outcome, or a range of the suppression list's or preferences' journal. It names
    no one: an event is read from the row it points at, so an erasure or the ledger's upkeep
    that removes the row removes the event. Batches commit in the order of their ids (one
    drainer at a time), and a stream's position is a batch and a place in it."""

    class Source(models.IntegerChoices):
        DECISIONS = 1  # ledger rows `first` to `last`
        OUTCOMES = 2  # `refs`: per row that took an outcome, its id (8 bytes) and code (1)
        SUPPRESSION = 3  # SuppressionChange rows `first` to `last`
        PREFERENCES = 4  # PreferenceChange rows `first` to `last`

    id = models.BigAutoField(primary_key=True)
    source = models.PositiveSmallIntegerField(choices=Source.choices)
    first = models.BigIntegerField()
    last = models.BigIntegerField()
    # The decisions' earliest and latest time: their rows are read from those days only.
    since = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True)
    refs = models.BinaryField(null=True, blank=True)
    made_at = models.DateTimeField(db_index=True)

    class Meta:
        permissions = [("read_stream", "Can read the event stream of decisions and changes")]
        # Where the stream last took a journal up to: the newest batch of its source.
        indexes = [models.Index(fields=["source", "id"], name="limits_stream_source")]

    def __str__(self) -> str:
        return f"stream batch {self.pk} ({self.get_source_display()})"


class WebhookEndpoint(models.Model):
    """A company system the event stream is posted to (limits/ledger/webhooks.py): signed
    batches of the events its filters keep, from its own position in the stream, at least
    once; retried with backoff while it fails, and paused when it has failed for 3 days."""

    class State(models.TextChoices):
        ACTIVE = "active", "active"
        PAUSED = "paused", "paused by a person"
        FAILING = "failing", "paused: it kept failing"

    url = models.CharField(
        max_length=2000, help_text="Where the events are POSTed (http or https)."
    )
    description = models.CharField(max_length=500, blank=True)
    secret = models.CharField(
        max_length=100, help_text="whsec_ and the base64 key the signatures are made with."
    )
    types = models.JSONField(default=list, blank=True, help_text="Event types; empty: every one.")
    channels = models.JSONField(default=list, blank=True, help_text="Channels; empty: every one.")
    campaigns = models.JSONField(default=list, blank=True, help_text="Campaigns; empty: any.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    position = models.CharField(
        max_length=40, help_text="Where in the stream its next delivery starts."
    )
    delivered = models.PositiveBigIntegerField(default=0, help_text="Events it took.")
    failures = models.PositiveIntegerField(
        default=0, help_text="Attempts failed in a row (0: the last one went through)."
    )
    failing_since = models.DateTimeField(null=True, blank=True)
    next_at = models.DateTimeField(null=True, blank=True, help_text="Tried again then.")
    last_error = models.CharField(max_length=500, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A delivery run holds it until then."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url


class WebhookDelivery(models.Model):
    """One attempt to deliver a batch of events to an endpoint, kept a week: what an operator
    reads when an endpoint fails."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    at = models.DateTimeField(db_index=True)
    message_id = models.CharField(max_length=100, help_text="Its webhook-id header.")
    events = models.PositiveIntegerField()
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    milliseconds = models.PositiveIntegerField(help_text="How long the endpoint took.")

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.message_id}: {'ok' if self.ok else 'failed'}"


class Suppression(models.Model):
    """A user who must get no marketing on a channel (or on any channel: `all`): they opted out,
    their address bounced for good, or they complained. The gate refuses their marketing sends
    with reason `suppressed` before any cap is asked (limits/suppression.py). Changed only
    through limits/suppression.py, which journals every change in SuppressionChange."""

    class Reason(models.TextChoices):
        UNSUBSCRIBED = "unsubscribed", "unsubscribed"
        BOUNCED = "bounced", "hard bounce"
        COMPLAINED = "complained", "complaint"
        MANUAL = "manual", "added by hand"

    channel = models.CharField(max_length=32, validators=[validate_scope])
    user_id = models.PositiveBigIntegerField()
    reason = models.CharField(max_length=16, choices=Reason.choices)
    source = models.CharField(
        max_length=64,
        blank=True,
        help_text="Where it came from: link, api, admin, import, esp:<name>.",
    )
    note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "user_id"], name="limits_suppression_key")
        ]
        indexes = [models.Index(fields=["user_id"], name="limits_suppression_user")]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"user {self.user_id} on {self.channel}: {self.reason}"


class SuppressionChange(models.Model):
    """One suppression added or removed, in commit order (writers take SuppressionLock first):
    every process keeps the suppression list in memory and reads the changes after the last
    one it has, every few seconds. Also the list's audit trail."""

    class Action(models.TextChoices):
        ADDED = "added"
        REMOVED = "removed"

    id = models.BigAutoField(primary_key=True)
    channel = models.CharField(max_length=32)
    user_id = models.PositiveBigIntegerField()
    action = models.CharField(max_length=8, choices=Action.choices)
    reason = models.CharField(max_length=16, blank=True)
    source = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"user {self.user_id} on {self.channel}: {self.action}"


class SuppressionLock(models.Model):
    """One row that every suppression write locks first, so that changes commit in the order
    of their ids and a reader that has seen change N has seen every change before it."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)

    def __str__(self) -> str:
        return "suppression lock"


class Preference(models.Model):
    """A person's own say over their marketing (limits/preferences.py): per topic and channel
    subscribed or not, per channel on or off, a pause of all marketing until an instant and of
    single channels, their own frequency per channel. One row per person who said anything;
    written through limits.preferences, each change journaled in PreferenceChange."""

    user_id = models.PositiveBigIntegerField(unique=True)
    topics = models.JSONField(default=dict, blank=True, help_text='{"topic": {"channel": bool}}')
    channels = models.JSONField(default=dict, blank=True, help_text='{"channel": bool}')
    paused_until = models.DateTimeField(null=True, blank=True)
    paused_channels = models.JSONField(
        default=dict, blank=True, help_text='{"channel": "ISO 8601 instant"}'
    )
    frequency = models.JSONField(
        default=list, blank=True, help_text='[{"channel", "window", "limit"}]: their own'
    )
    # How long the logs must keep entries for their own frequency to count (0: none); the
    # longest of all is read with the rules (limits.selectors.policy_read).
    keeps_seconds = models.PositiveIntegerField(default=0)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["keeps_seconds"],
                name="preference_keeps",
                condition=models.Q(keeps_seconds__gt=0),
            )
        ]

    def __str__(self) -> str:
        return f"preferences of user {self.user_id}"


class PreferenceChange(models.Model):
    """One change of a person's preferences, in commit order (writers take PreferenceLock
    first): what they were and became, where it came from. Processes read the changes after
    the last one they have; also the person's history of changes."""

    user_id = models.PositiveBigIntegerField()
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=64, help_text="api, import, page or admin.")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["user_id", "id"], name="limits_prefchange_user")]
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"preferences of user {self.user_id} changed ({self.source})"


class PreferenceLock(models.Model):
    """One row that every preference write locks first, so that changes commit in the order
    of their ids (as SuppressionLock does for the suppression list)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)

    def __str__(self) -> str:
        return "preference lock"


class Holdout(models.Model):
    """The global control group (limits/holdout.py): one row. A share of users, chosen by a
    keyed hash of their id under `salt` (limits.assignment), gets no marketing; users of the
    excluded segments and sends carrying an excluded tag are never held out. A share of 0: no
    group."""

    share = models.FloatField(default=0.0)
    salt = models.CharField(max_length=64)
    exclude_segments = models.JSONField(default=list, blank=True)
    exclude_tags = models.JSONField(default=list, blank=True)
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    def __str__(self) -> str:
        return f"control group of {self.share:.1%}"


class WholeChange(models.Model):
    """One change of a thing kept whole (the control group, an experiment): what it was and
    became, who made it and how, newest first."""

    before = models.JSONField(null=True, blank=True)
    after = models.JSONField()
    via = models.CharField(max_length=16, help_text="api or admin.")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-id"]


class HoldoutChange(WholeChange):
    """One change of the control group."""

    def __str__(self) -> str:
        return f"control group changed ({self.via})"


class Experiment(models.Model):
    """A cap experiment (limits/experiments.py): the users of one segment (or of every segment)
    split by a keyed hash of their id under `salt` into 2 to 5 arms, each with rules that
    replace or add to the segment's own, from `starts_at` to `ends_at`. `state` is what a person
    did (active, stopped, concluded); the status shown also reads the clock (scheduled,
    running, ended)."""

    class State(models.TextChoices):
        ACTIVE = "active"
        STOPPED = "stopped"
        CONCLUDED = "concluded"

    name = models.CharField(max_length=100)
    segment = models.ForeignKey(
        Segment,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="experiments",
        help_text="Empty: every segment.",
    )
    salt = models.CharField(max_length=64)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    stopped_at = models.DateTimeField(null=True, blank=True)
    concluded_arm = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["state", "ends_at"], name="limits_experiment_live")]

    def __str__(self) -> str:
        return self.name


class ExperimentArm(models.Model):
    """One arm of an experiment: its share of the users and its rules (the REST API's rule
    shape without a segment: the experiment's), replacing the segment's own rules on the
    channels they name (`replace`) or added to them (`add`)."""

    class Mode(models.TextChoices):
        REPLACE = "replace"
        ADD = "add"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="arms")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    share = models.FloatField()
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.REPLACE)
    rules = models.JSONField(default=list)

    class Meta:
        ordering = ["experiment", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "position"], name="limits_one_arm_per_position"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ExperimentChange(WholeChange):
    """One change of an experiment (created, changed, stopped, concluded), in words too."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="changes")
    action = models.CharField(max_length=16)
    words = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.experiment_id} {self.action} ({self.via})"


class StudyMember(models.Model):
    """A user in a study (a cap experiment, or the global control group: `study` 0) since
    their first marketing decision while it ran (limits/studies.py): their arm (an experiment's
    arm's place; the control group's 0 for held out, 1 for its treatment sample) and bucket
    (limits.lift). One row per user and study, never per decision."""

    pk = models.CompositePrimaryKey("study", "user_id")
    study = models.IntegerField()
    user_id = models.PositiveBigIntegerField()
    arm = models.PositiveSmallIntegerField()
    bucket = models.PositiveSmallIntegerField()
    entered = models.DateField(help_text="The UTC day of their first decision in it.")

    def __str__(self) -> str:
        return f"{self.user_id} in study {self.study}, arm {self.arm}"


class StudyCell(models.Model):
    """One UTC day of one bucket of one arm of a study (limits/studies.py): what the report
    sums over days and reads by bucket (limits.lift)."""

    study = models.IntegerField()
    day = models.DateField()
    arm = models.PositiveSmallIntegerField()
    bucket = models.PositiveSmallIntegerField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"study {self.study} {self.day} arm {self.arm} bucket {self.bucket}"


class StudyDay(StudyCell):
    """Users who entered, marketing sends admitted, unsubscribes and complaints of a study's
    members, a day, arm and bucket at a time."""

    entered = models.BigIntegerField(default=0, db_default=0)
    sends = models.BigIntegerField(default=0, db_default=0)
    unsubscribes = models.BigIntegerField(default=0, db_default=0)
    complaints = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["study", "day", "arm", "bucket"], name="limits_one_study_day"
            ),
        ]


class StudyEvent(StudyCell):
    """The outcome events of one name a study's members had (POST /api/v1/events/), how many
    and their value, a day, arm and bucket at a time. Events are kept this way only, never one
    by one."""

    name = models.CharField(max_length=64)
    count = models.BigIntegerField(default=0, db_default=0)
    value = models.FloatField(default=0.0, db_default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["study", "day", "arm", "bucket", "name"], name="limits_one_study_event"
            ),
        ]


class EventSeen(models.Model):
    """An outcome event's id, as a 63-bit hash, for as long as a repeat of it must count once
    (GATEKEEPER_EVENTS_DEDUP_DAYS)."""

    key = models.BigIntegerField(primary_key=True)
    day = models.DateField(db_index=True)

    def __str__(self) -> str:
        return f"event {self.key} ({self.day})"


class Erasure(models.Model):
    """A request to erase people everywhere (GDPR article 17): who asked, when, how many, how
    far it got; their ids only until it is done (limits/ledger/erasure.py), never whom after."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running", "running: some places are done, the rest follow"
        WAITING = "waiting", "waiting: for its second pass, or for sends being made now to end"
        DONE = "done"

    requested_at = models.DateTimeField(auto_now_add=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    via = models.CharField(max_length=16, help_text="api or command.")
    count = models.PositiveIntegerField(help_text="How many people it erases.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    users = models.BinaryField(
        null=True, blank=True, help_text="Their ids (8 bytes each) while it runs; then nothing."
    )
    places_done = models.JSONField(default=list, blank=True, help_text="Places erased so far.")
    removed = models.JSONField(
        default=dict, blank=True, help_text="Per place: rows, entries or records removed."
    )
    waiting = models.PositiveIntegerField(
        default=0, help_text="Send-job records left until the sends being made finish."
    )
    passes = models.PositiveSmallIntegerField(default=0, help_text="Passes over every place made.")
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A run holds it until then."
    )
    next_at = models.DateTimeField(null=True, blank=True, help_text="When it is tried again.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("erase_users", "Can erase people's data everywhere")]

    def __str__(self) -> str:
        return f"erasure {self.pk} of {self.count} people ({self.status})"


class ErasedPerson(models.Model):
    """An erased person, kept as a keyed hash of their id (limits.suppression.erased_key): the
    gate refuses them on every channel, and nothing else of them is kept."""

    id = models.BigAutoField(primary_key=True)  # the order processes read them in
    key = models.BigIntegerField(unique=True)
    erased_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"erased person {self.key:x}"


class ErasureKey(models.Model):
    """The key erased people's ids are hashed with (limits.suppression.erased_keys): made once,
    at random, the first time it is needed, and never changed, so that rotating SECRET_KEY
    forgets no erasure. GATEKEEPER_ERASURE_KEY, when set, is used instead."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    key = models.CharField(max_length=64)

    def __str__(self) -> str:
        return "the erasure key"
