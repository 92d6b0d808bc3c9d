"""REST views of segments: CRUD, lookups, user lists, snapshots and builds."""

from typing import Any

import msgspec
from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import ErrorSerializer, JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import declared_size_checked, decode
from gatekeeper.lib.ids import user_id_from_text, user_ids_checked
from gatekeeper.lib.permissions import (
    ADD_SEGMENTS,
    CHANGE_SEGMENTS,
    DELETE_SEGMENTS,
    PUBLISH,
    REPLACE_USER_LISTS,
    VIEW_BUILDS,
    VIEW_SEGMENTS,
    VIEW_USER_LISTS,
)
from gatekeeper.lib.redis_client import REDIS_DOWN
from segments.bodies import (
    LOOKUP_BODY_BYTES,
    LOOKUP_LIMIT,
    LookupBody,
    SegmentChangeBody,
    SegmentCreateBody,
)
from segments.index import (
    SnapshotError,
    SnapshotNotFound,
    get_index,
    index_status,
    max_answerable_user_id,
)
from segments.models import Build, Segment, UserList
from segments.parsing import UserListError
from segments.publishing import BuildBusy, BuildInProgress, snapshot_rollback
from segments.selectors import snapshot_live_version, snapshot_versions
from segments.serializers import (
    BuildSerializer,
    BuildStartedSerializer,
    LiveVersionSerializer,
    LookupManySerializer,
    LookupOneSerializer,
    SegmentSerializer,
    SnapshotsSerializer,
    UserListErrorSerializer,
    UserListSerializer,
    UserListsSerializer,
    UserListStoredSerializer,
)
from segments.services import (
    build_start,
    segment_change,
    segment_create,
    segment_delete,
    user_list_import,
)
from segments.store import StoreError


def _no_snapshot() -> Response:
    return Response(
        {"detail": f"No segment snapshot is loaded: {index_status()['error']}"}, status=503
    )


