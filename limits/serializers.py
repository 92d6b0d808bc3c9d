"""Shapes of the caps' REST bodies (see limits/api.py)."""

from rest_framework import serializers

from limits.models import Cap
from limits.services import cap_describe, cap_warnings


class CapSerializer(serializers.ModelSerializer):
    segment = serializers.SlugRelatedField(slug_field="slug", read_only=True)  # type: ignore[var-annotated]
    description = serializers.SerializerMethodField(help_text="The cap in plain words.")
    warnings = serializers.SerializerMethodField(
        help_text="Allowed but probably a mistake, e.g. a weekly cap below the daily one."
    )

    class Meta:
        model = Cap
        fields = ["segment", "channel", "daily", "weekly", "description", "warnings", "updated_at"]

    def get_description(self, cap: Cap) -> str:
        return cap_describe(channel=cap.channel, daily=cap.daily, weekly=cap.weekly)

    def get_warnings(self, cap: Cap) -> list[str]:
        return cap_warnings(daily=cap.daily, weekly=cap.weekly)
