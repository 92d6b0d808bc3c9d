"""REST views of topics (limits/engine/topics.py): listed, made, read, changed (never their slug)
and deleted through their authored kind, each change in the topic's history."""

from typing import Any

import msgspec
from django.db import IntegrityError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from gatekeeper.lib.api import JsonAPIView, errors
from gatekeeper.lib.bodies import decode
from gatekeeper.lib.permissions import ADD_TOPICS, CHANGE_TOPICS, DELETE_TOPICS, VIEW_TOPICS
from limits.engine.topics import TopicFields
from limits.models.policy import Topic
from limits.policy.bodies import TopicChangeBody, TopicCreateBody
from limits.policy.serializers import TopicSerializer, topics_shown
from limits.policy.services import TOPICS

TOPIC_SLUG = OpenApiParameter(
    "slug",
    {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$", "maxLength": 64},
    OpenApiParameter.PATH,
    description="The topic's slug.",
)
TOPIC_CHECKS = (
    "Checked whole by the one rule for topics (limits.engine.topics.topic_problems): a name people "
    "read, channels from settings each once (none: every channel), a default of subscribed, "
    "unsubscribed or required. Recorded in the topic's history."
)


def _found(slug: str) -> Topic:
    topic = Topic.objects.filter(slug=slug).first()
    if topic is None:
        raise NotFound(f"No topic '{slug[:70]}'.")
    return topic


def _taken(slug: str) -> Response:
    return Response({"detail": f"A topic '{slug}' exists already.", "field": "slug"}, status=409)


class TopicListView(JsonAPIView):
    rights = {"GET": VIEW_TOPICS, "POST": ADD_TOPICS}
    bodies = {"POST": TopicCreateBody}
    operation_ids = {"GET": "topics_list", "POST": "topic_create"}

    @extend_schema(
        summary="Every topic, by name", responses={200: TopicSerializer(many=True), **errors()}
    )
    def get(self, request: Request) -> Response:
        return Response(TopicSerializer(topics_shown(Topic.objects.all()), many=True).data)

    @extend_schema(
        summary="Create a topic (its slug taken: 409)",
        description=TOPIC_CHECKS,
        responses={201: TopicSerializer, **errors(400, 409, 413)},
    )
    def post(self, request: Request) -> Response:
        body = decode(request.data, TopicCreateBody)
        fields = TopicFields(**msgspec.structs.asdict(body))
        if Topic.objects.filter(slug=fields.slug).exists():
            return _taken(fields.slug)
        try:
            topic = TOPICS.create(fields=fields, user=request.user, via="api")
        except IntegrityError:  # made by another request since
            return _taken(fields.slug)
        return Response(TopicSerializer(topics_shown([topic])[0]).data, status=201)


class TopicDetailView(JsonAPIView):
    rights = {"GET": VIEW_TOPICS, "PATCH": CHANGE_TOPICS, "DELETE": DELETE_TOPICS}
    bodies = {"PATCH": TopicChangeBody}
    operation_ids = {"GET": "topic_get", "PATCH": "topic_change", "DELETE": "topic_delete"}

    @extend_schema(
        summary="One topic",
        parameters=[TOPIC_SLUG],
        responses={200: TopicSerializer, **errors(404)},
    )
    def get(self, request: Request, slug: str) -> Response:
        return Response(TopicSerializer(topics_shown([_found(slug)])[0]).data)

    @extend_schema(
        summary="Change some of a topic's fields (never its slug)",
        description=TOPIC_CHECKS,
        parameters=[TOPIC_SLUG],
        responses={200: TopicSerializer, **errors(400, 404, 413)},
    )
    def patch(self, request: Request, slug: str) -> Response:
        topic = _found(slug)
        body = decode(request.data, TopicChangeBody)
        changes: dict[str, Any] = msgspec.to_builtins(body)
        changed = TOPICS.update(row=topic, changes=changes, user=request.user, via="api")
        return Response(TopicSerializer(topics_shown([changed])[0]).data)

    @extend_schema(
        summary="Delete a topic", parameters=[TOPIC_SLUG], responses={204: None, **errors(404)}
    )
    def delete(self, request: Request, slug: str) -> Response:
        TOPICS.delete(row=_found(slug), user=request.user, via="api")
        return Response(status=204)
