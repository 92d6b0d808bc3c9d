"""REST views of the send ledger: a user's decision history and the decisions report (JSON or CSV)."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import NO_NUL, decode
from gatekeeper.lib.ids import max_user_id, user_id_from_text, user_ids_checked
from gatekeeper.lib.instants import instant_text
from gatekeeper.lib.integers import whole_number
from gatekeeper.lib.permissions import (
    ERASE_USERS,
    EXPORT_PERSONAL_DATA,
    READ_STREAM,
    VIEW_CAPS,
    VIEW_ERASURES,
    VIEW_REPORTS,
)
from gatekeeper.lib.problems import Problem, Problems
from limits.bodies import EraseBody
from limits.channels import channels, validate_channel
from limits.ledger import events as stream
from limits.ledger.erasure import erasure_progress
from limits.ledger.history import (
    INSTANT,
    INSTANT_WORDS,
    PAGE_DEFAULT,
    PAGE_MAX,
    POSITION,
    POSITION_WORDS,
    Position,
    interval_from_text,
    position_from_text,
    user_history,
)
from limits.ledger.personal import person_export
from limits.ledger.reports import (
    DEFAULT_DAYS,
    DEFAULT_GROUP_BY,
    FILTER_PROBLEMS,
    GROUPS,
    SEGMENT_MAX,
    SLUG,
    decisions_csv,
    decisions_query,
    decisions_report,
    report_filename,
)
from limits.ledger.serializers import (
    DecisionsReportSerializer,
    ErasureSerializer,
    ExportSerializer,
    HistorySerializer,
    StreamPageSerializer,
)
from limits.models import Erasure
from limits.quota import Unavailable
from limits.reasons import REASONS
from limits.rules import CAMPAIGN_MAX
from limits.services import erasure_start


def _page_limit(value: str | None, *, default: int, maximum: int) -> int:
    """`?limit=`: 1 to `maximum`, `default` when absent; a 400 naming it otherwise."""
    if value is None:
        return default
    return whole_number(
        value, maximum=maximum, minimum=1, what="limit", padded=False, field="limit"
    )


def _history_before(value: str | None) -> Position | None:
    if value is None:
        return None
    return position_from_text(value, field="before")


def _history_filter(params: Any, name: str) -> str | None:
    """`?campaign=` (empty: decisions of no campaign) or `?reason=`, checked as the decisions
    report checks them; None: any."""
    value = params.get(name)
    if value is not None and (problem := FILTER_PROBLEMS[name](value)):
        raise ValidationError({name: [problem]})
    return cast(str | None, value)


def interval_parameters(what: str) -> list[OpenApiParameter]:
    """`?from=` and `?to=` as interval_from_text reads them, for the schema: `what` (Decisions,
    Jobs starting) at or after `from` and before `to`."""
    return [
        OpenApiParameter(
            "from",
            {"type": "string", "pattern": f"^{INSTANT.pattern}$"},
            OpenApiParameter.QUERY,
            description=f"{what} at or after this. {INSTANT_WORDS} A day: its start.",
        ),
        OpenApiParameter(
            "to",
            {"type": "string", "pattern": f"^{INSTANT.pattern}$"},
            OpenApiParameter.QUERY,
            description=f"{what} before this. {INSTANT_WORDS} A day: that whole day included.",
        ),
    ]


class HistoryView(JsonAPIView):
    rights = {"GET": VIEW_CAPS}
    operation_ids = {"GET": "user_history"}

    @extend_schema(
        summary="A user's decisions from the send ledger, newest first, a page at a time",
        description=(
            "Every gate decision kept for the user (marketing sends and exempt transactional "
            "ones; never dry runs), as long as the ledger keeps them (GATEKEEPER_LEDGER_DAYS). "
            "Decisions reach the ledger within seconds of the gate's answer. Follow `next` for "
            "older ones: pages are cut by position, not by offset, so decisions written "
            "meanwhile neither repeat nor shift a page. Reads the database only."
        ),
        parameters=[
            user_id_parameter(OpenApiParameter.PATH),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": PAGE_DEFAULT},
                OpenApiParameter.QUERY,
                description=f"Decisions per page: 1 to {PAGE_MAX} ({PAGE_DEFAULT} by default).",
            ),
            OpenApiParameter(
                "before",
                {"type": "string", "pattern": f"^{POSITION.pattern}$"},
                OpenApiParameter.QUERY,
                description=f"Only decisions after this position in the newest-first order. "
                f"{POSITION_WORDS}",
            ),
            OpenApiParameter(
                "channel",
                {"type": "string", "enum": channels()},
                OpenApiParameter.QUERY,
                description="Only this channel's decisions.",
            ),
            OpenApiParameter(
                "campaign",
                {"type": "string", "maxLength": CAMPAIGN_MAX, "pattern": NO_NUL},
                OpenApiParameter.QUERY,
                description="Only this campaign's decisions; empty: those of no campaign.",
            ),
            OpenApiParameter(
                "reason",
                {"type": "string", "enum": list(REASONS)},
                OpenApiParameter.QUERY,
                description="Only decisions of this reason.",
            ),
            *interval_parameters("Decisions"),
        ],
        responses={200: HistorySerializer, **errors(400)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        params = request.query_params
        uid = user_id_from_text(user_id, field="user_id", maximum=max_user_id())
        limit = _page_limit(params.get("limit"), default=PAGE_DEFAULT, maximum=PAGE_MAX)
        before = _history_before(params.get("before"))
        channel = params.get("channel")
        if channel is not None:
            validate_channel(channel, field="channel")
        campaign = _history_filter(params, "campaign")
        reason = _history_filter(params, "reason")
        since, until = interval_from_text(params.get("from"), params.get("to"))
        page = user_history(
            user_id=uid,
            limit=limit,
            before=before,
            channel=channel,
            campaign=campaign,
            reason=reason,
            since=since,
            until=until,
        )
        next_url = None
        if page.next is not None:
            following = params.copy()
            following["before"] = page.next.text()
            next_url = request.build_absolute_uri(f"{request.path}?{following.urlencode()}")
        results = [{**d, "at": instant_text(d["at"])} for d in page.decisions]
        return Response({"user_id": uid, "results": results, "next": next_url})


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


class CsvRenderer(BaseRenderer):
    """A report as CSV (decisions_csv: a header row, then a line per row): `table` gives the
    columns and rows of the report's data."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def table(self, data: Any) -> tuple[list[str], Iterable[Mapping[str, Any]]]:
        raise NotImplementedError

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        columns, rows = self.table(data)
        return decisions_csv(rows, columns=columns).encode()