class SegmentListView(JsonAPIView):
    rights = {"GET": VIEW_SEGMENTS, "POST": ADD_SEGMENTS}
    bodies = {"POST": SegmentCreateBody}
    operation_ids = {"GET": "segments_list", "POST": "segment_create"}

    @extend_schema(
        summary="Segments in priority order, with live cardinality and version",
        responses={200: SegmentSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        return Response(SegmentSerializer(Segment.objects.order_by("priority"), many=True).data)

    @extend_schema(
        summary="Create a segment",
        responses={201: SegmentSerializer, **errors(400, 409, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, SegmentCreateBody)
        fields = msgspec.structs.asdict(body)
        fields["time_zone"] = fields["time_zone"] or ""  # null and "": the default zone
        segment = segment_create(**fields)
        return Response(SegmentSerializer(segment).data, status=201)


class SegmentDetailView(JsonAPIView):
    rights = {"GET": VIEW_SEGMENTS, "PATCH": CHANGE_SEGMENTS, "DELETE": DELETE_SEGMENTS}
    bodies = {"PATCH": SegmentChangeBody}
    operation_ids = {"GET": "segment_get", "PATCH": "segment_change", "DELETE": "segment_delete"}

    @extend_schema(summary="One segment", responses={200: SegmentSerializer, **errors(404)})
    def get(self, request: Request, slug: str) -> Response:
        return Response(SegmentSerializer(get_object_or_404(Segment, slug=slug)).data)

    @extend_schema(
        summary="Change a segment's name, priority, description or time zone (its slug never "
        "changes)",
        responses={200: SegmentSerializer, **errors(400, 404, 409, 413)},
    )
    def patch(self, request: Request, slug: str) -> Response:
        segment = get_object_or_404(Segment, slug=slug)
        body = decode(request.data, SegmentChangeBody)
        changes = {
            name: value
            for name, value in msgspec.structs.asdict(body).items()
            if value is not msgspec.UNSET
        }
        if "time_zone" in changes:
            changes["time_zone"] = changes["time_zone"] or ""  # null and "": the default zone
        segment_change(segment=segment, **changes)
        return Response(SegmentSerializer(segment).data)

    @extend_schema(
        summary="Delete a segment with its lists and caps (not the default one: 409)",
        responses={204: None, **errors(404, 409)},
    )
    def delete(self, request: Request, slug: str) -> Response:
        segment_delete(segment=get_object_or_404(Segment, slug=slug))
        return Response(status=204)


# A file of user ids as a request body, in the schema: plain text or gzip, as raw bytes.
RAW_LIST_BODY = {
    media: {"type": "string", "format": "binary"}
    for media in ("text/plain", "application/gzip", "application/octet-stream")
}


class RawListParser(BaseParser):
    """Hands the request body over as a stream: a list may be large, and gzip is detected by
    its bytes, so any content type is taken as-is. A body declared larger than
    GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES is refused (413) before it is read."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        declared_size_checked(
            (parser_context or {}).get("request"),
            limit=int(settings.GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES),
            reason="GATEKEEPER_USER_LIST_MAX_UPLOAD_BYTES",
        )
        return stream


def _list_answer(request: Request, user_list: UserList) -> dict[str, Any]:
    url = request.build_absolute_uri(f"/api/v1/segments/{user_list.segment.slug}/users/")
    return {**UserListSerializer(user_list).data, "url": url}


class SegmentUsersView(JsonAPIView):
    rights = {"GET": VIEW_USER_LISTS, "PUT": REPLACE_USER_LISTS}
    operation_ids = {"GET": "user_lists_get", "PUT": "user_list_replace"}
    parser_classes = [RawListParser]

    @extend_schema(
        summary="The segment's user lists, newest first, with their state",
        responses={200: UserListsSerializer, **errors(404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        segment = get_object_or_404(Segment, slug=slug)
        lists = segment.user_lists.select_related("uploaded_by").order_by("-pk")
        return Response({"results": UserListSerializer(lists, many=True).data})

    @extend_schema(
        summary="Replace the segment's user list (one id a line, text or gzip)",
        description=(
            "Validated exactly like an upload in the admin; the first bad line refuses the whole "
            "file and nothing is stored (400). A list that takes longer than the web process "
            "checks itself (GATEKEEPER_USER_LIST_INLINE_BYTES, decompressed) is stored as "
            "`validating` and checked in the background (202): follow it at `url`; it replaces "
            "the segment's lists once it is `ready`, and a `failed` one says why. The next build "
            "publishes it."
        ),
        request=RAW_LIST_BODY,
        responses={
            200: UserListStoredSerializer,
            202: UserListStoredSerializer,
            400: UserListErrorSerializer,
            **errors(404, 413),
        },
    )
    def put(self, request: Request, slug: str) -> Response:
        segment = get_object_or_404(Segment, slug=slug)
        stream = request.data if hasattr(request.data, "read") else None
        if stream is None:
            raise UserListError("Send the list as the request body.")
        user_list = user_list_import(
            segment=segment,
            fileobj=stream,
            name=f"{slug}-api.txt",
            replace=True,
            user=request.user,
            inline_bytes=int(settings.GATEKEEPER_USER_LIST_INLINE_BYTES),
        )
        answer = _list_answer(request, user_list)
        if user_list.status == UserList.Status.VALIDATING:
            return Response(answer, status=202, headers={"Location": answer["url"]})
        return Response(answer)


class LookupView(JsonAPIView):
    rights = {"GET": VIEW_SEGMENTS, "POST": VIEW_SEGMENTS}
    bodies = {"POST": LookupBody}
    operation_ids = {"GET": "segment_lookup", "POST": "segment_lookup_many"}
    max_body_bytes = LOOKUP_BODY_BYTES
    body_limit_reason = f"{LOOKUP_LIMIT:,} user ids"

    @extend_schema(
        summary="The segment of one user",
        parameters=[user_id_parameter(OpenApiParameter.QUERY)],
        responses={200: LookupOneSerializer, **errors(400, 503)},
    )
    def get(self, request: Request) -> Response:
        if "user_id" not in request.query_params:
            raise ValidationError({"user_id": ["This query parameter is required."]})
        uid = user_id_from_text(
            request.query_params["user_id"], field="user_id", maximum=max_answerable_user_id()
        )
        index = get_index()
        if index is None:
            return _no_snapshot()
        return Response(
            {"user_id": uid, "segment": index.resolve(uid), "snapshot_version": index.version}
        )

    @extend_schema(
        summary=f"The segments of up to {LOOKUP_LIMIT:,} users, in request order",
        responses={200: LookupManySerializer, **errors(400, 413, 503)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, LookupBody)
        ids = user_ids_checked(body.user_ids, field="user_ids", maximum=max_answerable_user_id())
        index = get_index()
        if index is None:
            return _no_snapshot()
        segments = index.resolve_many(ids)
        return Response(
            {
                "snapshot_version": index.version,
                "results": [
                    {"user_id": u, "segment": s} for u, s in zip(ids, segments, strict=True)
                ],
            }
        )


class SnapshotListView(JsonAPIView):
    rights = {"GET": VIEW_BUILDS, "POST": PUBLISH}
    operation_ids = {"GET": "snapshots_list", "POST": "build_start"}

    @extend_schema(
        summary="Published snapshot versions, newest first",
        responses={200: SnapshotsSerializer, **errors(503)},
    )
    def get(self, request: Request) -> Response:
        try:
            return Response(
                {"live_version": snapshot_live_version(), "results": snapshot_versions()}
            )
        except StoreError as exc:
            return Response({"detail": f"The snapshot store is unreachable: {exc}"}, status=503)

    @extend_schema(
        summary="Start a build; answers 202 with the build's URL",
        request=None,
        responses={202: BuildStartedSerializer, **errors(409)},
    )
    def post(self, request: Request) -> Response:
        try:
            build = build_start(user=request.user)
        except BuildInProgress as exc:
            return Response({"detail": str(exc)}, status=409)
        body = BuildSerializer(build).data
        body["url"] = request.build_absolute_uri(f"/api/v1/builds/{build.pk}/")
        return Response(body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["url"]})


class SnapshotActivateView(JsonAPIView):
    rights = {"POST": PUBLISH}
    operation_ids = {"POST": "snapshot_activate"}

    @extend_schema(
        summary="Make a published version live again (rollback)",
        request=None,
        responses={
            200: LiveVersionSerializer,
            400: OpenApiResponse(
                ErrorSerializer,
                description="The version is incomplete (an object of it is missing from the "
                "store) or corrupt: said which. It will never load; 503 is a store that does "
                "not answer.",
            ),
            **errors(404, 409, 503),
        },
    )
    def post(self, request: Request, version: str) -> Response:
        try:
            snapshot_rollback(version=version)
        except SnapshotNotFound as exc:
            return Response({"detail": str(exc)}, status=404)
        except SnapshotError as exc:
            return Response({"detail": str(exc)}, status=400)
        except StoreError as exc:
            return Response({"detail": f"The snapshot store is unreachable: {exc}"}, status=503)
        except REDIS_DOWN as exc:
            return Response(
                {"detail": f"Redis is not answering ({exc}); nothing was changed."}, status=503
            )
        except (BuildInProgress, BuildBusy) as exc:
            return Response({"detail": str(exc)}, status=409)
        return Response({"live_version": version})


class BuildDetailView(JsonAPIView):
    rights = {"GET": VIEW_BUILDS}
    operation_ids = {"GET": "build_get"}

    @extend_schema(
        summary="A build's status and progress", responses={200: BuildSerializer, **errors(404)}
    )
    def get(self, request: Request, build_id: int) -> Response:
        return Response(BuildSerializer(get_object_or_404(Build, pk=build_id)).data)
