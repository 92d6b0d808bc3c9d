"""Shapes of the gate's REST bodies, for the OpenAPI schema.

The hot views validate by hand (gatekeeper.api_validation) for speed; these classes describe
exactly what they accept and answer.
"""

from django.conf import settings
from rest_framework import serializers

from gatekeeper.api_validation import ErrorSerializer
from limits.channels import channels
from worker.gate import CATEGORIES

__all__ = ["ErrorSerializer"]

REASONS = ["allowed", "duplicate", "daily_cap", "weekly_cap", "blocked", "exempt", "unavailable"]
GATE_LIMIT = 10_000
SEND_LIMIT = 100_000


def _user_id_field(help_text: str = "") -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=0, max_value=2**settings.GATEKEEPER_ID_WIDTH - 1, help_text=help_text or None
    )


def _channel_field() -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=channels(), help_text="A channel from settings (GATEKEEPER_CHANNELS)."
    )


class GateRequestSerializer(serializers.Serializer):
    user_id = _user_id_field("Also taken as a decimal string (64-bit ids from JavaScript).")
    message_id = serializers.CharField(
        max_length=200, help_text="The same id again is not counted twice (`duplicate`)."
    )


class GateCheckSerializer(serializers.Serializer):
    channel = _channel_field()
    campaign = serializers.CharField(required=False, max_length=200, allow_blank=True)
    category = serializers.ChoiceField(
        choices=list(CATEGORIES), required=False, default="marketing"
    )
    dry_run = serializers.BooleanField(required=False, default=False)
    requests = serializers.ListField(
        child=GateRequestSerializer(), max_length=GATE_LIMIT, min_length=1
    )


class GateReleaseSerializer(serializers.Serializer):
    channel = _channel_field()
    requests = serializers.ListField(
        child=GateRequestSerializer(), max_length=GATE_LIMIT, min_length=1
    )


class WindowCountsSerializer(serializers.Serializer):
    daily = serializers.IntegerField()
    weekly = serializers.IntegerField()


class WindowLimitsSerializer(serializers.Serializer):
    daily = serializers.IntegerField(allow_null=True, help_text="null: no cap")
    weekly = serializers.IntegerField(allow_null=True, help_text="null: no cap")


class DecisionSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    message_id = serializers.CharField()
    segment = serializers.CharField(allow_null=True)
    allowed = serializers.BooleanField()
    reason = serializers.ChoiceField(choices=REASONS)
    counts = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="daily, weekly (empty when exempt or unavailable)",
    )
    limits = serializers.DictField(
        child=serializers.IntegerField(allow_null=True), help_text="daily, weekly"
    )
    retry_after = serializers.FloatField(allow_null=True, help_text="Seconds until a slot frees.")


class GateResultsSerializer(serializers.Serializer):
    results = DecisionSerializer(many=True)


class ReleaseResultSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    message_id = serializers.CharField()
    released = serializers.BooleanField()


class ReleaseResultsSerializer(serializers.Serializer):
    results = ReleaseResultSerializer(many=True)


class WindowQuotaSerializer(serializers.Serializer):
    used = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True)
    remaining = serializers.IntegerField(allow_null=True)


class ScopeQuotaSerializer(serializers.Serializer):
    daily = WindowQuotaSerializer()
    weekly = WindowQuotaSerializer()
    next_slot_in = serializers.FloatField(
        allow_null=True, help_text="Seconds until a slot frees, when full."
    )


class QuotaSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    segment = serializers.CharField()
    snapshot_version = serializers.CharField()
    scopes = serializers.DictField(
        child=ScopeQuotaSerializer(), help_text="Each channel, and `all`."
    )


class RecipientSerializer(serializers.Serializer):
    user_id = _user_id_field()
    address = serializers.CharField(help_text="Email address or push token.")
    message_id = serializers.CharField(
        required=False, max_length=200, help_text="Default: <campaign>:<user_id>."
    )
    context = serializers.DictField(required=False, help_text="Template variables.")  # type: ignore[assignment]


class SendJobCreateSerializer(serializers.Serializer):
    channel = _channel_field()
    campaign = serializers.CharField(max_length=200)
    template = serializers.RegexField(
        r"^[A-Za-z0-9_-]+$",
        max_length=100,
        help_text="Templates under templates/<channel>/<template>/, e.g. welcome.",
    )
    category = serializers.ChoiceField(
        choices=list(CATEGORIES), required=False, default="marketing"
    )
    on_capped = serializers.ChoiceField(choices=["drop", "defer"], required=False, default="drop")
    recipients = serializers.ListField(
        child=RecipientSerializer(), min_length=1, max_length=SEND_LIMIT
    )


class SendJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    channel = serializers.CharField()
    campaign = serializers.CharField()
    template = serializers.CharField()
    category = serializers.CharField()
    on_capped = serializers.CharField()
    status = serializers.CharField()
    total = serializers.IntegerField()
    processed = serializers.IntegerField()
    progress = serializers.IntegerField()
    sent = serializers.IntegerField()
    failed = serializers.IntegerField()
    reasons = serializers.DictField(child=serializers.IntegerField())
    segments = serializers.DictField(child=serializers.IntegerField())
    created_at = serializers.DateTimeField()


class SendJobCreatedSerializer(SendJobSerializer):
    url = serializers.URLField(help_text="Where to follow the job (also the Location header).")