class DecisionsCsvRenderer(CsvRenderer):
    """The decisions report: the grouped fields, then `count`, a line per row."""

    def table(self, data: Any) -> tuple[list[str], Iterable[Mapping[str, Any]]]:
        return [*data["group_by"], "count"], data["results"]


# The API's renderers (JSON, the browsable API; classes once DRF has imported them), and CSV.
REPORT_RENDERERS = [
    *cast(Sequence[type[BaseRenderer]], api_settings.DEFAULT_RENDERER_CLASSES),
    DecisionsCsvRenderer,
]
REPORT_FORMATS = ("json", "csv")
GROUP = f"(?:{'|'.join(GROUPS)})"


def _report_parameter(
    name: str, schema: dict[str, Any], description: str, *, repeated: bool = False
) -> OpenApiParameter:
    if repeated:
        schema = {"type": "array", "items": schema}
        description += f" Repeat it for several: `?{name}=a&{name}=b`."
    return OpenApiParameter(
        name,
        schema,
        OpenApiParameter.QUERY,
        description=description,
        style="form" if repeated else None,
        explode=True if repeated else None,
    )


def channel_filter(description: str) -> OpenApiParameter:
    """`?channel=`, repeated for several, as the ledger's readers take it."""
    return _report_parameter(
        "channel", {"type": "string", "enum": channels()}, description, repeated=True
    )


