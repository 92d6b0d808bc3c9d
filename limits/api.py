"""REST views of caps, cap rules and quiet hours, and the decisions report."""

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import msgspec
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_slug
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import NO_NUL, decode
from gatekeeper.lib.ids import DATABASE_MAX, max_user_id, user_id_from_text, user_ids_checked
from gatekeeper.lib.integers import NotAWholeNumber, whole_number
from gatekeeper.lib.permissions import (
    ADD_QUIET_HOURS,
    ADD_RULES,
    ADD_SUPPRESSIONS,
    CHANGE_QUIET_HOURS,
    CHANGE_RULES,
    DELETE_QUIET_HOURS,
    DELETE_RULES,
    DELETE_SUPPRESSIONS,
    SET_CAPS,
    VIEW_CAPS,
    VIEW_QUIET_HOURS,
    VIEW_REPORTS,
    VIEW_RULES,
    VIEW_SUPPRESSIONS,
)
from limits.bodies import (
    CapBody,
    QuietHoursChangeBody,
    QuietHoursCreateBody,
    Reserve,
    RollingWindow,
    RuleChangeBody,
    RuleCreateBody,
    SuppressionAddBody,
    SuppressionRemoveBody,
    Window,
)
from limits.channels import ALL, channels, scopes, validate_scope
from limits.models import Cap, QuietHours, Rule, Suppression
from limits.policy import REASONS
from limits.quiet import SPREAD_MAX, QuietFields
from limits.reports import (
    CAMPAIGN_MAX,
    DEFAULT_DAYS,
    DEFAULT_GROUP_BY,
    GROUPS,
    SEGMENT_MAX,
    SLUG,
    decisions_csv,
    decisions_query,
    decisions_report,
    report_filename,
)
from limits.rules import RuleFields
from limits.serializers import (
    CapSerializer,
    DecisionsReportSerializer,
    QuietHoursSerializer,
    RuleSerializer,
    SuppressionAddedSerializer,
    SuppressionImportedSerializer,
    SuppressionImportErrorSerializer,
    SuppressionPageSerializer,
    SuppressionRemovedSerializer,
    SuppressionSerializer,
    quiet_hours_shown,
    rules_shown,
)
from limits.services import (
    ClassicRule,
    cap_set,
    quiet_create,
    quiet_delete,
    quiet_update,
    rule_create,
    rule_delete,
    rule_update,
)
from limits.suppression import REASONS as SUPPRESSION_REASONS
from limits.suppression import suppress, suppression_checked, suppression_import, unsuppress
from segments.api import RAW_LIST_BODY, RawListParser
from segments.parsing import UserListError
from segments.selectors import segment_by_slug


class CapListView(JsonAPIView):
    rights = {"GET": VIEW_CAPS}
    operation_ids = {"GET": "caps_list"}

    @extend_schema(summary="Every cap", responses={200: CapSerializer(many=True), **errors()})
    def get(self, request: Request) -> Response:
        caps = Cap.objects.select_related("segment").order_by("segment__priority", "channel")
        return Response(CapSerializer(caps, many=True).data)


