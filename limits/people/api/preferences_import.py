"""REST view of the import of a file of people's preferences (limits/people/preferences_import.py):
the file as the raw body, checked whole, then written; all or nothing."""

from types import SimpleNamespace
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import RequestTooLarge, declared_size_checked
from gatekeeper.lib.permissions import CHANGE_PREFERENCES
from limits.people import preferences_import as service
from limits.people.preferences_import import (
    CONTENT_TYPES,
    FORMATS,
    PreferencesFileRefused,
    PreferencesFileTooLarge,
    import_format,
    preferences_import,
)

LIMIT_REASON = "the most a file of preferences may be, as sent"
FILE_BODY = {
    media: {"type": "string", "format": "binary"}
    for media in (*CONTENT_TYPES, "application/gzip", "application/octet-stream")
}


class PreferencesFileParser(BaseParser):
    """Hands the request body over as a stream: a file may be large, and gzip is told by its
    bytes, so any content type is taken as it is. A body declared larger than the import takes
    is refused (413) before it is read."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        declared_size_checked(
            (parser_context or {}).get("request"),
            limit=service.MAX_UPLOAD_BYTES,
            reason=LIMIT_REASON,
        )
        return stream


class FileFormatNegotiation(DefaultContentNegotiation):
    """`?format=` names the file's format here, not the answer's (JSON, as everywhere): DRF
    would otherwise look for a renderer called `csv` and answer 404."""

    settings = SimpleNamespace(URL_FORMAT_OVERRIDE=None)  # type: ignore[assignment]


class PreferencesImportedSerializer(serializers.Serializer):
    lines = serializers.IntegerField(help_text="Lines read, header and blank lines included.")
    people = serializers.IntegerField(help_text="People in the file.")
    changed = serializers.IntegerField(help_text="People whose preferences changed (journaled).")
    unchanged = serializers.IntegerField(help_text="People whose preferences already were these.")


class PreferencesFileProblemSerializer(serializers.Serializer):
    line = serializers.IntegerField()
    field = serializers.CharField(help_text="`topics.news.sms`, `user_id`; empty: the line.")
    message = serializers.CharField()


class PreferencesImportErrorSerializer(serializers.Serializer):
    """A refused file, nothing of it written: its problems by line (the first 20), or the
    limit it goes past."""

    file = serializers.ListField(child=serializers.CharField(), help_text="What is wrong.")
    line = serializers.IntegerField(allow_null=True, help_text="The first bad line (null: none).")
    problems = serializers.ListField(child=PreferencesFileProblemSerializer())


class PreferencesImportView(JsonAPIView):
    rights = {"PUT": CHANGE_PREFERENCES}
    operation_ids = {"PUT": "preferences_import"}
    parser_classes = [PreferencesFileParser]
    content_negotiation_class = FileFormatNegotiation

    @extend_schema(
        summary="Import a file of people's preferences (CSV or JSON lines, text or gzip)",
        description=(
            "Each person in the file gets the file's preferences, whole; everyone else keeps "
            "theirs. JSON lines: one object a line, `user_id` and a person's PUT body. CSV: a "
            "header (`user_id`, `topic`, `channel`, `subscribed`, `paused_until`), one choice a "
            "row, a person's rows one after another. The format is `?format=` or told by the "
            f"Content-Type ({', '.join(CONTENT_TYPES)}). All or nothing: the whole file is "
            "checked first by the rule for a person's preferences; a bad line or a person named "
            "twice is a 400 naming the lines (the first 20 problems) and nothing is written. "
            "Then written a thousand people a transaction, each change journaled with source "
            "`import`; the same file imported again changes nothing."
        ),
        parameters=[
            OpenApiParameter(
                "format",
                {"type": "string", "enum": list(FORMATS)},
                OpenApiParameter.QUERY,
                description="The file's format (default: told by the Content-Type).",
            )
        ],
        request=FILE_BODY,
        responses={
            200: PreferencesImportedSerializer,
            400: PreferencesImportErrorSerializer,
            **errors(413),
        },
    )
    def put(self, request: Request) -> Response:
        data: Any = request.data  # the stream PreferencesFileParser left
        if not hasattr(data, "read"):
            raise PreferencesFileRefused(["Send the file as the request body."])
        try:
            file_format = import_format(
                given=request.query_params.get("format"), content_type=request.content_type
            )
            imported = preferences_import(
                fileobj=data, file_format=file_format, source="import", by=request.user
            )
        except PreferencesFileTooLarge as exc:
            raise RequestTooLarge(limit=exc.limit, size=exc.size, reason=LIMIT_REASON) from None
        return Response(PreferencesImportedSerializer(imported.as_json()).data)