def campaign_filter(description: str) -> OpenApiParameter:
    """`?campaign=`, repeated for several, as the ledger's readers take it."""
    schema = {"type": "string", "maxLength": CAMPAIGN_MAX, "pattern": NO_NUL}
    return _report_parameter("campaign", schema, description, repeated=True)


class CsvReportView(JsonAPIView):
    """A report answered as JSON, or as CSV with `?format=csv` or `Accept: text/csv`
    (`csv_renderer`); an unknown format is a 400, and a refusal is JSON whatever was asked."""

    csv_renderer: type[BaseRenderer] = BaseRenderer

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # An unknown `?format=` is bad input, not DRF's 404 for a path that matches nothing.
        wanted = request.query_params.get(api_settings.URL_FORMAT_OVERRIDE or "format")
        if not force and wanted is not None and wanted not in REPORT_FORMATS:
            raise ValidationError(
                {"format": [f"Unknown format '{wanted[:40]}'. Choose json or csv."]}
            )
        return super().perform_content_negotiation(request, force)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # A refusal (400, 401, 403) is the API's JSON error body, also to a caller that asked
        # for CSV: negotiation happens before the rights are checked.
        if response.status_code >= 400 and isinstance(
            getattr(request, "accepted_renderer", None), self.csv_renderer
        ):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    def as_csv(self, request: Request) -> bool:
        return isinstance(request.accepted_renderer, self.csv_renderer)


class DecisionsReportView(CsvReportView):
    rights = {"GET": VIEW_REPORTS}
    operation_ids = {"GET": "decisions_report"}
    renderer_classes = REPORT_RENDERERS
    csv_renderer = DecisionsCsvRenderer

    @extend_schema(
        summary="How many gate decisions there were, by UTC day, campaign, segment, channel and "
        "reason",
        description=(
            "Counted from the send ledger's hourly counts: every decision of a marketing send "
            "and every exempt transactional one (reason `exempt`), never dry runs; decisions "
            "reach them within seconds of the gate's answer. Rows only for combinations that "
            "have decisions, ordered by the grouped fields. As CSV with `?format=csv` or "
            "`Accept: text/csv` (a header row, then a line per row; a campaign or segment that "
            "a spreadsheet would read as a formula starts with an apostrophe)."
        ),
        parameters=[
            _report_parameter(
                "from",
                {"type": "string", "format": "date"},
                f"The first UTC day (YYYY-MM-DD). Without `from` and `to`: the last "
                f"{DEFAULT_DAYS} days, today's included; with one of them, {DEFAULT_DAYS} days "
                "from `from` or up to `to` (fewer when the ledger keeps fewer). The ledger "
                "keeps GATEKEEPER_LEDGER_DAYS days "
                "(today's included): a range is at most that long and starts no earlier.",
            ),
            _report_parameter(
                "to", {"type": "string", "format": "date"}, "The last UTC day, included."
            ),
            _report_parameter(
                "group_by",
                {"type": "string", "pattern": f"^(?:{GROUP}(?:,{GROUP})*)?$"},
                f"Comma-separated, any of {', '.join(GROUPS)}: the columns, in this order, and "
                f"the rows sorted by them. Default: {','.join(DEFAULT_GROUP_BY)}. Empty: one "
                "row, the total.",
            ),
            campaign_filter("Only this campaign's decisions; empty: those of no campaign."),
            _report_parameter(
                "segment",
                {"type": "string", "maxLength": SEGMENT_MAX, "pattern": SLUG},
                "Only this segment's decisions (its slug).",
                repeated=True,
            ),
            channel_filter("Only this channel's decisions."),
            _report_parameter(
                "reason",
                {"type": "string", "enum": list(REASONS)},
                "Only decisions of this reason.",
                repeated=True,
            ),
            _report_parameter(
                "format",
                {"type": "string", "enum": list(REPORT_FORMATS)},
                "csv: the rows as CSV, as `Accept: text/csv` asks.",
            ),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(
                DecisionsReportSerializer, description="The report."
            ),
            (200, "text/csv"): OpenApiResponse(
                OpenApiTypes.STR, description="The report's rows as CSV, with a header row."
            ),
            # Refusals are JSON, whatever was asked for.
            **{(code, "application/json"): error for code, error in errors(400).items()},
        },
    )
    def get(self, request: Request) -> Response:
        query = decisions_query(dict(request.query_params.lists()))
        answer = {
            "from": query.start.isoformat(),
            "to": query.end.isoformat(),
            "group_by": list(query.group_by),
            "results": decisions_report(query=query),
        }
        response = Response(answer)
        if self.as_csv(request):
            response["Content-Disposition"] = f'attachment; filename="{report_filename(query)}"'
        return response


