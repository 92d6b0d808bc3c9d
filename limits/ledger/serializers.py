"""Answer shapes of the ledger's REST views: a user's history and the decisions report."""

from typing import Any

from rest_framework import serializers

from limits.ledger.events import EVENT_TYPES
from limits.ledger.personal import places
from limits.ledger.reports import GROUPS
from limits.reasons import CATEGORIES, REASONS
from limits.serializers import PreferencesSerializer


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


class ExportSegmentSerializer(serializers.Serializer):
    slug = serializers.CharField()
    snapshot_version = serializers.CharField()


class ExportLogEntrySerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="When the send was recorded (UTC).")
    channel = serializers.CharField()
    counted = serializers.BooleanField(
        help_text="false: a send job's transactional send, kept only to claim its message id."
    )
    message_hash = serializers.CharField(help_text="7 bytes of the message id's hash (hex).")
    campaign_hash = serializers.CharField(
        allow_null=True, help_text="4 bytes of the campaign's hash (hex); null: no campaign."
    )
    tag_hashes = serializers.ListField(child=serializers.CharField(), help_text="Hex.")
    priority = serializers.IntegerField()
    job_holder = serializers.IntegerField(
        allow_null=True, help_text="The send job whose run recorded it (its id below 2^28)."
    )


class ExportSuppressionSerializer(serializers.Serializer):
    channel = serializers.CharField(help_text="A channel, or all.")
    reason = serializers.CharField()
    source = serializers.CharField()  # type: ignore[assignment]  # a field named source
    note = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()


class ExportSuppressionChangeSerializer(serializers.Serializer):
    channel = serializers.CharField()
    action = serializers.CharField(help_text="added or removed.")
    reason = serializers.CharField(allow_null=True)
    source = serializers.CharField(allow_null=True)  # type: ignore[assignment]  # a field named source
    at = serializers.DateTimeField()


class ExportPreferenceChangeSerializer(serializers.Serializer):
    before = PreferencesSerializer(allow_null=True, help_text="null: nothing said before.")
    after = PreferencesSerializer(allow_null=True, help_text="null: nothing said after.")
    source = serializers.CharField(help_text="api, import, page or admin.")  # type: ignore[assignment]  # a field named source
    at = serializers.DateTimeField()


class ExportQuotaResetSerializer(serializers.Serializer):
    segment = serializers.CharField()
    usage = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField(allow_null=True)),
        help_text="Per scope: daily and weekly used before.",
    )
    reason = serializers.CharField()
    at = serializers.DateTimeField()


class ExportStudySerializer(serializers.Serializer):
    experiment = serializers.IntegerField(
        allow_null=True, help_text="The cap experiment's id; null: the global control group."
    )
    arm = serializers.IntegerField(
        help_text="An experiment's arm by place; the control group: 0 held out, 1 its "
        "treatment sample."
    )
    entered = serializers.DateField(help_text="The UTC day of their first decision in it.")


class ExportPreferencesSerializer(PreferencesSerializer):
    """A person's preferences in their export: as GET /api/v1/users/<id>/preferences/ answers
    them, without the id (the document's head has it), so that a PUT of them reads the same."""

    user_id = None  # type: ignore[assignment]  # DRF: a field declared None is removed


class ExportSerializer(serializers.Serializer):
    """Everything held about one person: the fixed head, then one field per place of
    limits.ledger.personal (the registry says which, and each place its shape)."""

    format = serializers.IntegerField(help_text="The document's version (1).")
    user_id = serializers.IntegerField()
    exported_at = serializers.DateTimeField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        for place in places():
            field = place.shape()
            field.help_text = place.words
            fields[place.key] = field
        return fields


class ErasureSerializer(serializers.Serializer):
    """An erasure: who asked, when, how many, how far it got; never whom."""

    id = serializers.IntegerField()
    url = serializers.URLField(help_text="This erasure: GET it to follow its progress.")
    status = serializers.ChoiceField(
        choices=["queued", "running", "waiting", "done"],
        help_text="waiting: for its second pass (30 s after the first), or for sends being "
        "made to these people now to end.",
    )
    count = serializers.IntegerField(help_text="How many people it erases.")
    requested_at = serializers.DateTimeField()
    requested_by = serializers.CharField(allow_null=True, help_text="The account that asked.")
    via = serializers.CharField(help_text="api or command.")
    progress = serializers.FloatField(help_text="Percent of the places erased, both passes.")
    removed = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Per place (the keys of a person's export): rows, entries or records removed.",
    )
    waiting = serializers.IntegerField(
        help_text="Send-job records left until the sends being made to them end."
    )
    finished_at = serializers.DateTimeField(allow_null=True)


