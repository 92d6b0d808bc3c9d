"""Fast validation for the hot endpoints (gate, lookups): plain Python, errors name the field.

DRF serializers cost microseconds per item, which matters at 10,000 items a request; these
checks do the same job with a loop over plain values and raise DRF's ValidationError, so the
answer is the usual 400 body: {"field": ["message"]}.
"""

import re
from typing import Any, Literal

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.views import APIView

from gatekeeper.api_permissions import API_AUTHENTICATION
from segments.index import get_index

# The largest value a PositiveIntegerField holds on every database Django supports.
MAX_CAP = 2**31 - 1
NAME = re.compile(r"[A-Za-z0-9_-]+")


class JsonAPIView(APIView):
    """The base of every API view. Bodies are JSON only, so the schema does not offer form
    encodings the views cannot use; tokens are cached briefly (CachedTokenAuthentication)."""

    authentication_classes = API_AUTHENTICATION
    parser_classes = [JSONParser]


def configured_max_user_id() -> int:
    return int(2**settings.GATEKEEPER_ID_WIDTH - 1)


def max_user_id() -> int:
    """The largest user id a request may name: the configured width, narrowed to the loaded
    snapshot's, since a 32-bit snapshot cannot answer for a 64-bit id."""
    index = get_index()
    width = (
        settings.GATEKEEPER_ID_WIDTH
        if index is None
        else min(settings.GATEKEEPER_ID_WIDTH, index.id_width)
    )
    return int(2**width - 1)


def body_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["The body must be a JSON object."]})
    return data


def user_id(value: Any, field: str, *, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # Decimal strings too: JavaScript clients cannot hold 64-bit ids as numbers. ASCII only,
        # since str.isdigit() and int() also take other scripts' digits.
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
            value = int(value)
        else:
            raise ValidationError({field: [f"A user id is a whole number, not {value!r}."]})
    maximum = max_user_id() if maximum is None else maximum
    if not 0 <= value <= maximum:
        raise ValidationError({field: [f"A user id is between 0 and {maximum}, not {value}."]})
    return value


def user_ids(values: list[Any], field: str) -> list[int]:
    """`values` as user ids; one pass over plain ints when they all are (the usual case)."""
    maximum = max_user_id()
    if all(type(v) is int for v in values) and min(values) >= 0 and max(values) <= maximum:
        return values
    return [user_id(v, f"{field}[{i}]", maximum=maximum) for i, v in enumerate(values)]


def string(
    data: dict[str, Any],
    field: str,
    *,
    required: bool = True,
    default: str = "",
    max_length: int = 200,
) -> str:
    if field not in data:
        if required:
            raise ValidationError({field: ["This field is required."]})
        return default
    value = data[field]
    if not isinstance(value, str) or (required and not value):
        raise ValidationError({field: ["Must be a non-empty string."]})
    if len(value) > max_length:
        raise ValidationError({field: [f"At most {max_length} characters."]})
    if "\x00" in value:  # PostgreSQL text cannot hold it; file names neither
        raise ValidationError({field: ["Must not contain NUL characters."]})
    return value


def name(data: dict[str, Any], field: str, *, max_length: int = 100) -> str:
    """A required name that becomes part of a path (a template): letters, digits, - and _."""
    value = string(data, field, max_length=max_length)
    if not NAME.fullmatch(value):
        raise ValidationError({field: [f"Letters, digits, - and _ only, not {value!r}."]})
    return value


def boolean(data: dict[str, Any], field: str, *, default: bool = False) -> bool:
    value = data.get(field, default)
    if not isinstance(value, bool):
        raise ValidationError({field: ["Must be true or false."]})
    return value


def items(data: dict[str, Any], field: str, *, limit: int) -> list[Any]:
    if field not in data:
        raise ValidationError({field: ["This field is required."]})
    value = data[field]
    if not isinstance(value, list):
        raise ValidationError({field: ["Must be a list."]})
    if not value:
        raise ValidationError({field: ["Must not be empty."]})
    if len(value) > limit:
        raise ValidationError(
            {field: [f"At most {limit:,} items per request; this one has {len(value):,}."]}
        )
    return value


def gate_requests(data: dict[str, Any], *, limit: int) -> list[tuple[int, str]]:
    parsed = []
    maximum = max_user_id()
    for i, item in enumerate(items(data, "requests", limit=limit)):
        if type(item) is dict:
            uid, message = item.get("user_id"), item.get("message_id")
            # The usual case in one test; anything else goes the slow way to its message.
            if (
                type(uid) is int
                and 0 <= uid <= maximum
                and type(message) is str
                and 0 < len(message) <= 200
            ):
                parsed.append((uid, message))
                continue
        if not isinstance(item, dict):
            raise ValidationError(
                {f"requests[{i}]": ["Must be an object with user_id and message_id."]}
            )
        if "user_id" not in item:
            raise ValidationError({f"requests[{i}].user_id": ["This field is required."]})
        message = item.get("message_id")
        if not isinstance(message, str) or not message or len(message) > 200:
            raise ValidationError(
                {
                    f"requests[{i}].message_id": [
                        "Must be a non-empty string of at most 200 characters."
                    ]
                }
            )
        parsed.append(
            (user_id(item["user_id"], f"requests[{i}].user_id", maximum=maximum), message)
        )
    return parsed


class ErrorSerializer(serializers.Serializer):
    """The body of a refusal that is not about one field: {"detail": "..."}."""

    detail = serializers.CharField()


# A 400: each bad field (list items named by position, `requests[3].user_id`) with its messages;
# `non_field_errors` when the body as a whole is wrong, `detail` for malformed JSON.
FIELD_ERRORS_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]
    },
    "example": {"requests[3].user_id": ["A user id is between 0 and 4294967295, not -1."]},
}

_ERRORS = {
    400: OpenApiResponse(FIELD_ERRORS_SCHEMA, description="Bad input: each bad field named."),
    401: OpenApiResponse(ErrorSerializer, description="No credentials, or bad ones."),
    403: OpenApiResponse(ErrorSerializer, description="The user lacks the right for this."),
    404: OpenApiResponse(ErrorSerializer, description="No such object."),
    409: OpenApiResponse(ErrorSerializer, description="Conflicts with the current state."),
    503: OpenApiResponse(ErrorSerializer, description="A part it needs is down (said which)."),
}


def user_id_parameter(location: Literal["path", "query"]) -> OpenApiParameter:
    """The `user_id` of a path or query, as the schema describes it."""
    return OpenApiParameter(
        "user_id",
        {"type": "integer", "minimum": 0, "maximum": configured_max_user_id()},
        location=location,
        required=True,
        description="An unsigned user id (GATEKEEPER_ID_WIDTH bits).",
    )


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error responses for `extend_schema(responses=...)`; 401 and 403 are always there."""
    return {code: _ERRORS[code] for code in sorted({401, 403, *codes})}