class StreamView(JsonAPIView):
    rights = {"GET": READ_STREAM}
    operation_ids = {"GET": "stream_read"}

    @extend_schema(
        summary="The event stream: every decision, outcome and change, in order, from a cursor",
        description=(
            "Every gate decision the ledger keeps, every send outcome, and every change of the "
            "suppression list and of people's preferences, in one order, from `after` (a "
            "position this answer gave as `next`; `0` for the start of what the ledger keeps, "
            "`end` for only what comes next). Kept as long as the ledger keeps its rows; an "
            "erased person's events are gone with their rows. An event read twice has the same "
            "`id`. Read on from `next` while `more`; at the end `next` is where new events "
            "will follow. The filters keep some events: by `type`, `channel` (suppressions "
            "of every channel and preference changes pass any), `campaign` (only decisions and "
            'outcomes). docs/api.md, "The event stream", lists each type\'s fields.'
        ),
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "string", "pattern": stream.POSITION_PATTERN},
                OpenApiParameter.QUERY,
                description=f"Where to read from: {stream.POSITION_WORDS}. Default: `0`.",
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": stream.PAGE_MAX},
                OpenApiParameter.QUERY,
                description=f"At most this many events (default {stream.PAGE_DEFAULT}).",
            ),
            _report_parameter(
                "type",
                {"type": "string", "enum": list(stream.EVENT_TYPES)},
                "Only these types.",
                repeated=True,
            ),
            channel_filter("Only these channels."),
            campaign_filter("Only the decisions and outcomes of these campaigns."),
        ],
        responses={200: StreamPageSerializer, **errors(400)},
    )
    def get(self, request: Request) -> HttpResponse:
        params = request.query_params
        problems: dict[str, list[str]] = {}
        after_text = params.get("after", "0")
        try:
            after = stream.position_from_text(after_text, field="after")
        except Problem as exc:
            problems.update(exc.field_errors())
        try:
            limit = _page_limit(
                params.get("limit"), default=stream.PAGE_DEFAULT, maximum=stream.PAGE_MAX
            )
        except Problem as exc:
            problems.update(exc.field_errors())
        wanted: dict[str, frozenset[str]] = {}
        for name, problem_of in (
            ("type", stream.type_problem),
            ("channel", FILTER_PROBLEMS["channel"]),
            ("campaign", FILTER_PROBLEMS["campaign"]),
        ):
            values = params.getlist(name)
            problem = next((p for p in map(problem_of, values) if p), None)
            if problem:
                problems[name] = [problem]
            wanted[name] = frozenset(values)
        if problems:
            raise Problems(problems)  # every one at once
        filters = stream.Filters(
            types=wanted["type"], channels=wanted["channel"], campaigns=wanted["campaign"]
        )
        page = stream.stream_read(after, limit, filters)
        body = page.json(next=str(page.next), more=page.more)
        return HttpResponse(body, content_type="application/json")
