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
        constraints = [
            models.UniqueConstraint(fields=["segment", "channel"], name="limits_one_cap_per_scope"),
        ]

    def __str__(self) -> str:
        return f"{self.segment.slug} / {self.channel}"
