"""REST views of the gate: check, release, a user's quota, and send jobs."""

from typing import Any

import msgspec
from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import user_id_from_text, user_ids_checked
from gatekeeper.lib.permissions import GATE, VIEW_CAPS, VIEW_SEND_JOBS
from limits.channels import validate_channel
from limits.limiter import Decision
from segments.index import max_answerable_user_id
from worker.bodies import (
    GATE_BODY_BYTES,
    GATE_LIMIT,
    SEND_BODY_BYTES,
    SEND_LIMIT,
    GateCheckBody,
    GateReleaseBody,
    GateRequest,
    SendJobBody,
)
from worker.gate import GateError, gate_check, gate_release
from worker.models import SendJob
from worker.selectors import Unavailable, user_quota
from worker.serializers import (
    GateResultsSerializer,
    QuotaSerializer,
    ReleaseResultsSerializer,
    SendJobCreatedSerializer,
    SendJobSerializer,
)
from worker.services import send_job_create


def _channel(value: str) -> str:
    try:
        validate_channel(value)
    except DjangoValidationError as exc:
        raise ValidationError({"channel": exc.messages}) from None
    return value


def _requests(requests: list[GateRequest]) -> list[tuple[int, str]]:
    ids = user_ids_checked(
        [r.user_id for r in requests],
        field="requests",
        item="user_id",
        maximum=max_answerable_user_id(),
    )
    return list(zip(ids, [r.message_id for r in requests], strict=True))


def _decision(d: Decision) -> dict[str, Any]:
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
    rights = {"POST": GATE}
    bodies = {"POST": GateCheckBody}
    operation_ids = {"POST": "gate_check"}
    max_body_bytes = GATE_BODY_BYTES
    body_limit_reason = f"{GATE_LIMIT:,} requests"

    @extend_schema(
        summary=f"Decide a batch of sends (at most {GATE_LIMIT:,}), in request order",
        description=(
            "Admitted marketing sends are recorded (unless dry_run). Redis down or no snapshot: "
            "every decision is `unavailable`, still a 200."
        ),
        responses={200: GateResultsSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, GateCheckBody)
        channel = _channel(body.channel)
        requests = _requests(body.requests)
        try:
            decisions = gate_check(
                channel=channel,
                requests=requests,
                campaign=body.campaign,
                category=body.category,
                dry_run=body.dry_run,
            )
        except GateError as exc:
            raise ValidationError({"channel": [str(exc)]}) from exc
        return Response({"results": [_decision(d) for d in decisions]})


class GateReleaseView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": GateReleaseBody}
    operation_ids = {"POST": "gate_release"}
    max_body_bytes = GATE_BODY_BYTES
    body_limit_reason = f"{GATE_LIMIT:,} requests"

    @extend_schema(
        summary="Give back the quota of sends whose dispatch failed for good",
        responses={200: ReleaseResultsSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, GateReleaseBody)
        channel = _channel(body.channel)
        requests = _requests(body.requests)
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
    rights = {"GET": VIEW_CAPS}
    operation_ids = {"GET": "user_quota"}

    @extend_schema(
        summary="A user's segment, and per channel and `all`: used, limit, remaining, next slot",
        description="Reads only: nothing is recorded. 503 when Redis or the snapshot is missing.",
        parameters=[user_id_parameter(OpenApiParameter.PATH)],
        responses={200: QuotaSerializer, **errors(400, 404, 503)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = user_id_from_text(user_id, field="user_id", maximum=max_answerable_user_id())
        try:
            return Response(user_quota(uid))
        except Unavailable as exc:
            return Response({"detail": str(exc)}, status=503)


class SendJobListView(JsonAPIView):
    rights = {"POST": GATE}
    bodies = {"POST": SendJobBody}
    operation_ids = {"POST": "send_job_create"}
    max_body_bytes = SEND_BODY_BYTES
    body_limit_reason = f"{SEND_LIMIT:,} recipients"

    @extend_schema(
        summary=f"Hand a send job to the worker (up to {SEND_LIMIT:,} recipients); 202, its URL",
        responses={202: SendJobCreatedSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, SendJobBody)
        try:
            job = send_job_create(
                channel=_channel(body.channel),
                campaign=body.campaign,
                template=body.template,
                category=body.category,
                on_capped=body.on_capped,
                on_invalid=body.on_invalid,
                recipients=msgspec.to_builtins(body.recipients),
                user=request.user,
            )
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        answer = SendJobSerializer(job).data
        url = request.build_absolute_uri(f"/api/v1/sends/{job.pk}/")
        return Response({**answer, "url": url}, status=202, headers={"Location": url})


class SendJobDetailView(JsonAPIView):
    rights = {"GET": VIEW_SEND_JOBS}
    operation_ids = {"GET": "send_job_get"}

    @extend_schema(
        summary="A send job's progress and counts",
        responses={200: SendJobSerializer, **errors(404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(SendJobSerializer(get_object_or_404(SendJob, pk=job_id)).data)
