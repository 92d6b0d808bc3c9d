"""REST views of deliverability's settings (worker/delivery/mailbox_settings.py): the mailbox
providers (listed, made, read with the email waiting for their brake, changed, deleted, and a
paused one resumed) and the sending domains' warm-up plans (listed, made, read with today's
figures, changed, deleted). Every write goes through the one write path and its history."""

from typing import Any

import msgspec
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import DATABASE_MAX
from gatekeeper.lib.permissions import (
    ADD_MAILBOX_PROVIDERS,
    ADD_WARMUPS,
    CHANGE_MAILBOX_PROVIDERS,
    CHANGE_WARMUPS,
    DELETE_MAILBOX_PROVIDERS,
    DELETE_WARMUPS,
    VIEW_MAILBOX_PROVIDERS,
    VIEW_WARMUPS,
)
from worker.bodies_mailboxes import (
    MailboxProviderChangeBody,
    MailboxProviderCreateBody,
    RateBody,
    WarmupChangeBody,
    WarmupCreateBody,
)
from worker.delivery.mailbox_reads import (
    braked_waiting_count,
    braked_waiting_counts,
    warmup_today,
)
from worker.delivery.mailbox_settings import (
    mailbox_change,
    mailbox_create,
    mailbox_delete,
    mailbox_resume,
    mailbox_shown,
    warmup_change,
    warmup_create,
    warmup_delete,
    warmup_shown,
)
from worker.delivery.warmup import plan_of
from worker.models import MailboxProvider, WarmupPlan
from worker.serializers_mailboxes import MailboxProviderSerializer, WarmupSerializer

SLUG = OpenApiParameter(
    "slug", str, OpenApiParameter.PATH, description="The mailbox provider's slug (gmail, ...)."
)
WARMUP_ID = OpenApiParameter("warmup_id", int, OpenApiParameter.PATH, description="The plan's id.")
GROUP_CHECKS = (
    "Checked whole by the one rule for groups (worker.delivery.mailboxes.mailbox_problems): a "
    "domain in one group only, `other` naming none (it takes every domain no group names), "
    "each dispatcher's rate once with at least one period. A bad field is a 400 naming it, "
    "and nothing is stored. Every process reads the groups again within 5 s."
)
WARMUP_CHECKS = (
    "Checked whole by the one rule for plans (worker.delivery.warmup.warmup_problems): a "
    "sending domain with one plan only, a time zone this server knows, groups that exist, "
    "each day's volume at least 1. A bad field is a 400 naming it, and nothing is stored."
)


def _group(slug: str) -> MailboxProvider:
    row = MailboxProvider.objects.filter(slug=slug).first()
    if row is None:
        raise NotFound(f"No mailbox provider {slug!r}.")
    return row


def _plan(warmup_id: int) -> WarmupPlan:
    row = WarmupPlan.objects.filter(pk=warmup_id).first() if warmup_id <= DATABASE_MAX else None
    if row is None:
        raise NotFound(f"No warm-up plan {warmup_id}.")
    return row


def _group_shown(row: MailboxProvider, waiting: int | None = None) -> dict[str, Any]:
    shown = mailbox_shown(row)
    shown["waiting"] = braked_waiting_count(row.slug) if waiting is None else waiting
    return shown


def _plan_shown(row: WarmupPlan) -> dict[str, Any]:
    return {**warmup_shown(row), "over": plan_of(row).over, "today": warmup_today(row)}


def _messages(value: float | None) -> float | int | None:
    return int(value) if value is not None and value.is_integer() else value


def _rates(rates: list[RateBody]) -> list[dict[str, Any]]:
    return [
        {
            "dispatcher": rate.dispatcher,
            "per_second": _messages(rate.per_second),
            "per_minute": _messages(rate.per_minute),
            "per_hour": _messages(rate.per_hour),
        }
        for rate in rates
    ]


def _given(body: msgspec.Struct) -> dict[str, Any]:
    return {
        name: value
        for name, value in msgspec.structs.asdict(body).items()
        if value is not msgspec.UNSET
    }


