"""The base of every REST view, and the error bodies the schema documents for them."""

from typing import Any, ClassVar, Literal

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.views import APIView

from gatekeeper.lib.bodies import DEFAULT_MAX_BODY_BYTES, JsonBodyParser
from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.permissions import API_AUTHENTICATION, HasRights


class JsonAPIView(APIView):
    """Bodies are JSON, read within `max_body_bytes` (413 beyond it) and decoded by the view
    with `gatekeeper.lib.bodies.decode`; rights are named per method in `rights`."""

    authentication_classes = API_AUTHENTICATION
    permission_classes = [HasRights]
    parser_classes = [JsonBodyParser]
    rights: ClassVar[dict[str, tuple[str, ...]]] = {}
    max_body_bytes: ClassVar[int] = DEFAULT_MAX_BODY_BYTES
    body_limit_reason: ClassVar[str] = ""


class ErrorSerializer(serializers.Serializer):
    """The body of a refusal that is not about one field: {"detail": "..."}."""

    detail = serializers.CharField()


# A 400: each bad field (list items named by position, `requests[3].user_id`) with its messages;
# `non_field_errors` when the body as a whole is wrong, `detail` for malformed JSON.
FIELD_ERRORS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]
    },
    "example": {
        "requests[3].user_id": ["A user id is a whole number from 0 to 4294967295, not 4294967296."]
    },
}

_ERRORS = {
    400: OpenApiResponse(FIELD_ERRORS_SCHEMA, description="Bad input: each bad field named."),
    401: OpenApiResponse(ErrorSerializer, description="No credentials, or bad ones."),
    403: OpenApiResponse(ErrorSerializer, description="The user lacks the right for this."),
    404: OpenApiResponse(ErrorSerializer, description="No such object."),
    409: OpenApiResponse(ErrorSerializer, description="Conflicts with the current state."),
    413: OpenApiResponse(ErrorSerializer, description="The body is above this endpoint's limit."),
    503: OpenApiResponse(ErrorSerializer, description="A part it needs is down (said which)."),
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error responses for `extend_schema(responses=...)`; 401 and 403 are always there."""
    return {code: _ERRORS[code] for code in sorted({401, 403, *codes})}


def user_id_parameter(location: Literal["path", "query"]) -> OpenApiParameter:
    """The `user_id` of a path or query, as the schema describes it."""
    return OpenApiParameter(
        "user_id",
        {"type": "integer", "minimum": 0, "maximum": max_user_id()},
        location=location,
        required=True,
        description="An unsigned user id (GATEKEEPER_ID_WIDTH bits).",
    )
