"""REST views of cap rules and quiet hours."""

from typing import Any, TypeVar

import msgspec
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import DATABASE_MAX
from gatekeeper.lib.permissions import (
    ADD_QUIET_HOURS,
    ADD_RULES,
    CHANGE_QUIET_HOURS,
    CHANGE_RULES,
    DELETE_QUIET_HOURS,
    DELETE_RULES,
    VIEW_QUIET_HOURS,
    VIEW_RULES,
)
from limits.engine.quiet import SPREAD_MAX, QuietFields
from limits.models.policy import Authored, QuietHours, Rule
from limits.policy.authored import AuthoredKind
from limits.policy.bodies import (
    QuietHoursChangeBody,
    QuietHoursCreateBody,
    RuleChangeBody,
    RuleCreateBody,
)
from limits.policy.rules import rule_changes_given, rule_fields_of_json
from limits.policy.serializers import (
    QuietHoursSerializer,
    RuleSerializer,
    quiet_hours_shown,
    rules_shown,
)
from limits.policy.services import QUIET_HOURS, RULES

# --- rules ------------------------------------------------------------------------------------


def _given(body: RuleChangeBody | RuleCreateBody) -> dict[str, Any]:
    """The fields a body has, as JSON names them (a change's leaves out what it does not give:
    msgspec drops UNSET fields)."""
    given: dict[str, Any] = msgspec.to_builtins(body)
    return given


def _rule_changes(body: RuleChangeBody) -> dict[str, Any]:
    """The body's fields as changes of RuleFields (only those it has)."""
    return rule_changes_given(_given(body))


RowT = TypeVar("RowT", bound=Authored)


def _found(kind: AuthoredKind[RowT, Any], row_id: int) -> RowT:
    row = kind.find(row_id)
    if row is None:
        raise NotFound(f"No {kind.noun} {row_id}.")
    return row


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
        rule = RULES.create(fields=rule_fields_of_json(_given(body)), user=request.user, via="api")
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
        return Response(RuleSerializer(rules_shown([_found(RULES, rule_id)])[0]).data)

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
        rule = _found(RULES, rule_id)
        body = decode(request.data, RuleChangeBody)
        changed = RULES.update(row=rule, changes=_rule_changes(body), user=request.user, via="api")
        return Response(RuleSerializer(rules_shown([changed])[0]).data)

    @extend_schema(
        summary="Delete a cap rule (a classic cap's rule: 409)",
        parameters=[RULE_ID],
        responses={204: None, **errors(404, 409)},
    )
    def delete(self, request: Request, rule_id: int) -> Response:
        RULES.delete(row=_found(RULES, rule_id), user=request.user, via="api")
        return Response(status=204)


# --- quiet hours ------------------------------------------------------------------------------


QUIET_HOURS_ID = OpenApiParameter(
    "quiet_hours_id",
    {"type": "integer", "minimum": 1, "maximum": DATABASE_MAX},
    OpenApiParameter.PATH,
    description="The quiet hours' id.",
)
QUIET_HOURS_CHECKS = (
    "Checked whole by the one rule for quiet hours (limits.engine.quiet.quiet_problems): the segment "
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
        entry = QUIET_HOURS.create(fields=fields, user=request.user, via="api")
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
        entry = _found(QUIET_HOURS, quiet_hours_id)
        return Response(QuietHoursSerializer(quiet_hours_shown([entry])[0]).data)

    @extend_schema(
        summary="Change some of a quiet-hours entry's fields",
        description=QUIET_HOURS_CHECKS.replace("Checked whole", "Checked whole after the change"),
        parameters=[QUIET_HOURS_ID],
        responses={200: QuietHoursSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, quiet_hours_id: int) -> Response:
        entry = _found(QUIET_HOURS, quiet_hours_id)
        body = decode(request.data, QuietHoursChangeBody)
        changes = {
            name: value
            for name, value in msgspec.structs.asdict(body).items()
            if value is not msgspec.UNSET
        }
        changed = QUIET_HOURS.update(row=entry, changes=changes, user=request.user, via="api")
        return Response(QuietHoursSerializer(quiet_hours_shown([changed])[0]).data)

    @extend_schema(
        summary="Delete a quiet-hours entry",
        description="Recorded in the quiet hours' history.",
        parameters=[QUIET_HOURS_ID],
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, quiet_hours_id: int) -> Response:
        QUIET_HOURS.delete(row=_found(QUIET_HOURS, quiet_hours_id), user=request.user, via="api")
        return Response(status=204)


# --- the decisions report ---------------------------------------------------------------------


# --- the suppression list ---------------------------------------------------------------------
