"""REST view of a person's preferences (limits/people/preferences.py): read, replaced whole, or some
of them changed; each change journaled with its source."""

from typing import Annotated, Any

import msgspec
from drf_spectacular.utils import OpenApiParameter, extend_schema
from msgspec import UNSET, Meta, UnsetType
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors, user_id_parameter
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.ids import JsonUserId, max_user_id, user_id_from_text
from gatekeeper.lib.permissions import CHANGE_PREFERENCES, VIEW_PREFERENCES
from limits.people.bodies import PreferencesBody, PreferencesChangeBody
from limits.people.preferences import (
    PreferencesFields,
    preferences_as_json,
    preferences_given,
    preferences_patch,
    preferences_read,
    preferences_replace,
    preferences_user_id,
)
from limits.people.serializers import PreferencesSerializer
from limits.policy.selectors import topics_read

CHECKS = (
    "Checked by the one rule for preferences (limits.people.preferences.preferences_problems): topics "
    "that exist, on channels they are sent on, a required topic never switched off, channels "
    "from settings, pauses in the future with their UTC offset, a frequency (their own) on a "
    "window of a rule, at most a week (any 7 days, or a calendar week) or the longest window "
    "the rules count, and tighter than every rule on everyone on its channel; a 400 names each "
    "bad choice (`topics.product-news.sms`) and nothing changes. `user_id` may be sent back as "
    "a GET answers it (the path's), or left out; another person's is a 400 naming `user_id`. "
    "Journaled with source `api`."
)

# A body's `user_id`: what a GET answers, so that the answer can be sent back as it is.
PathUserId = Annotated[
    JsonUserId,
    Meta(
        description="The user id in the path (what a GET answers), as a number or its digits; "
        "may be left out. Another person's is a 400 naming `user_id`."
    ),
]


class PreferencesReplaceBody(PreferencesBody, kw_only=True):
    """A person's preferences, whole (what is left out is the default), as a GET answers
    them."""

    user_id: PathUserId | UnsetType = UNSET


class PreferencesPatchBody(PreferencesChangeBody, kw_only=True):
    """Some of a person's preferences, merged choice by choice into theirs; a null takes a
    choice back to the default (`paused_until`: null ends the pause)."""

    user_id: PathUserId | UnsetType = UNSET


def _user(user_id: str) -> int:
    return user_id_from_text(user_id, field="user_id", maximum=max_user_id())


def _shown(user_id: int, prefs: PreferencesFields) -> Response:
    return Response(PreferencesSerializer(preferences_as_json(user_id, prefs)).data)


USER = user_id_parameter(OpenApiParameter.PATH)


class PreferencesView(JsonAPIView):
    rights = {"GET": VIEW_PREFERENCES, "PUT": CHANGE_PREFERENCES, "PATCH": CHANGE_PREFERENCES}
    bodies = {"PUT": PreferencesReplaceBody, "PATCH": PreferencesPatchBody}
    operation_ids = {
        "GET": "preferences_get",
        "PUT": "preferences_replace",
        "PATCH": "preferences_change",
    }

    @extend_schema(
        summary="A person's preferences (empty when they said nothing)",
        parameters=[USER],
        responses={200: PreferencesSerializer, **errors(400)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        uid = _user(user_id)
        return _shown(uid, preferences_read(uid, topics=topics_read()))

    @extend_schema(
        summary="Replace a person's preferences whole",
        description=CHECKS,
        parameters=[USER],
        responses={200: PreferencesSerializer, **errors(400, 413)},
    )
    def put(self, request: Request, user_id: str) -> Response:
        uid = _user(user_id)
        body = decode(request.data, PreferencesReplaceBody)
        preferences_user_id(body.user_id, path=uid)  # a 400 naming user_id if not the path's
        saved = preferences_replace(
            user_id=uid,
            prefs=preferences_given(body),
            topics=topics_read(),
            source="api",
            by=request.user,
        )
        return _shown(uid, saved)

    @extend_schema(
        summary="Change some of a person's preferences (a null takes a choice back to the default)",
        description=CHECKS,
        parameters=[USER],
        responses={200: PreferencesSerializer, **errors(400, 413)},
    )
    def patch(self, request: Request, user_id: str) -> Response:
        uid = _user(user_id)
        body = decode(request.data, PreferencesPatchBody)
        preferences_user_id(body.user_id, path=uid)  # a 400 naming user_id if not the path's
        changes: dict[str, Any] = {
            name: getattr(body, name)
            for name in PreferencesChangeBody.__struct_fields__
            if getattr(body, name) is not msgspec.UNSET
        }
        if changes.get("frequency") is not None:
            changes["frequency"] = msgspec.to_builtins(changes["frequency"])
        saved = preferences_patch(
            user_id=uid, changes=changes, topics=topics_read(), source="api", by=request.user
        )
        return _shown(uid, saved)
