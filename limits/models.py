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
