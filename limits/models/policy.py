"""The policy's tables: caps, the authored rules, quiet hours and topics, quota resets, the
control group, and the one history of every setting's changes (`SettingChange`)."""

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

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


class Rule(Authored):
    """A cap rule: for the users of one segment (or of every segment), on one channel (or all
    channels together), count the marketing sends that match over a window and admit at most
    `limit`. Validated by `limits.policy.rules.rule_problems`; written through
    `limits.policy.services`.

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


class QuietHours(Authored):
    """Quiet hours: the local times at which the users of one segment (or of every segment)
    get no marketing on one channel (or `all` channels), and the spread over which sends held
    until the end go out. Validated by `limits.engine.quiet.quiet_problems`; written through
    `limits.policy.services`, each change audited."""

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


class Topic(Authored):
    """What a marketing send is about (limits/engine/topics.py): a person's preferences say which
    topics they want on which channels. Validated by `limits.engine.topics.topic_problems`; written
    through `limits.policy.services.TOPICS`, each change audited. Its slug never changes."""

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


class Holdout(models.Model):
    """The global control group (limits/policy/holdout.py): one row. A share of users, chosen by a
    keyed hash of their id under `salt` (limits.engine.assignment), gets no marketing; users of the
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


class SettingChange(models.Model):
    """One change of a setting, whatever its kind (caps, rules, quiet hours, topics, the control
    group, experiments, webhook endpoints): written by limits.policy.authored in the same
    transaction as the change, the one history every admin page and report reads. What the
    object read as (`object_label`) and its JSON before and after (as the REST API shows it,
    secrets left out) are kept after the object is deleted; `object_id` is empty for a
    singleton (the control group)."""

    class Kind(models.TextChoices):
        CAP = "cap", "cap"
        RULE = "rule", "rule"
        QUIET_HOURS = "quiet_hours", "quiet hours"
        TOPIC = "topic", "topic"
        CONTROL_GROUP = "control_group", "control group"
        EXPERIMENT = "experiment", "experiment"
        WEBHOOK = "webhook", "webhook endpoint"
        MAILBOX_PROVIDER = "mailbox_provider", "mailbox provider"
        WARMUP = "warmup", "warm-up plan"
        SENDING_DOMAIN = "sending_domain", "sending domain"

    class Action(models.TextChoices):
        CREATED = "created"
        CHANGED = "changed"
        DELETED = "deleted"
        STOPPED = "stopped"
        CONCLUDED = "concluded"
        SECRET_ROTATED = "secret_rotated", "given a new secret"
        PAUSED = "paused"
        RESUMED = "resumed"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    object_id = models.BigIntegerField(null=True, blank=True, help_text="Empty: a singleton.")
    object_label = models.CharField(max_length=200, help_text="What it read as at the change.")
    action = models.CharField(max_length=16, choices=Action.choices)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    words = models.TextField(blank=True, help_text="The change in plain words.")
    via = models.CharField(max_length=16, help_text="admin, api or command (or what made it).")
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["kind", "object_id", "-at"], name="limits_change_of_object"),
            models.Index(fields=["-at"], name="limits_change_at"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.object_label}: {self.action}"
