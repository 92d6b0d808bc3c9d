"""REST views of the classic caps: every cap, and a segment's cap on a channel set."""

from django.core.validators import slug_re
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.permissions import (
    SET_CAPS,
    VIEW_CAPS,
)
from gatekeeper.lib.problems import Problem
from limits.channels import scopes, validate_scope
from limits.models.policy import Cap
from limits.policy.bodies import CapBody
from limits.policy.serializers import CapSerializer
from limits.policy.services import cap_set
from segments.selectors import segment_by_slug


class CapListView(JsonAPIView):
    rights = {"GET": VIEW_CAPS}
    operation_ids = {"GET": "caps_list"}

    @extend_schema(summary="Every cap", responses={200: CapSerializer(many=True), **errors()})
    def get(self, request: Request) -> Response:
        caps = Cap.objects.select_related("segment").order_by("segment__priority", "channel")
        return Response(CapSerializer(caps, many=True).data)


class CapDetailView(JsonAPIView):
    rights = {"PUT": SET_CAPS}
    bodies = {"PUT": CapBody}
    operation_ids = {"PUT": "cap_set"}

    @extend_schema(
        summary="Set the daily and weekly caps of a segment on a channel (or `all`)",
        description="Both fields are required; null means no cap for that window, 0 no marketing.",
        parameters=[
            OpenApiParameter(
                "segment", {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"}, OpenApiParameter.PATH
            ),
            OpenApiParameter(
                "channel", {"type": "string", "enum": scopes()}, OpenApiParameter.PATH
            ),
        ],
        responses={200: CapSerializer, **errors(400, 404, 413)},
    )
    def put(self, request: Request, segment: str, channel: str) -> Response:
        # An unknown channel is a bad request (the schema lists them); a segment that does not
        # exist is a cap that cannot exist: 404.
        validate_scope(channel, field="channel")
        if not slug_re.match(segment):
            raise Problem("A segment's slug is letters, digits, - and _.", field="segment")
        target = segment_by_slug(segment)
        if target is None:
            raise NotFound(f"No segment '{segment}'.")
        body = decode(request.data, CapBody)
        cap = cap_set(
            segment=target,
            channel=channel,
            daily=body.daily,
            weekly=body.weekly,
            user=request.user,
            via="api",
        )
        return Response(CapSerializer(cap).data)
