"""What people say: the suppression list and preferences, each with
its journal (in commit order) and the lock its writers take."""

from django.conf import settings
from django.db import models

from limits.channels import validate_scope


class Suppression(models.Model):
    """A user who must get no marketing on a channel (or on any channel: `all`): they opted out,
    their address bounced for good, or they complained. The gate refuses their marketing sends
    with reason `suppressed` before any cap is asked (limits/people/suppression.py). Changed only
    through limits/people/suppression.py, which journals every change in SuppressionChange."""

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
    """A person's own say over their marketing (limits/people/preferences.py): per topic and channel
    subscribed or not, per channel on or off, a pause of all marketing until an instant and of
    single channels, their own frequency per channel. One row per person who said anything;
    written through limits.people.preferences, each change journaled in PreferenceChange."""

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
    # longest of all is read with the rules (limits.policy.selectors.policy_read).
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
