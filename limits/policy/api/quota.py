"""REST view of a user's quota: the classic caps and every rule that applies, with their figures."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.ids import user_id_from_text
from gatekeeper.lib.permissions import VIEW_CAPS
from gatekeeper.lib.words import count
from gatekeeper.lib.zones import time_zone_checked
from limits.engine.table import MIN_RETENTION
from limits.policy.bodies import window_from_text
from limits.policy.quota import Unavailable, user_quota
from limits.policy.rules import CAMPAIGN_MAX, DURATION, DURATION_WORDS
from limits.policy.selectors import policy_cache
from limits.policy.serializers import QuotaSerializer
from segments.bodies import ZONE_MAX, ZONE_NAME
from segments.index import max_answerable_user_id


def _quota_time_zone(value: str | None) -> str | None:
    if value is None:
        return None
    time_zone_checked(value, field="time_zone")
    return value


def _quota_window(value: str | None) -> int | None:
    """The seconds of `?window=`: by the one rule for it, and within what the log keeps."""
    if value is None:
        return None
    seconds = window_from_text(value, field="window")
    kept = policy_cache().table().retention_ms // 1000
    if seconds > kept:
        days = count(kept // 86_400, "day")
        least = count(MIN_RETENTION.days, "day")
        raise ValidationError(
            {
                "window": [
                    f"The log keeps sends for {days} (the longest window of the enabled rules, "
                    f"{least} at least); {value} reaches further back."
                ]
            }
        )
    return seconds


def _quota_campaign(value: str | None) -> str:
    if value is not None and len(value) > CAMPAIGN_MAX:
        raise ValidationError({"campaign": [f"At most {CAMPAIGN_MAX} characters."]})
    return value or ""


class QuotaView(JsonAPIView):
    rights = {"GET": VIEW_CAPS}
    operation_ids = {"GET": "user_quota"}

    @extend_schema(
        summary="A user's segment and time zone, the classic caps per channel and `all`, and "
        "every rule that applies: used, limit, remaining, next slot",
        description="Reads only: nothing is recorded. 503 when Redis or the snapshot is missing.",
        parameters=[
            user_id_parameter(OpenApiParameter.PATH),
            OpenApiParameter(
                "time_zone",
                {"type": "string", "pattern": f"^{ZONE_NAME}$", "maxLength": ZONE_MAX},
                OpenApiParameter.QUERY,
                description="Read calendar windows in this IANA zone (Europe/Paris) instead of "
                "the user's segment's (or GATEKEEPER_DEFAULT_TIME_ZONE).",
            ),
            OpenApiParameter(
                "window",
                {"type": "string", "pattern": f"^(?:{DURATION.pattern})$"},
                OpenApiParameter.QUERY,
                description=f"Adds `sent`: the marketing sends per channel recorded in this "
                f"recent interval. {DURATION_WORDS} At most as far back as the log keeps "
                "sends (the longest window of the enabled rules, 7 days at least).",
            ),
            OpenApiParameter(
                "campaign",
                {"type": "string", "maxLength": CAMPAIGN_MAX},
                OpenApiParameter.QUERY,
                description="The campaign that per-campaign rules count; without it they show "
                "the campaign that used most.",
            ),
        ],
        responses={200: QuotaSerializer, **errors(400, 404, 503)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = user_id_from_text(user_id, field="user_id", maximum=max_answerable_user_id())
        time_zone = _quota_time_zone(request.query_params.get("time_zone"))
        window_seconds = _quota_window(request.query_params.get("window"))
        campaign = _quota_campaign(request.query_params.get("campaign"))
        try:
            answer = user_quota(
                uid, time_zone=time_zone, window_seconds=window_seconds, campaign=campaign
            )
        except Unavailable as exc:
            return Response({"detail": str(exc)}, status=503)
        return Response(answer)
