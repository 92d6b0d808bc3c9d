"""REST views of caps."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode, request_schema
from gatekeeper.lib.permissions import SET_CAPS, VIEW_CAPS
from limits.bodies import CapBody
from limits.channels import validate_scope
from limits.models import Cap
from limits.serializers import CapSerializer
from limits.services import cap_set
from segments.selectors import segment_by_slug


class CapListView(JsonAPIView):
    rights = {"GET": VIEW_CAPS}

    @extend_schema(summary="Every cap", responses={200: CapSerializer(many=True), **errors()})
    def get(self, request: Request) -> Response:
        caps = Cap.objects.select_related("segment").order_by("segment__priority", "channel")
        return Response(CapSerializer(caps, many=True).data)


class CapDetailView(JsonAPIView):
    rights = {"PUT": SET_CAPS}

    @extend_schema(
        summary="Set the daily and weekly caps of a segment on a channel (or `all`)",
        description="Both fields are required; null means no cap for that window, 0 no marketing.",
        request=request_schema(CapBody),
        responses={200: CapSerializer, **errors(400, 413)},
    )
    def put(self, request: Request, segment: str, channel: str) -> Response:
        # Both path parts are fields of the cap being set: a bad one is a 400 naming it.
        target = segment_by_slug(segment)
        if target is None:
            raise ValidationError({"segment": [f"Unknown segment '{segment}'."]})
        try:
            validate_scope(channel)
        except DjangoValidationError as exc:
            raise ValidationError({"channel": exc.messages}) from None
        body = decode(request.data, CapBody)
        try:
            cap = cap_set(
                segment=target,
                channel=channel,
                daily=body.daily,
                weekly=body.weekly,
                user=request.user,
                via="api",
            )
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        return Response(CapSerializer(cap).data)
