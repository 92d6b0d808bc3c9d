"""The studies' tables: cap experiments with their arms (their history is the settings' one),
and what a study measures (members, days, outcome events, the event ids seen)."""

from django.conf import settings
from django.db import models

from segments.models import Segment


class Experiment(models.Model):
    """A cap experiment (limits/studies/experiments.py): the users of one segment (or of every
    segment) split by a keyed hash of their id under `salt` into 2 to 5 arms, each with rules that
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


class StudyMember(models.Model):
    """A user in a study (a cap experiment, or the global control group: `study` 0) since
    their first marketing decision while it ran (limits/studies/measures.py): their arm (an
    experiment's arm's place; the control group's 0 for held out, 1 for its treatment sample) and
    bucket (limits.studies.lift). One row per user and study, never per decision."""

    pk = models.CompositePrimaryKey("study", "user_id")
    study = models.IntegerField()
    user_id = models.PositiveBigIntegerField()
    arm = models.PositiveSmallIntegerField()
    bucket = models.PositiveSmallIntegerField()
    entered = models.DateField(help_text="The UTC day of their first decision in it.")

    def __str__(self) -> str:
        return f"{self.user_id} in study {self.study}, arm {self.arm}"


class StudyCell(models.Model):
    """One UTC day of one bucket of one arm of a study (limits/studies/measures.py): what the report
    sums over days and reads by bucket (limits.studies.lift)."""

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
