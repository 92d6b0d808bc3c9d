"""REST views of the send ledger: a user's decision history and the decisions report
(JSON or CSV)."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import NO_NUL
from gatekeeper.lib.ids import max_user_id, user_id_from_text
from gatekeeper.lib.instants import instant_text
from gatekeeper.lib.integers import whole_number
from gatekeeper.lib.permissions import (
    VIEW_CAPS,
    VIEW_REPORTS,
)
from limits.channels import channels, validate_channel
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
from limits.ledger.serializers import DecisionsReportSerializer, HistorySerializer
from limits.policy.rules import CAMPAIGN_MAX
from limits.reasons import REASONS


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
