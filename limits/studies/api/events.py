"""REST view of outcome events (limits/studies/measures.py): the company's systems post what people
did (orders, sign-ups), taken into the ledger's stream and counted by its drain for the experiments
report."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import max_user_id, user_ids_checked
from gatekeeper.lib.permissions import POST_EVENTS
from gatekeeper.lib.problems import Problems
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.policy.quota import redis_unavailable
from limits.studies.bodies import EVENTS_MAX, EventsBody
from limits.studies.measures import Event, event_problems, events_taken


class EventsTakenSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(
        help_text="Events taken: the ledger's drain counts each within seconds, once."
    )
    repeated = serializers.IntegerField(
        help_text="Events whose id was counted before (or is twice in this request): not "
        "taken again."
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
        "GATEKEEPER_EVENTS_DEDUP_DAYS: a retry counts once). 202: the events are in the "
        "ledger's stream, behind every decision made before them; its drain counts each, by "
        "UTC day, for every running study its user is in (from the day they entered it: their "
        "first marketing decision while it ran), within seconds, however far the drain lags. "
        "Events are kept only as those counts. An event from the future (beyond an hour) or "
        "from before GATEKEEPER_EVENTS_DEDUP_DAYS is a 400 naming it (`events.3.at`), and "
        "nothing of the request is taken; 503 when Redis does not answer (post them again).",
        responses={202: EventsTakenSerializer, **errors(400, 413, 503)},
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
            raise Problems(problems)
        try:
            taken = events_taken(events)
        except REDIS_DOWN as exc:
            return Response({"detail": str(redis_unavailable(exc))}, status=503)
        return Response(EventsTakenSerializer(taken).data, status=202)
