"""The base of every REST view, and the error bodies the schema documents for them."""

import inspect
from typing import Any, ClassVar, Literal

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from gatekeeper.lib.bodies import (
    DEFAULT_MAX_BODY_BYTES,
    JsonBodyParser,
    nullable_schema,
    openapi_components,
)
from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.ids import max_user_id
from gatekeeper.lib.permissions import API_AUTHENTICATION, HasRights
from gatekeeper.lib.problems import NON_FIELD, CarriesProblems


class JsonAPIView(APIView):
    """The base of every REST view (its docstring is no endpoint's description: ApiSchema)."""

    authentication_classes = API_AUTHENTICATION
    permission_classes = [HasRights]
    parser_classes = [JsonBodyParser]
    # Per HTTP method: the permissions it needs (gatekeeper.lib.permissions), the body it
    # takes (a gatekeeper.lib.bodies.Body, decoded with `decode`; the schema is generated from
    # it) and the operation's id in the schema (what generated clients name their functions).
    rights: ClassVar[dict[str, tuple[str, ...]]] = {}
    bodies: ClassVar[dict[str, type]] = {}
    operation_ids: ClassVar[dict[str, str]] = {}
    # Bodies are read within this (a JSON 413 beyond it), stated with the reason.
    max_body_bytes: ClassVar[int] = DEFAULT_MAX_BODY_BYTES
    body_limit_reason: ClassVar[str] = ""

    def handle_exception(self, exc: Exception) -> Response:
        """The one place the project's errors become answers: a Conflict is a 409; an error
        that carries problems (gatekeeper.lib.problems: a Problem, a refused file) is the 400
        with its `field_errors()`, and a service's Django ValidationError the 400 naming its
        fields (the API's names). Views raise these and never build the answer themselves."""
        if isinstance(exc, Conflict):
            body = {"detail": str(exc), **({"field": exc.field} if exc.field else {})}
            return Response(body, status=409)
        if isinstance(exc, CarriesProblems):
            exc = FieldErrors(exc.field_errors())
        elif isinstance(exc, DjangoValidationError):
            exc = ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD: exc.messages}
            )
        return super().handle_exception(exc)


class FieldErrors(APIException):
    """A 400 whose body is given as it is (DRF's ValidationError would turn a file's `line`
    number into a string)."""

    status_code = 400

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.detail = body


class ApiSchema(AutoSchema):
    """drf-spectacular's schema of a JsonAPIView: request bodies generated from its `bodies`
    (their structs become named components), its `operation_ids`, and descriptions from the
    view's or the method's own docstring only (never a base class's)."""

    def get_request_serializer(self) -> Any:
        spec = getattr(self.view, "bodies", {}).get(self.method)
        if spec is None:
            return super().get_request_serializer()
        ref, components = openapi_components(spec)
        for name, schema in components.items():
            self.registry.register_on_missing(
                ResolvedComponent(name, ResolvedComponent.SCHEMA, schema=schema, object=name)
            )
        return {"application/json": ref}

    def get_operation_id(self) -> str:
        own: str | None = getattr(self.view, "operation_ids", {}).get(self.method)
        return own or str(super().get_operation_id())

    def get_description(self) -> str:  # type: ignore[override]
        handler = getattr(self.view, self.method.lower(), None)
        own = (handler.__doc__ if handler is not None else None) or type(self.view).__dict__.get(
            "__doc__"
        )
        return inspect.cleandoc(own) if own else ""


def postprocess_schema(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular's last step: one `FieldErrors` component for every 400 (not the same
    body inlined per operation), JSON request bodies marked required, and every nullable
    schema of the document in a form OpenAPI 3.0.3 takes null by (`nullable_schema`)."""
    result.setdefault("components", {}).setdefault("schemas", {})["FieldErrors"] = (
        FIELD_ERRORS_SCHEMA
    )
    components = result["components"]["schemas"]

    def resolve(ref: str) -> dict[str, Any] | None:
        prefix, _, name = ref.rpartition("/")
        return components.get(name) if prefix == "#/components/schemas" else None

    result["paths"] = _nullables_written(result.get("paths", {}), resolve)
    result["components"] = _nullables_written(result["components"], resolve)
    for path in result.get("paths", {}).values():
        for operation in path.values():
            body = operation.get("requestBody")
            if body is not None and body.get("content"):
                body["required"] = True
            for response in operation.get("responses", {}).values():
                for media in response.get("content", {}).values():
                    if media.get("schema") == FIELD_ERRORS_SCHEMA:
                        media["schema"] = {"$ref": "#/components/schemas/FieldErrors"}
    return result


def _nullables_written(node: Any, resolve: Any) -> Any:
    """`node` (a part of the document) with each of its schemas through `_schema_written`: the
    values of `schema` (parameters, media types, headers) and of `components.schemas`; examples
    are data, left as they are."""
    if isinstance(node, list):
        return [_nullables_written(item, resolve) for item in node]
    if not isinstance(node, dict):
        return node
    written = {}
    for key, value in node.items():
        if key == "schema":
            written[key] = _schema_written(value, resolve)
        elif key == "schemas" and isinstance(value, dict):
            written[key] = {name: _schema_written(item, resolve) for name, item in value.items()}
        elif key in ("example", "examples"):
            written[key] = value
        else:
            written[key] = _nullables_written(value, resolve)
    return written


def _schema_written(schema: Any, resolve: Any, depth: int = 0) -> Any:
    """`schema` and the schemas in it with every one marked `nullable: true` put through
    `nullable_schema`. drf-spectacular writes a nullable nested serializer, or a nullable field
    described by a `$ref`, as `allOf: [$ref]` + `nullable`, which refuses null in OpenAPI 3.0.3
    (its issue 925; no setting of its changes that)."""
    if not isinstance(schema, dict) or depth > 64:  # ours nest a few levels: a bound all the same
        return schema
    written = dict(schema)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(written.get(key), dict):
            written[key] = _schema_written(written[key], resolve, depth + 1)
    for key in ("allOf", "oneOf", "anyOf"):
        if isinstance(written.get(key), list):
            written[key] = [_schema_written(item, resolve, depth + 1) for item in written[key]]
    if isinstance(written.get("properties"), dict):
        written["properties"] = {
            name: _schema_written(item, resolve, depth + 1)
            for name, item in written["properties"].items()
        }
    return nullable_schema(written, resolve) if written.get("nullable") is True else written


class ErrorSerializer(serializers.Serializer):
    """The body of a refusal that is not about one field: {"detail": "..."}."""

    detail = serializers.CharField()
    field = serializers.CharField(required=False, help_text="On a 409: the field at fault.")


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
    """The `user_id` of a path or query, as the schema describes it: its digits."""
    return OpenApiParameter(
        "user_id",
        {"type": "integer", "minimum": 0, "maximum": max_user_id()},
        location=location,
        required=True,
        description="An unsigned user id (GATEKEEPER_ID_WIDTH bits).",
    )
