"""REST views of the event stream's webhook endpoints (limits/stream/webhooks.py): listed, made,
read with their last deliveries, changed (paused, resumed, moved, a new secret) and deleted."""

from typing import Any

import msgspec
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.permissions import (
    ADD_WEBHOOKS,
    CHANGE_WEBHOOKS,
    DELETE_WEBHOOKS,
    READ_STREAM,
    VIEW_WEBHOOKS,
)
from gatekeeper.lib.problems import Problem, Problems
from limits.ledger.api import _page_limit, _report_parameter, campaign_filter, channel_filter
from limits.ledger.reports import (
    FILTER_PROBLEMS,
)
from limits.models.stream import WebhookEndpoint
from limits.stream import events as stream
from limits.stream.bodies import WebhookChangeBody, WebhookCreateBody
from limits.stream.serializers import StreamPageSerializer, WebhookSerializer
from limits.stream.webhooks import (
    WebhookFields,
    recent_deliveries,
    webhook_change,
    webhook_create,
    webhook_delete,
    webhook_shown,
)

WEBHOOK_ID = OpenApiParameter(
    "webhook_id", int, OpenApiParameter.PATH, description="The endpoint's id."
)
CHECKS = (
    "Checked whole by the one rule for endpoints (limits.stream.webhooks.webhook_problems): an "
    "http or https URL, event types, channels from settings and campaigns each once. The "
    'events are POSTed as `{"events": [...]}` (GET /api/v1/stream/\'s events), signed as '
    'Standard Webhooks sign (docs/api.md, "Webhooks").'
)


def _found(webhook_id: int) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(pk=webhook_id).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint {webhook_id}.")
    return endpoint


def _shown(endpoint: WebhookEndpoint, *, deliveries: bool = False) -> dict[str, Any]:
    shown = webhook_shown(endpoint)
    if deliveries:
        shown["deliveries"] = [
            {
                "at": d.at, "message_id": d.message_id, "events": d.events, "ok": d.ok,
                "status_code": d.status_code, "error": d.error, "milliseconds": d.milliseconds,
            }
            for d in recent_deliveries(endpoint)
        ]  # fmt: skip
    return shown


class WebhookListView(JsonAPIView):
    rights = {"GET": VIEW_WEBHOOKS, "POST": ADD_WEBHOOKS}
    bodies = {"POST": WebhookCreateBody}
    operation_ids = {"GET": "webhooks_list", "POST": "webhook_create"}

    @extend_schema(
        summary="The event stream's webhook endpoints",
        responses={200: WebhookSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        return Response([_shown(e) for e in WebhookEndpoint.objects.order_by("id")])

    @extend_schema(
        summary="Add a webhook endpoint: the stream's events POSTed to it, signed",
        description=CHECKS + " It starts active, with a new secret, from `start`.",
        responses={201: WebhookSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, WebhookCreateBody)
        fields = WebhookFields(
            url=body.url, description=body.description, types=tuple(body.types),
            channels=tuple(body.channels), campaigns=tuple(body.campaigns),
        )  # fmt: skip
        endpoint = webhook_create(fields=fields, by=request.user, start=body.start, via="api")
        return Response(_shown(endpoint), status=201)


class WebhookDetailView(JsonAPIView):
    rights = {"GET": VIEW_WEBHOOKS, "PATCH": CHANGE_WEBHOOKS, "DELETE": DELETE_WEBHOOKS}
    bodies = {"PATCH": WebhookChangeBody}
    operation_ids = {"GET": "webhook_get", "PATCH": "webhook_change", "DELETE": "webhook_delete"}

    @extend_schema(
        summary="One webhook endpoint, with its last 20 deliveries",
        parameters=[WEBHOOK_ID],
        responses={200: WebhookSerializer, **errors(404)},
    )
    def get(self, request: Request, webhook_id: int) -> Response:
        return Response(_shown(_found(webhook_id), deliveries=True))

    @extend_schema(
        summary="Change a webhook endpoint: its fields, paused or resumed, its position, a new "
        "secret",
        description=CHECKS,
        parameters=[WEBHOOK_ID],
        responses={200: WebhookSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, webhook_id: int) -> Response:
        endpoint = _found(webhook_id)
        body = decode(request.data, WebhookChangeBody)
        changes = msgspec.structs.asdict(body)
        given = {k: v for k, v in changes.items() if v is not msgspec.UNSET}
        fields = None
        if given.keys() & {"url", "description", "types", "channels", "campaigns"}:
            fields = WebhookFields(
                url=given.get("url", endpoint.url),
                description=given.get("description", endpoint.description),
                types=tuple(given.get("types", endpoint.types)),
                channels=tuple(given.get("channels", endpoint.channels)),
                campaigns=tuple(given.get("campaigns", endpoint.campaigns)),
            )
        changed = webhook_change(
            endpoint, fields=fields, active=given.get("active"), start=given.get("start"),
            new_secret=body.new_secret, by=request.user, via="api",
        )  # fmt: skip
        return Response(_shown(changed, deliveries=True))

    @extend_schema(
        summary="Delete a webhook endpoint (its deliveries with it)",
        parameters=[WEBHOOK_ID],
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, webhook_id: int) -> Response:
        webhook_delete(_found(webhook_id), by=request.user, via="api")
        return Response(status=204)


class StreamView(JsonAPIView):
    rights = {"GET": READ_STREAM}
    operation_ids = {"GET": "stream_read"}

    @extend_schema(
        summary="The event stream: every decision, outcome and change, in order, from a cursor",
        description=(
            "Every gate decision the ledger keeps, every send outcome, every change of the "
            "suppression list and of people's preferences, and every address a provider said "
            "is dead, in one order, from `after` (a "
            "position this answer gave as `next`; `0` for the start of what the ledger keeps, "
            "`end` for only what comes next). Kept as long as the ledger keeps its rows; an "
            "erased person's events are gone with their rows. An event read twice has the same "
            "`id`. Read on from `next` while `more`; at the end `next` is where new events "
            "will follow. The filters keep some events: by `type`, `channel` (suppressions "
            "of every channel and preference changes pass any), `campaign` (only decisions, "
            'outcomes and dead addresses). docs/api.md, "The event stream", lists each type\'s fields.'
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
            campaign_filter("Only the decisions, outcomes and dead addresses of these campaigns."),
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
