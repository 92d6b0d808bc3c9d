"""REST views of caps."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper import api_validation as check
from gatekeeper.api_permissions import CanEdit, CanRead
from gatekeeper.api_validation import JsonAPIView, errors
from limits.channels import scopes
from limits.models import Cap
from limits.serializers import CapChangeSerializer, CapSerializer
from limits.services import cap_set
from segments.models import Segment


class CapListView(JsonAPIView):
    permission_classes = [CanRead]

    @extend_schema(summary="Every cap", responses={200: CapSerializer(many=True), **errors()})
    def get(self, request: Request) -> Response:
        caps = Cap.objects.select_related("segment").order_by("segment__priority", "channel")
        return Response(CapSerializer(caps, many=True).data)


class CapDetailView(JsonAPIView):
    permission_classes = [CanEdit]

    @extend_schema(
        summary="Set the daily and weekly caps of a segment on a channel (or `all`)",
        description="Both fields are required; null means no cap for that window, 0 no marketing.",
        request=CapChangeSerializer,
        responses={200: CapSerializer, **errors(400)},
    )
    def put(self, request: Request, segment: str, channel: str) -> Response:
        # Both path parts are fields of the cap being set: a bad one is a 400 naming it.
        target = Segment.objects.filter(slug=segment).first()
        if target is None:
            raise ValidationError({"segment": [f"Unknown segment '{segment}'."]})
        if channel not in scopes():
            raise ValidationError(
                {"channel": [f"Unknown channel '{channel}'. Choose one of: {', '.join(scopes())}."]}
            )
        serializer = CapChangeSerializer(data=check.body_object(request.data))
        serializer.is_valid(raise_exception=True)
        try:
            cap = cap_set(
                segment=target,
                channel=channel,
                daily=serializer.validated_data["daily"],
                weekly=serializer.validated_data["weekly"],
                user=request.user,
                via="api",
            )
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        return Response(CapSerializer(cap).data)