class StreamEventSerializer(serializers.Serializer):
    """One event of the stream. Every event has `id`, `type`, `at` and `user_id`; the other
    fields are its type's (docs/api.md, "The event stream", lists them)."""

    id = serializers.CharField(
        help_text="The same for the same event, however often it is delivered: d<row> a "
        "decision, o<row>.<outcome> its outcome, s<change> a suppression change, p<change> a "
        "preferences change."
    )
    type = serializers.ChoiceField(choices=sorted(EVENT_TYPES))
    at = serializers.DateTimeField(
        help_text="When the gate decided; for an outcome, when the ledger took it; for a "
        "change, when it was made."
    )
    user_id = serializers.IntegerField()
    channel = serializers.CharField(required=False, help_text="Not in preferences changes.")
    campaign = serializers.CharField(required=False, help_text="Decisions and outcomes.")
    message_id = serializers.CharField(required=False, help_text="Decisions and outcomes.")
    reason = serializers.CharField(
        required=False, help_text="A decision's reason; a suppression's (unsubscribed, ...)."
    )
    rule_id = serializers.IntegerField(required=False, allow_null=True)
    segment = serializers.CharField(required=False)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    priority = serializers.IntegerField(required=False)
    category = serializers.ChoiceField(choices=CATEGORIES, required=False)
    topic = serializers.CharField(required=False)
    snapshot_version = serializers.CharField(required=False)
    experiment = serializers.IntegerField(required=False, allow_null=True)
    arm = serializers.IntegerField(required=False, allow_null=True)
    decision = serializers.CharField(required=False, help_text="An outcome's decision event id.")
    decided_at = serializers.DateTimeField(required=False, help_text="An outcome's decision.")
    outcome = serializers.ChoiceField(
        choices=["sent", "failed", "ambiguous", "released"], required=False
    )
    action = serializers.ChoiceField(choices=["added", "removed"], required=False)
    source = serializers.CharField(  # type: ignore[assignment]  # the field, not its source
        required=False, help_text="Where a change came from."
    )
    preferences = serializers.DictField(
        required=False, allow_null=True, help_text="The person's preferences after the change."
    )


class StreamPageSerializer(serializers.Serializer):
    events = StreamEventSerializer(many=True)
    next = serializers.CharField(
        help_text="The position after these events: pass it as `after` to read on."
    )
    more = serializers.BooleanField(
        help_text="Whether the stream held more after `next` when this was read (false: you "
        "are at its end; ask again later)."
    )


class WebhookDeliverySerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    message_id = serializers.CharField(help_text="The request's webhook-id.")
    events = serializers.IntegerField()
    ok = serializers.BooleanField(help_text="The endpoint answered 2xx.")
    status_code = serializers.IntegerField(allow_null=True, help_text="null: no answer.")
    error = serializers.CharField(help_text="What went wrong; empty when it went through.")
    milliseconds = serializers.IntegerField()


class WebhookSerializer(serializers.Serializer):
    """A webhook endpoint of the event stream, with how its deliveries go."""

    id = serializers.IntegerField()
    url = serializers.CharField(help_text="Where the events are POSTed.")
    description = serializers.CharField()
    types = serializers.ListField(child=serializers.CharField())
    channels = serializers.ListField(child=serializers.CharField())
    campaigns = serializers.ListField(child=serializers.CharField())
    state = serializers.ChoiceField(
        choices=["active", "paused", "failing"],
        help_text="failing: paused after failing for 3 days; PATCH active: true resumes it.",
    )
    secret = serializers.CharField(
        help_text="whsec_ and the base64 key of the webhook-signature header (Standard Webhooks)."
    )
    position = serializers.CharField(help_text="Where in the stream its next delivery starts.")
    delivered = serializers.IntegerField(help_text="Events it took.")
    failures = serializers.IntegerField(help_text="Attempts failed in a row.")
    failing_since = serializers.DateTimeField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField()
    last_success_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    deliveries = WebhookDeliverySerializer(
        many=True, required=False, help_text="The last 20 attempts, newest first (one endpoint)."
    )
