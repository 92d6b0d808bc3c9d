"""REST views of a person's export and of erasures."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import max_user_id, user_id_from_text, user_ids_checked
from gatekeeper.lib.instants import instant_text
from gatekeeper.lib.permissions import (
    ERASE_USERS,
    EXPORT_PERSONAL_DATA,
    VIEW_ERASURES,
)
from limits.models.privacy import Erasure
from limits.policy.quota import Unavailable
from limits.privacy.bodies import EraseBody
from limits.privacy.erasure import erasure_progress
from limits.privacy.personal import person_export
from limits.privacy.serializers import ErasureSerializer, ExportSerializer
from limits.privacy.services import erasure_start


class ExportView(JsonAPIView):
    rights = {"GET": EXPORT_PERSONAL_DATA}
    operation_ids = {"GET": "user_export"}

    @extend_schema(
        summary="Everything held about one person, as one JSON document",
        description=(
            "A person's data on request (GDPR article 15, CCPA's right to know): one key per "
            "place Gatekeeper keeps personal data in, whole (no pages): the ledger's decisions "
            "and outcomes, the cap log in Redis, reservations, the suppression list and its "
            "journal, preferences and their journal, quota resets, experiments, the send jobs' "
            "recipient records (addresses, contexts), dead addresses and SMS numbers. Reads "
            "only. 503 when Redis does not answer: an export is whole or not given. A user id "
            "nobody ever sent to answers 200 with every place empty. docs/api.md describes "
            "each field."
        ),
        parameters=[user_id_parameter(OpenApiParameter.PATH)],
        responses={200: ExportSerializer, **errors(400, 503)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = user_id_from_text(user_id, field="user_id", maximum=max_user_id())
        try:
            document = person_export(uid)
        except Unavailable as exc:
            return Response({"detail": str(exc)}, status=503)
        for decision in document["decisions"]:
            decision["at"] = instant_text(decision["at"])
        return Response(document)


def _erasure_shown(request: Request, erasure: Erasure) -> dict[str, Any]:
    by = erasure.requested_by
    return {
        "id": erasure.pk,
        "url": request.build_absolute_uri(f"/api/v1/erasures/{erasure.pk}/"),
        "status": erasure.status,
        "count": erasure.count,
        "requested_at": erasure.requested_at,
        "requested_by": by.get_username() if by is not None else None,
        "via": erasure.via,
        "progress": round(erasure_progress(erasure), 1),
        "removed": erasure.removed,
        "waiting": erasure.waiting,
        "finished_at": erasure.finished_at,
    }


class EraseView(JsonAPIView):
    rights = {"POST": ERASE_USERS}
    bodies = {"POST": EraseBody}
    operation_ids = {"POST": "users_erase"}

    @extend_schema(
        summary="Erase people everywhere (GDPR article 17); 202 with the erasure to follow",
        description=(
            "From the erasure's first seconds the gate refuses them on every channel and keeps "
            "none of their decisions; then every place of a person's export loses their part "
            "(ledger rows deleted, their cap log and reservations in Redis, suppression and "
            "preferences with their journals, quota resets, studies, their recipient records "
            "in send jobs, dead addresses, SMS numbers), twice, the second pass 30 s after the "
            "first. They are kept only as a keyed hash of the id, by which the gate goes on "
            "refusing them. Erasing someone again removes nothing more. docs/api.md says what "
            "each place does."
        ),
        responses={202: ErasureSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, EraseBody)
        ids = user_ids_checked(body.user_ids, field="user_ids", maximum=max_user_id())
        erasure = erasure_start(user_ids=ids, via="api", by=request.user)
        return Response(_erasure_shown(request, erasure), status=202)


class ErasureView(JsonAPIView):
    rights = {"GET": VIEW_ERASURES}
    operation_ids = {"GET": "erasure_get"}

    @extend_schema(
        summary="An erasure: how far it got",
        responses={200: ErasureSerializer, **errors(404)},
    )
    def get(self, request: Request, erasure_id: int) -> Response:
        erasure = Erasure.objects.filter(pk=erasure_id).select_related("requested_by").first()
        if erasure is None:
            raise NotFound(f"No erasure {erasure_id}.")
        return Response(_erasure_shown(request, erasure))
