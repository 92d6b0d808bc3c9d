"""Answer shapes of the event stream's page and of its webhook
endpoints."""

from rest_framework import serializers

from limits.reasons import CATEGORIES
from limits.stream.events import EVENT_TYPES


class StreamOutrankedSerializer(serializers.Serializer):
    job = serializers.IntegerField(help_text="The send job a round gave the user's slot to.")
    value = serializers.FloatField(help_text="What that job's send was worth to the user.")


class StreamEventSerializer(serializers.Serializer):
    """One event of the stream. Every event has `id`, `type`, `at` and `user_id`; the other
    fields are its type's (docs/api.md, "The event stream", lists them)."""

    id = serializers.CharField(
        help_text="The same for the same event, however often it is delivered: d<row> a "
        "decision, o<row>.<outcome> its outcome, s<change> a suppression change, p<change> a "
        "preferences change, a<row> a dead address."
    )
    type = serializers.ChoiceField(choices=sorted(EVENT_TYPES))
    at = serializers.DateTimeField(
        help_text="When the gate decided; for an outcome, when the ledger took it; for a "
        "change, when it was made; for a dead address, when the provider said so."
    )
    user_id = serializers.IntegerField()
    channel = serializers.CharField(required=False, help_text="Not in preferences changes.")
    campaign = serializers.CharField(
        required=False, help_text="Decisions, outcomes and dead addresses."
    )
    message_id = serializers.CharField(required=False, help_text="Decisions and outcomes.")
    reason = serializers.CharField(
        required=False,
        help_text="A decision's reason; a suppression's (unsubscribed, ...); what the provider "
        "said of a dead address.",
    )
    job = serializers.IntegerField(required=False, help_text="A dead address's send job.")
    address = serializers.CharField(
        required=False, help_text="A dead address: the push token, mailbox or phone number."
    )
    rule_id = serializers.IntegerField(required=False, allow_null=True)
    segment = serializers.CharField(required=False)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    priority = serializers.IntegerField(required=False)
    category = serializers.ChoiceField(choices=CATEGORIES, required=False)
    topic = serializers.CharField(required=False)
    zone = serializers.CharField(
        required=False, help_text="A decision's time zone, as its request named it; empty: none."
    )
    snapshot_version = serializers.CharField(required=False)
    experiment = serializers.IntegerField(required=False, allow_null=True)
    arm = serializers.IntegerField(required=False, allow_null=True)
    outranked_by = StreamOutrankedSerializer(
        required=False,
        allow_null=True,
        help_text="A decision's, on reason outranked: the send job a round chose for the user "
        "instead and what its send was worth to them; null otherwise.",
    )
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