class MailboxProviderListView(JsonAPIView):
    rights = {"GET": VIEW_MAILBOX_PROVIDERS, "POST": ADD_MAILBOX_PROVIDERS}
    bodies = {"POST": MailboxProviderCreateBody}
    operation_ids = {"GET": "mailbox_providers_list", "POST": "mailbox_provider_create"}

    @extend_schema(
        summary="The mailbox providers: groups of recipient domains, their rates and brakes",
        responses={200: MailboxProviderSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        rows = list(MailboxProvider.objects.order_by("slug"))
        waiting = braked_waiting_counts(row.slug for row in rows)
        return Response([_group_shown(row, waiting[row.slug]) for row in rows])

    @extend_schema(
        summary="Add a mailbox provider",
        description=GROUP_CHECKS + " At most 50 groups; a slug taken is a 400 naming `slug`.",
        responses={201: MailboxProviderSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, MailboxProviderCreateBody)
        fields = {**_given(body), "rates": _rates(body.rates)}
        row = mailbox_create(fields, by=request.user, via="api")
        return Response(_group_shown(row, 0), status=201)


class MailboxProviderDetailView(JsonAPIView):
    rights = {
        "GET": VIEW_MAILBOX_PROVIDERS,
        "PATCH": CHANGE_MAILBOX_PROVIDERS,
        "DELETE": DELETE_MAILBOX_PROVIDERS,
    }
    bodies = {"PATCH": MailboxProviderChangeBody}
    operation_ids = {
        "GET": "mailbox_provider_get",
        "PATCH": "mailbox_provider_change",
        "DELETE": "mailbox_provider_delete",
    }

    @extend_schema(
        summary="One mailbox provider, with the email waiting for its brake",
        parameters=[SLUG],
        responses={200: MailboxProviderSerializer, **errors(404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        return Response(_group_shown(_group(slug)))

    @extend_schema(
        summary="Change a mailbox provider: its name, domains, MX hosts or rates",
        description=GROUP_CHECKS + " Its slug never changes (a body naming it is a 400).",
        parameters=[SLUG],
        responses={200: MailboxProviderSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, slug: str) -> Response:
        row = _group(slug)
        body = decode(request.data, MailboxProviderChangeBody)
        changes = _given(body)
        if body.rates is not msgspec.UNSET:
            changes["rates"] = _rates(body.rates)
        return Response(_group_shown(mailbox_change(row, changes, by=request.user, via="api")))

    @extend_schema(
        summary="Delete a mailbox provider: its domains fall in `other`",
        description="Its waiting email is handed out at once. `other` cannot be deleted, nor a "
        "group a warm-up plan names: a 400 naming `slug`.",
        parameters=[SLUG],
        responses={204: None, **errors(400, 404)},
    )
    def delete(self, request: Request, slug: str) -> Response:
        mailbox_delete(_group(slug), by=request.user, via="api")
        return Response(status=204)


class MailboxProviderResumeView(JsonAPIView):
    rights = {"POST": CHANGE_MAILBOX_PROVIDERS}
    operation_ids = {"POST": "mailbox_provider_resume"}

    @extend_schema(
        summary="Resume a mailbox provider its brake paused; the group, as it is now",
        description="Its waiting email is handed out at once, and the brake counts only mail "
        "sent from now on. Recorded in the settings' history. A 409 naming `paused` when it is "
        "not paused.",
        parameters=[SLUG],
        request=None,
        responses={200: MailboxProviderSerializer, **errors(404, 409)},
    )
    def post(self, request: Request, slug: str) -> Response:
        row = mailbox_resume(_group(slug), by=request.user, via="api")
        return Response(_group_shown(row))


class WarmupListView(JsonAPIView):
    rights = {"GET": VIEW_WARMUPS, "POST": ADD_WARMUPS}
    bodies = {"POST": WarmupCreateBody}
    operation_ids = {"GET": "warmups_list", "POST": "warmup_create"}

    @extend_schema(
        summary="The sending domains' warm-up plans, each with today's figures",
        responses={200: WarmupSerializer(many=True), **errors()},
    )
    def get(self, request: Request) -> Response:
        return Response([_plan_shown(row) for row in WarmupPlan.objects.order_by("domain")])

    @extend_schema(
        summary="Add a warm-up plan",
        description=WARMUP_CHECKS + " Without `volumes`, every group but `other` gets the "
        "default ramp (50 a day doubling, to 700,000 on day 20).",
        responses={201: WarmupSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, WarmupCreateBody)
        row = warmup_create(_given(body), by=request.user, via="api")
        return Response(_plan_shown(row), status=201)


class WarmupDetailView(JsonAPIView):
    rights = {"GET": VIEW_WARMUPS, "PATCH": CHANGE_WARMUPS, "DELETE": DELETE_WARMUPS}
    bodies = {"PATCH": WarmupChangeBody}
    operation_ids = {"GET": "warmup_get", "PATCH": "warmup_change", "DELETE": "warmup_delete"}

    @extend_schema(
        summary="One warm-up plan, with today's figures",
        parameters=[WARMUP_ID],
        responses={200: WarmupSerializer, **errors(404)},
    )
    def get(self, request: Request, warmup_id: int) -> Response:
        return Response(_plan_shown(_plan(warmup_id)))

    @extend_schema(
        summary="Change a warm-up plan",
        description=WARMUP_CHECKS + " A group whose ramp changes starts it again; what waits "
        "for the plan is looked at again under the change at once.",
        parameters=[WARMUP_ID],
        responses={200: WarmupSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, warmup_id: int) -> Response:
        row = _plan(warmup_id)
        body = decode(request.data, WarmupChangeBody)
        return Response(_plan_shown(warmup_change(row, _given(body), by=request.user, via="api")))

    @extend_schema(
        summary="Delete a warm-up plan: its domain's email is held no more",
        parameters=[WARMUP_ID],
        responses={204: None, **errors(404)},
    )
    def delete(self, request: Request, warmup_id: int) -> Response:
        warmup_delete(_plan(warmup_id), by=request.user, via="api")
        return Response(status=204)
