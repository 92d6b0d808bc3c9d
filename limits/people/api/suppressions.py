"""REST views of the suppression list: list, add, remove, one entry, and a file's import."""

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import DATABASE_MAX, max_user_id, user_id_from_text, user_ids_checked
from gatekeeper.lib.integers import whole_number
from gatekeeper.lib.permissions import (
    ADD_SUPPRESSIONS,
    DELETE_SUPPRESSIONS,
    VIEW_SUPPRESSIONS,
)
from limits.channels import ALL, scopes
from limits.models.people import Suppression
from limits.people.bodies import SuppressionAddBody, SuppressionRemoveBody
from limits.people.serializers import (
    SuppressionAddedSerializer,
    SuppressionImportedSerializer,
    SuppressionImportErrorSerializer,
    SuppressionPageSerializer,
    SuppressionRemovedSerializer,
    SuppressionSerializer,
)
from limits.people.suppression import REASONS as SUPPRESSION_REASONS
from limits.people.suppression import suppress, suppression_checked, suppression_import, unsuppress
from segments.api import RAW_LIST_BODY, RawListParser
from segments.parsing import UserListError

SUPPRESSIONS_PAGE_DEFAULT, SUPPRESSIONS_PAGE_MAX = 100, 1000
SUPPRESSION_EFFECT = (
    "Every process's gate decides by the new list within GATEKEEPER_SUPPRESSION_TTL_SECONDS "
    "(this one at once); each change is journalled with who made it."
)
SUPPRESSION_SCOPE = OpenApiParameter(
    "channel", {"type": "string", "enum": scopes()}, OpenApiParameter.PATH
)


def _suppression_shown(row: Suppression) -> dict[str, Any]:
    return {
        "channel": row.channel,
        "user_id": row.user_id,
        "reason": row.reason,
        "source": row.source,
        "note": row.note,
        "created_at": row.created_at,
    }


def _page_limit(text: str | None) -> int:
    if text is None:
        return SUPPRESSIONS_PAGE_DEFAULT
    return whole_number(
        text,
        maximum=SUPPRESSIONS_PAGE_MAX,
        minimum=1,
        what="A page size",
        padded=False,
        field="limit",
    )