class CapDetailView(JsonAPIView):
    rights = {"PUT": SET_CAPS}
    bodies = {"PUT": CapBody}
    operation_ids = {"PUT": "cap_set"}

    @extend_schema(
        summary="Set the daily and weekly caps of a segment on a channel (or `all`)",
        description="Both fields are required; null means no cap for that window, 0 no marketing.",
        parameters=[
            OpenApiParameter(
                "segment", {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"}, OpenApiParameter.PATH
            ),
            OpenApiParameter(
                "channel", {"type": "string", "enum": scopes()}, OpenApiParameter.PATH
            ),
        ],
        responses={200: CapSerializer, **errors(400, 404, 413)},
    )
    def put(self, request: Request, segment: str, channel: str) -> Response:
        # An unknown channel is a bad request (the schema lists them); a segment that does not
        # exist is a cap that cannot exist: 404.
        try:
            validate_scope(channel)
        except DjangoValidationError as exc:
            raise ValidationError({"channel": exc.messages}) from None
        try:
            validate_slug(segment)
        except DjangoValidationError:
            raise ValidationError(
                {"segment": ["A segment's slug is letters, digits, - and _."]}
            ) from None
        target = segment_by_slug(segment)
        if target is None:
            raise NotFound(f"No segment '{segment}'.")
        body = decode(request.data, CapBody)
        cap = cap_set(
            segment=target,
            channel=channel,
            daily=body.daily,
            weekly=body.weekly,
            user=request.user,
            via="api",
        )
        return Response(CapSerializer(cap).data)


# --- rules ------------------------------------------------------------------------------------


def _window_fields(window: Window) -> dict[str, Any]:
    if isinstance(window, RollingWindow):
        return {"window_kind": "rolling", "window_seconds": window.seconds, "window_unit": ""}
    return {"window_kind": "calendar", "window_seconds": None, "window_unit": window.unit}


def _reserve_fields(reserve: Reserve | None) -> dict[str, Any]:
    return {
        "reserve_below_priority": reserve.below_priority if reserve is not None else None,
        "reserve_slots": reserve.slots if reserve is not None else None,
    }


def _rule_fields(body: RuleCreateBody) -> RuleFields:
    return RuleFields(
        name=body.name,
        segment=body.segment,
        channel=body.channel,
        match=body.match,
        tag=body.tag or "",
        limit=body.limit,
        enabled=body.enabled,
        **_window_fields(body.window),
        **_reserve_fields(body.reserve),
    )


def _rule_changes(body: RuleChangeBody) -> dict[str, Any]:
    """The body's fields as changes of RuleFields (only those it has)."""
    given = {
        name: value
        for name, value in msgspec.structs.asdict(body).items()
        if value is not msgspec.UNSET
    }
    changes: dict[str, Any] = {}
    for name, value in given.items():
        if name == "window":
            changes.update(_window_fields(value))
        elif name == "reserve":
            changes.update(_reserve_fields(value))
        elif name == "tag":
            changes["tag"] = value or ""
        else:
            changes[name] = value
    if "match" in given and given["match"] != "tag" and "tag" not in given:
        # A rule that stops counting a tag forgets it, rather than being refused for keeping it.
        changes["tag"] = ""
    return changes


RowT = TypeVar("RowT", Rule, QuietHours)


def _classic(exc: ClassicRule) -> Response:
    return Response({"detail": exc.message_dict["non_field_errors"][0]}, status=409)


def _row_or_404(model: type[RowT], row_id: int, what: str) -> RowT:
    # Ids beyond what the database holds (a 64-bit column) are no row, not an overflow.
    row = None
    if 0 < row_id <= DATABASE_MAX:
        row = model.objects.select_related("segment").filter(pk=row_id).first()
    if row is None:
        raise NotFound(f"No {what} {row_id}.")
    return row


def _rule_or_404(rule_id: int) -> Rule:
    return _row_or_404(Rule, rule_id, "rule")


RULE_ID = OpenApiParameter(
    "rule_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The rule's id.",
)


class RuleListView(JsonAPIView):
    rights = {"GET": VIEW_RULES, "POST": ADD_RULES}
    bodies = {"POST": RuleCreateBody}
    operation_ids = {"GET": "rules_list", "POST": "rule_create"}

    @extend_schema(
        summary="Every cap rule (the classic caps' included), in the rules list's order",
        responses={200: RuleSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        rules = Rule.objects.select_related("segment").order_by("id")
        return Response(RuleSerializer(rules_shown(rules), many=True).data)

    @extend_schema(
        summary="Create a cap rule",
        description=(
            "Checked whole: a tag rule needs its tag (and only a tag rule takes one), a "
            "reserve keeps at most the limit, the segment must exist. Recorded in the rule's "
            "history."
        ),
        responses={201: RuleSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, RuleCreateBody)
        rule = rule_create(fields=_rule_fields(body), user=request.user, via="api")
        return Response(RuleSerializer(rules_shown([rule])[0]).data, status=201)


class RuleDetailView(JsonAPIView):
    rights = {"GET": VIEW_RULES, "PATCH": CHANGE_RULES, "DELETE": DELETE_RULES}
    bodies = {"PATCH": RuleChangeBody}
    operation_ids = {"GET": "rule_get", "PATCH": "rule_change", "DELETE": "rule_delete"}

    @extend_schema(
        summary="One cap rule",
        parameters=[RULE_ID],
        responses={200: RuleSerializer, **errors(404)},
    )
    def get(self, request: Request, rule_id: int) -> Response:
        return Response(RuleSerializer(rules_shown([_rule_or_404(rule_id)])[0]).data)

    @extend_schema(
        summary="Change some of a rule's fields (a classic cap's rule: 409)",
        description=(
            "The rule is checked whole after the change. A classic cap's rule changes only with "
            "its cap: PUT /api/v1/limits/<segment>/<channel>/."
        ),
        parameters=[RULE_ID],
        responses={200: RuleSerializer, **errors(400, 404, 409, 413)},
    )
    def patch(self, request: Request, rule_id: int) -> Response:
        rule = _rule_or_404(rule_id)
        body = decode(request.data, RuleChangeBody)
        try:
            changed = rule_update(
                rule=rule, changes=_rule_changes(body), user=request.user, via="api"
            )
        except ClassicRule as exc:
            return _classic(exc)
        return Response(RuleSerializer(rules_shown([changed])[0]).data)

    @extend_schema(
        summary="Delete a cap rule (a classic cap's rule: 409)",
        parameters=[RULE_ID],
        responses={204: None, **errors(404, 409)},
    )
    def delete(self, request: Request, rule_id: int) -> Response:
        try:
            rule_delete(rule=_rule_or_404(rule_id), user=request.user, via="api")
        except ClassicRule as exc:
            return _classic(exc)
        return Response(status=204)


# --- quiet hours ------------------------------------------------------------------------------


def _quiet_or_404(entry_id: int) -> QuietHours:
    return _row_or_404(QuietHours, entry_id, "quiet hours")


QUIET_HOURS_ID = OpenApiParameter(
    "quiet_hours_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The quiet hours' id.",
)
QUIET_HOURS_CHECKS = (
    "Checked whole by the one rule for quiet hours (limits.quiet.quiet_problems): the segment "
    "must exist, times are HH:MM, the end differs from the start, and the spread is 0 to "
    f"{SPREAD_MAX} minutes and shorter than the part of the day outside the quiet hours. "
    "Recorded in the quiet hours' history; governs every process within "
    "GATEKEEPER_CAPS_TTL_SECONDS."
)


class QuietHoursListView(JsonAPIView):
    rights = {"GET": VIEW_QUIET_HOURS, "POST": ADD_QUIET_HOURS}
    bodies = {"POST": QuietHoursCreateBody}
    operation_ids = {"GET": "quiet_hours_list", "POST": "quiet_hours_create"}

    @extend_schema(
        summary="Every quiet-hours entry, by id",
        responses={200: QuietHoursSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        entries = QuietHours.objects.select_related("segment").order_by("id")
        return Response(QuietHoursSerializer(quiet_hours_shown(entries), many=True).data)

    @extend_schema(
        summary="Create quiet hours",
        description=QUIET_HOURS_CHECKS,
        responses={201: QuietHoursSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, QuietHoursCreateBody)
        fields = QuietFields(**msgspec.structs.asdict(body))
        entry = quiet_create(fields=fields, user=request.user, via="api")
        return Response(QuietHoursSerializer(quiet_hours_shown([entry])[0]).data, status=201)


class QuietHoursDetailView(JsonAPIView):
    rights = {"GET": VIEW_QUIET_HOURS, "PATCH": CHANGE_QUIET_HOURS, "DELETE": DELETE_QUIET_HOURS}
    bodies = {"PATCH": QuietHoursChangeBody}
    operation_ids = {
        "GET": "quiet_hours_get",
        "PATCH": "quiet_hours_change",
        "DELETE": "quiet_hours_delete",
    }

    @extend_schema(
        summary="One quiet-hours entry",
        parameters=[QUIET_HOURS_ID],
        responses={200: QuietHoursSerializer, **errors(404)},
    )
    def get(self, request: Request, quiet_hours_id: int) -> Response:
        entry = _quiet_or_404(quiet_hours_id)
        return Response(QuietHoursSerializer(quiet_hours_shown([entry])[0]).data)

    @extend_schema(
        summary="Change some of a quiet-hours entry's fields",
        description=QUIET_HOURS_CHECKS.replace("Checked whole", "Checked whole after the change"),
        parameters=[QUIET_HOURS_ID],
        responses={200: QuietHoursSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, quiet_hours_id: int) -> Response:
        entry = _quiet_or_404(quiet_hours_id)
        body = decode(request.data, QuietHoursChangeBody)
        changes = {
            name: value
            for name, value in msgspec.structs.asdict(body).items()
            if value is not msgspec.UNSET
        }
        changed = quiet_update(entry=entry, changes=changes, user=request.user, via="api")
        return Response(QuietHoursSerializer(quiet_hours_shown([changed])[0]).data)

    @extend_schema(
        summary="Delete a quiet-hours entry",
        description="Recorded in the quiet hours' history.",
        parameters=[QUIET_HOURS_ID],
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, quiet_hours_id: int) -> Response:
        quiet_delete(entry=_quiet_or_404(quiet_hours_id), user=request.user, via="api")
        return Response(status=204)


# --- the decisions report ---------------------------------------------------------------------


class DecisionsCsvRenderer(BaseRenderer):
    """The decisions report as CSV: a header row (the grouped fields, then `count`), a line per
    row."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        columns = [*data["group_by"], "count"]
        return decisions_csv(data["results"], columns=columns).encode()


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


class DecisionsReportView(JsonAPIView):
    rights = {"GET": VIEW_REPORTS}
    operation_ids = {"GET": "decisions_report"}
    renderer_classes = REPORT_RENDERERS

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
            getattr(request, "accepted_renderer", None), DecisionsCsvRenderer
        ):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

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
            _report_parameter(
                "campaign",
                {"type": "string", "maxLength": CAMPAIGN_MAX, "pattern": NO_NUL},
                "Only this campaign's decisions; empty: those of no campaign.",
                repeated=True,
            ),
            _report_parameter(
                "segment",
                {"type": "string", "maxLength": SEGMENT_MAX, "pattern": SLUG},
                "Only this segment's decisions (its slug).",
                repeated=True,
            ),
            _report_parameter(
                "channel",
                {"type": "string", "enum": channels()},
                "Only this channel's decisions.",
                repeated=True,
            ),
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
        if isinstance(request.accepted_renderer, DecisionsCsvRenderer):
            response["Content-Disposition"] = f'attachment; filename="{report_filename(query)}"'
        return response


# --- the suppression list ---------------------------------------------------------------------

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
    try:
        return whole_number(text, maximum=SUPPRESSIONS_PAGE_MAX, minimum=1, what="A page size")
    except NotAWholeNumber as exc:
        raise ValidationError({"limit": [str(exc)]}) from None


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
            try:
                before = whole_number(
                    params["before"], maximum=DATABASE_MAX, minimum=1, what="A position"
                )
            except NotAWholeNumber as exc:
                raise ValidationError({"before": [str(exc)]}) from None
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
            return Response({"file": ["Send the list as the request body."], "line": None}, 400)
        try:
            imported = suppression_import(
                channel=channel, fileobj=stream, reason=reason, source="import", by=request.user
            )
        except UserListError as exc:
            return Response({"file": exc.messages, "line": exc.line}, status=400)
        return Response({"channel": channel, **imported})
