"""REST view of outcome events (limits/studies.py): the company's systems post what people did
(orders, sign-ups), counted for the experiments report."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import max_user_id, user_ids_checked
from gatekeeper.lib.permissions import POST_EVENTS
from limits.bodies import EVENTS_MAX, EventsBody
from limits.studies import Event, event_problems, events_record


class EventsRecordedSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(help_text="Events new to Gatekeeper.")
    repeated = serializers.IntegerField(
        help_text="Events whose id was seen before (or twice in this request): counted once."
    )
    counted = serializers.IntegerField(
        help_text="Of the accepted, those of a user in a running study (an experiment or the "
        "control group) when it happened: the others count for nothing."
    )


class EventsView(JsonAPIView):
    rights = {"POST": POST_EVENTS}
    bodies = {"POST": EventsBody}
    operation_ids = {"POST": "events_post"}
    # 10,000 events of up to about 400 bytes each (an id of 200 characters).
    max_body_bytes = 8 * 2**20
    body_limit_reason = f"{EVENTS_MAX:,} events"

    @extend_schema(
        summary="Post outcome events (conversions) for the experiments report",
        description=f"Up to {EVENTS_MAX:,} events a request, idempotent by `event_id` (within "
        "GATEKEEPER_EVENTS_DEDUP_DAYS: a retry counts once). Each counts, by UTC day, for "
        "every running study its user is in (from the day they entered it: their first "
        "marketing decision while it ran); events are kept only as those counts. An event "
        "from the future (beyond an hour) or from before GATEKEEPER_EVENTS_DEDUP_DAYS is a 400 "
        "naming it (`events.3.at`), and nothing of the request is counted.",
        responses={200: EventsRecordedSerializer, **errors(400, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, EventsBody)
        users = user_ids_checked(
            [e.user_id for e in body.events], field="events", item="user_id", maximum=max_user_id()
        )
        events = [
            Event(e.event_id, user, e.name, e.at, e.value)
            for e, user in zip(body.events, users, strict=True)
        ]
        problems = event_problems(events, now=timezone.now())
        if problems:
            raise ValidationError(problems)
        with transaction.atomic():
            recorded = events_record(events)
        return Response(EventsRecordedSerializer(recorded).data)