class SuppressionListView(JsonAPIView):
    rights = {"GET": VIEW_SUPPRESSIONS, "POST": ADD_SUPPRESSIONS}
    bodies = {"POST": SuppressionAddBody}
    operation_ids = {"GET": "suppressions_list", "POST": "suppressions_add"}

    @extend_schema(
        summary="The suppression list, newest first, a page at a time",
        parameters=[
            OpenApiParameter(
                "channel",
                {"type": "string", "enum": scopes()},
                OpenApiParameter.QUERY,
                description="Only this channel's (or `all`'s) entries.",
            ),
            OpenApiParameter(
                "user_id",
                {"type": "integer", "minimum": 0, "maximum": max_user_id()},
                OpenApiParameter.QUERY,
                description="Only this user's entries.",
            ),
            OpenApiParameter(
                "reason",
                {"type": "string", "enum": list(SUPPRESSION_REASONS)},
                OpenApiParameter.QUERY,
                description="Only entries of this reason.",
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": SUPPRESSIONS_PAGE_MAX},
                OpenApiParameter.QUERY,
                description=f"Entries per page: 1 to {SUPPRESSIONS_PAGE_MAX} "
                f"({SUPPRESSIONS_PAGE_DEFAULT} by default).",
            ),
            OpenApiParameter(
                "before",
                {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
                OpenApiParameter.QUERY,
                description="Where the page starts (from `next`).",
            ),
        ],
        responses={200: SuppressionPageSerializer, **errors(400)},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        rows = Suppression.objects.order_by("-id")
        channel = params.get("channel")
        if channel is not None:
            suppression_checked(channel)
            rows = rows.filter(channel=channel)
        if params.get("user_id") is not None:
            user_id = user_id_from_text(params["user_id"], field="user_id", maximum=max_user_id())
            rows = rows.filter(user_id=user_id)
        reason = params.get("reason")
        if reason is not None:
            suppression_checked(ALL, reason)
            rows = rows.filter(reason=reason)
        if params.get("before") is not None:
            before = whole_number(
                params["before"],
                maximum=DATABASE_MAX,
                minimum=1,
                what="A position",
                padded=False,
                field="before",
            )
            rows = rows.filter(id__lt=before)
        limit = _page_limit(params.get("limit"))
        page = list(rows[: limit + 1])
        next_url = None
        if len(page) > limit:
            page = page[:limit]
            following = params.copy()
            following["before"] = str(page[-1].pk)
            next_url = request.build_absolute_uri(f"{request.path}?{following.urlencode()}")
        results = [_suppression_shown(row) for row in page]
        return Response(SuppressionPageSerializer({"results": results, "next": next_url}).data)

    @extend_schema(
        summary="Put users on the suppression list of a channel (or of all channels)",
        description="Users already on it keep their first reason. " + SUPPRESSION_EFFECT,
        responses={200: SuppressionAddedSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, SuppressionAddBody)
        ids = set(user_ids_checked(body.user_ids, field="user_ids", maximum=max_user_id()))
        added = suppress(
            channel=body.channel,
            user_ids=ids,
            reason=body.reason,
            source="api",
            by=request.user,
            note=body.note,
        )
        return Response({"channel": body.channel, "added": added, "already": len(ids) - added})


class SuppressionRemoveView(JsonAPIView):
    rights = {"POST": DELETE_SUPPRESSIONS}
    bodies = {"POST": SuppressionRemoveBody}
    operation_ids = {"POST": "suppressions_remove"}

    @extend_schema(
        summary="Take users off the suppression list of a channel (or of all channels)",
        description="Their marketing is gated by the caps again. " + SUPPRESSION_EFFECT,
        responses={200: SuppressionRemovedSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, SuppressionRemoveBody)
        ids = set(user_ids_checked(body.user_ids, field="user_ids", maximum=max_user_id()))
        removed = unsuppress(channel=body.channel, user_ids=ids, source="api", by=request.user)
        return Response({"channel": body.channel, "removed": removed, "absent": len(ids) - removed})


class SuppressionDetailView(JsonAPIView):
    rights = {"GET": VIEW_SUPPRESSIONS, "DELETE": DELETE_SUPPRESSIONS}
    operation_ids = {"GET": "suppression_get", "DELETE": "suppression_delete"}

    def _row(self, channel: str, user_id: str) -> Suppression:
        suppression_checked(channel)
        uid = user_id_from_text(user_id, field="user_id", maximum=max_user_id())
        row = Suppression.objects.filter(channel=channel, user_id=uid).first()
        if row is None:
            raise NotFound(f"User {uid} is not on the suppression list of {channel}.")
        return row

    @extend_schema(
        summary="Whether a user is on a channel's suppression list, and why",
        parameters=[SUPPRESSION_SCOPE, user_id_parameter(OpenApiParameter.PATH)],
        responses={200: SuppressionSerializer, **errors(400, 404)},
    )
    def get(self, request: Request, channel: str, user_id: str) -> Response:
        return Response(SuppressionSerializer(_suppression_shown(self._row(channel, user_id))).data)

    @extend_schema(
        summary="Take a user off a channel's suppression list",
        description=SUPPRESSION_EFFECT,
        parameters=[SUPPRESSION_SCOPE, user_id_parameter(OpenApiParameter.PATH)],
        responses={204: None, **errors(400, 404)},
    )
    def delete(self, request: Request, channel: str, user_id: str) -> Response:
        row = self._row(channel, user_id)
        unsuppress(channel=row.channel, user_ids=[row.user_id], source="api", by=request.user)
        return Response(status=204)


class SuppressionImportView(JsonAPIView):
    rights = {"PUT": ADD_SUPPRESSIONS}
    operation_ids = {"PUT": "suppressions_import"}
    parser_classes = [RawListParser]

    @extend_schema(
        summary="Add a file of user ids to a channel's suppression list (one id a line, text or "
        "gzip)",
        description=(
            "The file is read like a user list (a header line, blank lines and repeats allowed); "
            "the first bad line refuses the whole file and nothing is added (400, naming the "
            "line). ?reason= (default manual) is kept for the users added. " + SUPPRESSION_EFFECT
        ),
        parameters=[
            SUPPRESSION_SCOPE,
            OpenApiParameter(
                "reason",
                {"type": "string", "enum": list(SUPPRESSION_REASONS)},
                OpenApiParameter.QUERY,
            ),
        ],
        request=RAW_LIST_BODY,
        responses={
            200: SuppressionImportedSerializer,
            400: SuppressionImportErrorSerializer,
            **errors(413),
        },
    )
    def put(self, request: Request, channel: str) -> Response:
        suppression_checked(channel)
        reason = request.query_params.get("reason", Suppression.Reason.MANUAL)
        stream = request.data if hasattr(request.data, "read") else None
        if stream is None:
            raise UserListError("Send the list as the request body.")
        imported = suppression_import(
            channel=channel, fileobj=stream, reason=reason, source="import", by=request.user
        )
        return Response({"channel": channel, **imported})
