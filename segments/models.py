from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.signals import pre_delete
from django.dispatch import receiver
from django.utils import timezone

from gatekeeper.lib.words import count
from gatekeeper.lib.zones import validate_time_zone

DEFAULT_SEGMENT_SLUG = "default"


class Segment(models.Model):
    """A group of users that shares one set of caps.

    Segments are mutually exclusive: a user in several segments' lists belongs to the one with
    the lowest `priority` number. Users in no list belong to the default segment.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    priority = models.IntegerField(
        unique=True, help_text="Lower wins: a user in several lists belongs to the lowest number."
    )
    description = models.TextField(blank=True)
    time_zone = models.CharField(
        max_length=64,
        blank=True,
        validators=[validate_time_zone],
        help_text="Its users' IANA time zone when a send names none (calendar windows, quiet "
        "hours). Empty: GATEKEEPER_DEFAULT_TIME_ZONE.",
    )
    is_default = models.BooleanField(
        default=False, editable=False, help_text="Users in no list belong to this segment."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="segments_one_default_segment",
            )
        ]

    def __str__(self) -> str:
        return self.name


class DefaultSegmentProtected(ValidationError):
    pass


@receiver(pre_delete, sender=Segment)
def _protect_default_segment(sender: type[Segment], instance: Segment, **kwargs: object) -> None:
    # A signal, not an overridden delete(): it also guards queryset deletes and admin bulk deletes.
    if instance.is_default:
        raise DefaultSegmentProtected(
            f"The default segment '{instance.slug}' cannot be deleted: "
            "users in no list belong to it."
        )


class UserList(models.Model):
    """One uploaded file of user ids (one a line) that puts its users in a segment.

    A list is `ready` once every line was validated; only ready lists go into builds. A large
    upload is stored as `validating` and checked by a Celery task (the web process validates
    only the first GATEKEEPER_USER_LIST_INLINE_BYTES itself); a bad one ends `failed`, with
    the reason and the line kept and its file deleted.
    """

    class Status(models.TextChoices):
        READY = "ready"
        VALIDATING = "validating"
        FAILED = "failed"

    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="user_lists")
    file = models.FileField(upload_to="user-lists/%Y/%m/", blank=True)
    original_name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.READY)
    error = models.TextField(blank=True, help_text="Why a failed list was refused.")
    error_line = models.PositiveBigIntegerField(null=True, blank=True)
    checked_at = models.DateTimeField(
        null=True, blank=True, help_text="While validating: the last sign of progress."
    )
    replaces_others = models.BooleanField(
        default=False, help_text="Once ready, it replaces the segment's lists uploaded before it."
    )
    line_count = models.PositiveBigIntegerField(
        default=0, help_text="Lines read: the header, blank lines and repeats included."
    )
    header_lines = models.PositiveSmallIntegerField(default=0)
    listed_ids = models.PositiveBigIntegerField(
        default=0, help_text="Lines holding an id, repeats included."
    )
    id_count = models.PositiveBigIntegerField(default=0, help_text="Distinct user ids.")
    size_bytes = models.PositiveBigIntegerField(default=0)
    uploaded_at = models.DateTimeField(auto_now_add=True)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )

    class Meta:
        ordering = ["segment__priority", "-uploaded_at"]

    def __str__(self) -> str:
        return f"{self.original_name} ({count(self.id_count, 'user')})"

    @property
    def blank_lines(self) -> int:
        if self.status != self.Status.READY:
            return 0  # counted once every line was read
        return max(0, self.line_count - self.header_lines - self.listed_ids)

    @property
    def repeated_ids(self) -> int:
        if self.status != self.Status.READY:
            return 0
        return max(0, self.listed_ids - self.id_count)

    @property
    def lines_explained(self) -> str:
        """Why the lines and the users differ, in words: "1,004 lines: a header, 1 blank line,
        2 repeated ids"."""
        parts = ["a header"] if self.header_lines else []
        if self.blank_lines:
            parts.append(count(self.blank_lines, "blank line"))
        if self.repeated_ids:
            parts.append(count(self.repeated_ids, "repeated id"))
        lines = count(self.line_count, "line")
        return f"{lines}: {', '.join(parts)}" if parts else lines


class Build(models.Model):
    """One run of the snapshot build: user lists -> bitmaps -> a published version."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    # A build whose worker has not reported for this long is taken for dead (killed, lost).
    LEASE = timedelta(minutes=10)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.PositiveSmallIntegerField(default=0, help_text="Percent done.")
    stage = models.CharField(max_length=200, blank=True)
    version = models.CharField(max_length=64, blank=True, help_text="Published snapshot version.")
    stats = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per segment: listed, cardinality, lost_to_higher_priority, bytes, sha256.",
    )
    total_users = models.PositiveBigIntegerField(default=0)
    snapshot_bytes = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("publish_snapshot", "Can build, publish and roll back snapshots")]

    def __str__(self) -> str:
        return f"Build #{self.pk} ({self.status})"

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None

    @property
    def state(self) -> str:
        """The status as people should read it: a queued or running build whose worker stopped
        reporting is "stalled" (the next build gives it up)."""
        if self.status in (self.Status.QUEUED, self.Status.RUNNING) and not self.is_alive():
            return "stalled"
        return str(self.status)

    def is_alive(self, now: datetime | None = None) -> bool:
        """Queued or running, and heard from within LEASE: a build whose worker stopped
        reporting (killed, lost) is not, and the next build_start gives it up. The admin and
        build_start both judge builds by this."""
        if self.status not in (self.Status.QUEUED, self.Status.RUNNING):
            return False
        last_sign = self.heartbeat_at or self.created_at
        return (now or timezone.now()) - last_sign < self.LEASE
