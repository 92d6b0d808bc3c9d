"""Answer shapes of the ledger's REST views: a user's history and the decisions report."""

from typing import Any

from rest_framework import serializers

from limits.ledger.reports import GROUPS
from limits.reasons import CATEGORIES, REASONS


class HistoryRuleSerializer(serializers.Serializer):
    """The rule that decided (its id in GET /api/v1/rules/); name, description and classic
    are null once the rule is deleted."""

    id = serializers.IntegerField(
        help_text="0: the person's own frequency; below 0: a rule of an experiment's arm."
    )
    name = serializers.CharField(allow_null=True)
    description = serializers.CharField(allow_null=True, help_text="The rule in plain words.")
    classic = serializers.BooleanField(
        allow_null=True, help_text="One of a classic cap's two rules."
    )


class HistoryExperimentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    arm = serializers.CharField(allow_null=True, help_text="null once the experiment is gone.")


class HistoryOutrankedSerializer(serializers.Serializer):
    """The send job a round gave the user's slot to, on a decision outranked there."""

    job = serializers.IntegerField(help_text="The send job that won the slot (its id).")
    value = serializers.FloatField(help_text="What that job's send was worth to the user.")
    description = serializers.CharField(
        help_text="In words: 'Outranked by job 12, worth 3.5 to them.'"
    )


class HistoryDecisionSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="When the gate decided (UTC).")
    channel = serializers.CharField()
    campaign = serializers.CharField(allow_blank=True)
    category = serializers.ChoiceField(choices=CATEGORIES)
    tags = serializers.ListField(child=serializers.CharField())
    priority = serializers.IntegerField()
    topic = serializers.CharField(
        allow_null=True, help_text="What the send was about (a topic's slug); null: no topic."
    )
    zone = serializers.CharField(
        allow_null=True,
        help_text="The time zone the request named for the user (an IANA zone); null: none, so "
        "the segment's, else the setting's.",
    )
    segment = serializers.CharField(allow_null=True)
    snapshot_version = serializers.CharField(allow_null=True)
    reason = serializers.ChoiceField(choices=REASONS)
    rule = HistoryRuleSerializer(
        allow_null=True, help_text="The rule that decided a refusal; null otherwise."
    )
    message_id = serializers.CharField()
    outcome = serializers.CharField(
        allow_null=True,
        help_text="What became of an admitted send, when known: sent, failed, ambiguous "
        "(dispatched by the worker) or released (its quota given back). null: not known.",
    )
    experiment = HistoryExperimentSerializer(
        allow_null=True,
        help_text="The running experiment the user was in, and their arm; null: none.",
    )
    # Not required: a web of the release before rounds answers without it.
    outranked_by = HistoryOutrankedSerializer(
        allow_null=True,
        required=False,
        help_text="On reason outranked: the send job a round chose for the user instead, and "
        "what its send was worth to them; null otherwise.",
    )


class HistorySerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    results = HistoryDecisionSerializer(many=True, help_text="Newest first.")
    next = serializers.URLField(
        allow_null=True, help_text="The next (older) page, with the same filters; null: no more."
    )


class DecisionsRowSerializer(serializers.Serializer):
    """One combination of the grouped fields (only those grouped by are there) and its count."""

    day = serializers.DateField(required=False, help_text="A UTC day.")
    campaign = serializers.CharField(required=False, help_text="Empty: decisions of no campaign.")
    segment = serializers.CharField(
        required=False, help_text="Empty: decided without a snapshot (unavailable)."
    )
    channel = serializers.CharField(required=False)
    reason = serializers.ChoiceField(choices=list(REASONS), required=False)
    count = serializers.IntegerField(min_value=0)


class DecisionsReportSerializer(serializers.Serializer):
    from_ = serializers.DateField(help_text="The first UTC day counted.")
    to = serializers.DateField(help_text="The last UTC day counted (included).")
    group_by = serializers.ListField(
        child=serializers.ChoiceField(choices=list(GROUPS)),
        help_text="The grouped fields, in the order of each row's keys and of the rows.",
    )
    results = DecisionsRowSerializer(many=True)

    def get_fields(self) -> dict[str, Any]:
        # `from` is a keyword in Python and a field's name in the answer.
        return {"from" if name == "from_" else name: f for name, f in super().get_fields().items()}
