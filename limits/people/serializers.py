"""Answer shapes of the suppression list's and of people's
preferences' REST views."""

from rest_framework import serializers

from limits.people.bodies import OwnFrequency
from limits.people.suppression import REASONS as SUPPRESSION_REASONS
from limits.policy.serializers import BodyShapedField

# --- the decisions report ----------------------------------------------------------------------


# --- the suppression list ----------------------------------------------------------------------


class SuppressionSerializer(serializers.Serializer):
    channel = serializers.CharField(help_text='A channel, or "all": every channel.')
    user_id = serializers.IntegerField(min_value=0)
    reason = serializers.ChoiceField(choices=list(SUPPRESSION_REASONS))
    source = serializers.CharField(  # type: ignore[assignment]  # a field named source
        help_text="Where it came from: link (the unsubscribe link), api, admin, import, "
        "esp:<provider> (a tracking webhook)."
    )
    note = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()


class SuppressionPageSerializer(serializers.Serializer):
    results = SuppressionSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next page, or null.")


class SuppressionAddedSerializer(serializers.Serializer):
    channel = serializers.CharField()
    added = serializers.IntegerField(help_text="Users put on the list.")
    already = serializers.IntegerField(help_text="Users who were on it (their reason kept).")


class SuppressionImportedSerializer(SuppressionAddedSerializer):
    lines = serializers.IntegerField(help_text="Lines read, header and blank lines included.")


class SuppressionImportErrorSerializer(serializers.Serializer):
    """A refused import: the file's first bad line, or the parameter that is wrong."""

    file = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="What is wrong with the file."
    )
    line = serializers.IntegerField(
        allow_null=True, required=False, help_text="The first bad line (null: none)."
    )
    channel = serializers.ListField(child=serializers.CharField(), required=False)
    reason = serializers.ListField(child=serializers.CharField(), required=False)


class SuppressionRemovedSerializer(serializers.Serializer):
    channel = serializers.CharField()
    removed = serializers.IntegerField(help_text="Users taken off the list.")
    absent = serializers.IntegerField(help_text="Users who were not on it.")


class PreferencesSerializer(serializers.Serializer):
    user_id = serializers.IntegerField(
        help_text="Whose they are: the user id in the path (a PUT or PATCH may send the answer "
        "back as it is)."
    )
    topics = serializers.DictField(
        child=serializers.DictField(child=serializers.BooleanField()),
        help_text="Per topic, per channel subscribed or not; what is not named follows the "
        "topic's default.",
    )
    channels = serializers.DictField(
        child=serializers.BooleanField(), help_text="Per channel, marketing on or off."
    )
    paused_until = serializers.DateTimeField(allow_null=True, help_text="null: no pause.")
    paused_channels = serializers.DictField(
        child=serializers.DateTimeField(), help_text="Per channel, paused until then."
    )
    frequency = serializers.ListField(
        child=BodyShapedField(OwnFrequency),
        help_text="Their own frequency per channel: at most `limit` sends in `window`.",
    )
