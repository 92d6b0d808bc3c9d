"""Erasures, the erased people as keyed hashes, and the key."""

from django.conf import settings
from django.db import models


class Erasure(models.Model):
    """A request to erase people everywhere (GDPR article 17): who asked, when, how many, how
    far it got; their ids only until it is done (limits/privacy/erasure.py), never whom after."""

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
    """An erased person, kept as a keyed hash of their id (limits.people.suppression.erased_key):
    the gate refuses them on every channel, and nothing else of them is kept."""

    id = models.BigAutoField(primary_key=True)  # the order processes read them in
    key = models.BigIntegerField(unique=True)
    erased_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"erased person {self.key:x}"


class ErasureKey(models.Model):
    """The key erased people's ids are hashed with (limits.people.suppression.erased_keys): made
    once, at random, the first time it is needed, and never changed, so that rotating SECRET_KEY
    forgets no erasure. GATEKEEPER_ERASURE_KEY, when set, is used instead."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    key = models.CharField(max_length=64)

    def __str__(self) -> str:
        return "the erasure key"
