"""REST views of the gate: check, release and a user's quota."""

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper import api_validation as check
from gatekeeper.api_permissions import CanGate, CanRead
from gatekeeper.api_validation import JsonAPIView, errors
from limits.channels import channels
from worker.gate import CATEGORIES, MARKETING, GateDecision, GateError, gate_check, gate_release
from worker.models import SendJob
from worker.selectors import Unavailable, user_quota
from worker.serializers import (
    GATE_LIMIT,
    SEND_LIMIT,
    GateCheckSerializer,
    GateReleaseSerializer,
    GateResultsSerializer,
    QuotaSerializer,
    ReleaseResultsSerializer,
    SendJobCreatedSerializer,
    SendJobCreateSerializer,
    SendJobSerializer,
)
from worker.services import send_job_create


def _channel(data: dict[str, Any]) -> str:
    channel = check.string(data, "channel")
    if channel not in channels():
        raise ValidationError(
            {"channel": [f"Unknown channel '{channel}'. Choose one of: {', '.join(channels())}."]}
        )
    return channel


def _decision(d: GateDecision) -> dict[str, Any]:
    # By hand rather than dataclasses.asdict, which deep-copies: 10,000 of these per request.
    return {
        "user_id": d.user_id,
        "message_id": d.message_id,
        "segment": d.segment,
        "allowed": d.allowed,
        "reason": d.reason,
        "counts": d.counts,
        "limits": d.limits,
        "retry_after": d.retry_after,
    }


class GateCheckView(JsonAPIView):
    permission_classes = [CanGate]

    @extend_schema(
        summary=f"Decide a batch of sends (at most {GATE_LIMIT:,}), in request order",
        description=(
            "Admitted marketing sends are recorded (unless dry_run). Redis down or no snapshot: "
            "every decision is `unavailable`, still a 200."
        ),
        request=GateCheckSerializer,
        responses={200: GateResultsSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        data = check.body_object(request.data)
        channel = _channel(data)
        campaign = check.string(data, "campaign", required=False)
        category = check.string(data, "category", required=False, default=MARKETING)
        if category not in CATEGORIES:
            raise ValidationError({"category": [f"Choose one of: {', '.join(CATEGORIES)}."]})
        dry_run = check.boolean(data, "dry_run")
        requests = check.gate_requests(data, limit=GATE_LIMIT)
        try:
            decisions = gate_check(
                channel=channel,
                requests=requests,
                campaign=campaign,
                category=category,
                dry_run=dry_run,
            )
        except GateError as exc:
            raise ValidationError({"channel": [str(exc)]}) from exc
        return Response({"results": [_decision(d) for d in decisions]})


class GateReleaseView(JsonAPIView):
    permission_classes = [CanGate]

    @extend_schema(
        summary="Give back the quota of sends whose dispatch failed for good",
        request=GateReleaseSerializer,
        responses={200: ReleaseResultsSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        data = check.body_object(request.data)
        channel = _channel(data)
        requests = check.gate_requests(data, limit=GATE_LIMIT)
        released = gate_release(channel=channel, requests=requests)
        return Response(
            {
                "results": [
                    {"user_id": u, "message_id": m, "released": r}
                    for (u, m), r in zip(requests, released, strict=True)
                ]
            }
        )


class QuotaView(JsonAPIView):
    permission_classes = [CanRead]

    @extend_schema(
        summary="A user's segment, and per channel and `all`: used, limit, remaining, next slot",
        description="Reads only: nothing is recorded. 503 when Redis or the snapshot is missing.",
        parameters=[check.user_id_parameter(OpenApiParameter.PATH)],
        responses={200: QuotaSerializer, **errors(400, 404, 503)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = check.user_id(user_id, "user_id")
        try:
            return Response(user_quota(uid))
        except Unavailable as exc:
            return Response({"detail": str(exc)}, status=503)


class SendJobListView(JsonAPIView):
    permission_classes = [CanGate]

    @extend_schema(
        summary=f"Hand a send job to the worker (up to {SEND_LIMIT:,} recipients); 202, its URL",
        request=SendJobCreateSerializer,
        responses={202: SendJobCreatedSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        data = check.body_object(request.data)
        try:
            job = send_job_create(
                channel=check.string(data, "channel"),
                campaign=check.string(data, "campaign"),
                template=check.name(data, "template"),
                category=check.string(data, "category", required=False, default=MARKETING),
                on_capped=check.string(data, "on_capped", required=False, default="drop"),
                recipients=check.items(data, "recipients", limit=SEND_LIMIT),
                user=request.user,
            )
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        body = SendJobSerializer(job).data
        url = request.build_absolute_uri(f"/api/v1/sends/{job.pk}/")
        return Response({**body, "url": url}, status=202, headers={"Location": url})


class SendJobDetailView(JsonAPIView):
    permission_classes = [CanRead]

    @extend_schema(
        summary="A send job's progress and counts",
        responses={200: SendJobSerializer, **errors(404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(SendJobSerializer(get_object_or_404(SendJob, pk=job_id)).data)
