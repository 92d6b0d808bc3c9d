"""Shapes of the segments app's REST answers, for the OpenAPI schema (see segments/api.py).
Request bodies are msgspec structs (segments/bodies.py)."""

from rest_framework import serializers

from segments.index import get_index
from segments.models import Build, Segment, UserList


class SegmentSerializer(serializers.ModelSerializer):
    time_zone = serializers.CharField(
        help_text='Its users\' IANA time zone when a send names none; "": '
        "GATEKEEPER_DEFAULT_TIME_ZONE."
    )
    cardinality = serializers.SerializerMethodField(
        help_text="Users in the segment in the live snapshot; null when none is loaded."
    )
    live_version = serializers.SerializerMethodField(
        help_text="The snapshot version this process serves; null when none is loaded."
    )

    class Meta:
        model = Segment
        fields = [
            "slug",
            "name",
            "priority",
            "description",
            "time_zone",
            "is_default",
            "cardinality",
            "live_version",
        ]
        read_only_fields = fields

    def get_cardinality(self, segment: Segment) -> int | None:
        index = get_index()
        return index.cardinalities.get(segment.slug) if index else None

    def get_live_version(self, segment: Segment) -> str | None:
        index = get_index()
        return index.version if index else None


class LookupResultSerializer(serializers.Serializer):
    user_id = serializers.IntegerField(min_value=0)
    segment = serializers.CharField()


class LookupOneSerializer(LookupResultSerializer):
    snapshot_version = serializers.CharField()


class LookupManySerializer(serializers.Serializer):
    snapshot_version = serializers.CharField()
    results = LookupResultSerializer(many=True, help_text="In request order.")


class SegmentBuildStatsSerializer(serializers.Serializer):
    listed = serializers.IntegerField(help_text="Distinct ids in the segment's lists.")
    cardinality = serializers.IntegerField(
        allow_null=True,
        help_text="Users it holds after overlaps (null for the default segment: everyone the "
        "others do not hold).",
    )
    lost_to_higher_priority = serializers.IntegerField(
        help_text="Listed ids a segment of higher priority holds."
    )
    bytes = serializers.IntegerField(help_text="Its bitmap's size in the snapshot.")


class BuildSerializer(serializers.ModelSerializer):
    duration_seconds = serializers.FloatField(read_only=True, allow_null=True)
    stats = serializers.DictField(
        child=SegmentBuildStatsSerializer(),
        help_text="Per segment, by slug; {} until the build has published its snapshot.",
    )

    class Meta:
        model = Build
        fields = [
            "id", "status", "progress", "stage", "version", "stats", "total_users",
            "snapshot_bytes", "error", "created_at", "started_at", "finished_at", "duration_seconds",
        ]  # fmt: skip


class BuildStartedSerializer(BuildSerializer):
    url = serializers.URLField(help_text="Where to follow the build (also the Location header).")

    class Meta(BuildSerializer.Meta):
        fields = [*BuildSerializer.Meta.fields, "url"]


class UserListSerializer(serializers.ModelSerializer):
    users = serializers.IntegerField(source="id_count", help_text="Distinct user ids.")
    lines = serializers.IntegerField(
        source="line_count",
        help_text="Lines read, the header, blank lines and repeated ids included (so far, while "
        "validating).",
    )
    blank_lines = serializers.IntegerField(read_only=True)
    repeated_ids = serializers.IntegerField(
        read_only=True, help_text="Lines whose id an earlier line already listed."
    )
    uploaded_by = serializers.SlugRelatedField(slug_field="username", read_only=True)  # type: ignore[var-annotated]

    class Meta:
        model = UserList
        fields = [
            "id", "status", "original_name", "users", "lines", "header_lines", "blank_lines",
            "repeated_ids", "size_bytes", "error", "error_line", "uploaded_at", "uploaded_by",
        ]  # fmt: skip
        read_only_fields = fields


class UserListStoredSerializer(UserListSerializer):
    url = serializers.URLField(help_text="The segment's lists, to follow a validating one.")

    class Meta(UserListSerializer.Meta):
        fields = [*UserListSerializer.Meta.fields, "url"]
        read_only_fields = fields


class UserListsSerializer(serializers.Serializer):
    results = UserListSerializer(many=True, help_text="Newest first.")


class UserListErrorSerializer(serializers.Serializer):
    file = serializers.ListField(child=serializers.CharField(), help_text="What is wrong.")
    line = serializers.IntegerField(
        allow_null=True, help_text="The first bad line; null when the file cannot be read at all."
    )


class SnapshotVersionSerializer(serializers.Serializer):
    version = serializers.CharField()
    is_live = serializers.BooleanField()
    created_at = serializers.DateTimeField(allow_null=True)
    build_id = serializers.IntegerField(allow_null=True)
    users = serializers.IntegerField()
    bytes = serializers.IntegerField()
    segments = serializers.DictField(child=serializers.IntegerField(allow_null=True))


class SnapshotsSerializer(serializers.Serializer):
    live_version = serializers.CharField(allow_null=True)
    results = SnapshotVersionSerializer(many=True, help_text="Newest first.")


class LiveVersionSerializer(serializers.Serializer):
    live_version = serializers.CharField()
