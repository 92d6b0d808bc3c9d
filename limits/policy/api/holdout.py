"""REST view of the global control group (limits/policy/holdout.py): read, and set whole."""

import msgspec
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.permissions import CHANGE_HOLDOUT, VIEW_HOLDOUT
from limits.policy.bodies import HoldoutBody
from limits.policy.holdout import HoldoutFields, holdout_as_json, holdout_read, holdout_set
from segments.models import Segment


class HoldoutSerializer(serializers.Serializer):
    share = serializers.FloatField(help_text="The share held out; 0: no group.")
    salt = serializers.CharField(help_text="What the group is drawn from.")
    exclude_segments = serializers.ListField(child=serializers.CharField())
    exclude_tags = serializers.ListField(child=serializers.CharField())
    change = serializers.CharField(
        required=False, help_text="On a PUT: what the change does to who is held out."
    )


class HoldoutView(JsonAPIView):
    rights = {"GET": VIEW_HOLDOUT, "PUT": CHANGE_HOLDOUT}
    bodies = {"PUT": HoldoutBody}
    operation_ids = {"GET": "holdout_get", "PUT": "holdout_set"}

    @extend_schema(
        summary="The global control group (a share of 0: none)",
        responses={200: HoldoutSerializer, **errors()},
    )
    def get(self, request: Request) -> Response:
        return Response(HoldoutSerializer(holdout_as_json(holdout_read())).data)

    @extend_schema(
        summary="Set the global control group whole",
        description="Checked by the one rule (limits.policy.holdout.holdout_problems): a share from "
        "0.001 to 0.2 or 0, segments that exist, valid tags, each once; a 400 names each "
        "(`exclude_segments.0`) and nothing changes. Recorded in its history. A share that "
        "grows keeps everyone held out still out; one that shrinks lets back exactly the "
        "users between the two bounds (`change` says so).",
        responses={200: HoldoutSerializer, **errors(400, 413)},
    )
    def put(self, request: Request) -> Response:
        body = decode(request.data, HoldoutBody)
        current = holdout_read()
        fields = HoldoutFields(
            share=body.share,
            salt=current.salt if body.salt is msgspec.UNSET else body.salt,
            exclude_segments=list(body.exclude_segments),
            exclude_tags=list(body.exclude_tags),
        )
        saved, change = holdout_set(
            fields,
            segments=Segment.objects.values_list("slug", flat=True),
            via="api",
            by=request.user,
        )
        return Response(HoldoutSerializer({**holdout_as_json(saved), "change": change}).data)
