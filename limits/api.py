"""REST views of caps."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gatekeeper import api_validation as check
from gatekeeper.api_permissions import CanEdit, CanRead
from limits.channels import scopes
from limits.models import Cap
from limits.services import cap_describe, cap_set, cap_warnings
from segments.models import Segment


class CapSerializer(serializers.ModelSerializer):
    segment = serializers.SlugRelatedField(slug_field="slug", read_only=True)  # type: ignore[var-annotated]
    description = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField()

    class Meta:
        model = Cap
        fields = ["segment", "channel", "daily", "weekly", "description", "warnings", "updated_at"]

    def get_description(self, cap: Cap) -> str:
        return cap_describe(channel=cap.channel, daily=cap.daily, weekly=cap.weekly)

    def get_warnings(self, cap: Cap) -> list[str]:
        return cap_warnings(daily=cap.daily, weekly=cap.weekly)


class CapChangeSerializer(serializers.Serializer):
    daily = serializers.IntegerField(min_value=0, allow_null=True, help_text="null: no daily cap")
    weekly = serializers.IntegerField(min_value=0, allow_null=True, help_text="null: no weekly cap")


class CapListView(APIView):
    permission_classes = [CanRead]

    @extend_schema(summary="Every cap", responses={200: CapSerializer(many=True)})
    def get(self, request: Request) -> Response:
        caps = Cap.objects.select_related("segment").order_by("segment__priority", "channel")
        return Response(CapSerializer(caps, many=True).data)


class CapDetailView(APIView):
    permission_classes = [CanEdit]

    @extend_schema(
        summary="Set the daily and weekly caps of a segment on a channel (or `all`)",
        request=CapChangeSerializer,
        responses={200: CapSerializer, 400: OpenApiResponse(description="Bad field")},
    )
    def put(self, request: Request, segment: str, channel: str) -> Response:
        target = get_object_or_404(Segment, slug=segment)
        if channel not in scopes():
            raise ValidationError(
                {"channel": [f"Unknown channel '{channel}'. Choose one of: {', '.join(scopes())}."]}
            )
        serializer = CapChangeSerializer(data=check.body_object(request.data))
        serializer.is_valid(raise_exception=True)
        for field in ("daily", "weekly"):
            if field not in request.data:
                raise ValidationError({field: ["This field is required (null means no cap)."]})
        cap = cap_set(
            segment=target,
            channel=channel,
            daily=serializer.validated_data["daily"],
            weekly=serializer.validated_data["weekly"],
            user=request.user,
            via="api",
        )
        return Response(CapSerializer(cap).data)
