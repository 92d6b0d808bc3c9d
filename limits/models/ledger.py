"""The ledger's tables: every decision (day-partitioned on
PostgreSQL), what decisions share (kinds), the hourly counts, the stream entries written."""

from typing import Any

from django.db import models

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
    topic) and the decision's segment, reason, deciding rule, experiment arm, the time zone
    its request named and the send job that outranked it in a round. A blast's million decisions name a few dozen kinds. Found or added by
    the drain (limits/ledger/table.py) by `digest`; deleted by the ledger's upkeep once no day
    kept uses it (`last_day`)."""

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
    zone = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",  # an older process's INSERT leaves the column out
        help_text="The zone the requests named for their users; empty: none, so the segment's, "
        "else the setting's.",
    )
    # A round's outranked decisions: one kind per job that won the users' slots, so kinds stay
    # few. NULL on every other (and an older process's INSERT leaves the column out).
    outranked_by = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="On reason outranked: the send job a round gave the users' slots to.",
    )
    last_day = models.DateField(help_text="The last UTC day a decision of this kind was kept.")

    def __str__(self) -> str:
        return f"{self.channel} {self.campaign} {self.segment} {self.reason}"


class LedgerEntry(models.Model):
    """One gate decision of a marketing send (or an exempt transactional one), kept durably:
    the send ledger (limits/ledger/). What it shares with other decisions is its `kind`; the
    row itself is when, who, the message and what became of it, and on an outranked decision
    what the send that outranked it was worth to the user (about 90 bytes on PostgreSQL,
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
    # NULL on every decision but an outranked one: no byte (the row's null bitmap is there
    # already, or fits in its header's padding), and on PostgreSQL's partitioned table a
    # column added without a default changes no stored row.
    value = models.FloatField(
        null=True,
        blank=True,
        help_text="On reason outranked: what the send of the job that outranked it was worth "
        "to the user (its kind names the job).",
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
