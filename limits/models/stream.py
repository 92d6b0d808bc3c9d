"""The event stream's tables: its batches, the webhook endpoints and
their deliveries."""

from django.conf import settings
from django.db import models


class StreamBatch(models.Model):
    """A run of the event stream's events (limits/stream/events.py), written by the drain in
    the transaction that writes what they tell of: a range of ledger rows (decisions), the rows
    that took an outcome, or a range of a journal (the suppression list's, preferences', the
    dead addresses' the worker keeps). It names
    no one: an event is read from the row it points at, so an erasure or the ledger's upkeep
    that removes the row removes the event. Batches commit in the order of their ids (one
    drainer at a time), and a stream's position is a batch and a place in it."""

    class Source(models.IntegerChoices):
        DECISIONS = 1  # ledger rows `first` to `last`
        OUTCOMES = 2  # `refs`: per row that took an outcome, its id (8 bytes) and code (1)
        SUPPRESSION = 3  # SuppressionChange rows `first` to `last`
        PREFERENCES = 4  # PreferenceChange rows `first` to `last`
        # DeadAddress rows `first` to `last`: the worker's journal, registered with the stream
        # (limits.stream.events.journal_register), which imports nothing of the worker.
        DEAD_ADDRESSES = 5

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
    """A company system the event stream is posted to (limits/stream/webhooks.py): signed
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
