"""Answer shapes of a person's export and of an erasure."""

from rest_framework import serializers

from limits.people.serializers import PreferencesSerializer
from limits.privacy.personal import places


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
    limits.privacy.personal (the registry says which, and each place its shape)."""

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
