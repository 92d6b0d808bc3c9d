"""Shapes of the REST answers of caps, rules, quiet hours, topics and a user's quota (see
limits/policy/api/)."""

from collections.abc import Iterable
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from gatekeeper.lib.bodies import openapi_components
from limits.engine.quiet import CLOCK, SPREAD_MAX, quiet_as_json, quiet_describe, quiet_view
from limits.engine.topics import DEFAULTS, topic_as_json, topic_json_describe
from limits.models.policy import Cap, QuietHours, Rule, Topic
from limits.policy.bodies import Reserve, Window
from limits.policy.rules import MATCHES, rule_as_json, rule_describe
from limits.policy.selectors import rule_view, rules_findings
from limits.policy.services import cap_describe, cap_warnings


class CapSerializer(serializers.ModelSerializer):
    segment = serializers.SlugRelatedField(slug_field="slug", read_only=True)  # type: ignore[var-annotated]
    description = serializers.SerializerMethodField(help_text="The cap in plain words.")
    warnings = serializers.SerializerMethodField(
        help_text="Allowed but probably a mistake, e.g. a weekly cap below the daily one."
    )

    class Meta:
        model = Cap
        fields = ["segment", "channel", "daily", "weekly", "description", "warnings", "updated_at"]

    def get_description(self, cap: Cap) -> str:
        return cap_describe(channel=cap.channel, daily=cap.daily, weekly=cap.weekly)

    def get_warnings(self, cap: Cap) -> list[str]:
        return cap_warnings(daily=cap.daily, weekly=cap.weekly)


class BodyShapedField(serializers.Field):
    """An answer's value shaped as a request body's type (a rule's window, its reserve): shown
    as it is, and described in the schema by the same components as the body."""

    def __init__(self, spec: Any, **kwargs: Any) -> None:
        self.spec = spec
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return value


class BodyShapedFieldExtension(OpenApiSerializerFieldExtension):
    target_class = BodyShapedField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        schema, components = openapi_components(self.target.spec)
        for name, component in components.items():
            auto_schema.registry.register_on_missing(
                ResolvedComponent(name, ResolvedComponent.SCHEMA, schema=component, object=name)
            )
        return schema


class RuleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    segment = serializers.CharField(
        allow_null=True, help_text="A segment's slug; null: every segment."
    )
    channel = serializers.CharField(help_text='A channel, or "all": every channel together.')
    match = serializers.ChoiceField(choices=MATCHES)
    tag = serializers.CharField(allow_null=True, help_text="The tag a tag rule counts.")
    window = BodyShapedField(Window)
    limit = serializers.IntegerField(help_text="Most sends in the window; 0 blocks them all.")
    reserve = BodyShapedField(Reserve, allow_null=True, help_text="null: no reserve.")
    enabled = serializers.BooleanField()
    classic = serializers.BooleanField(
        help_text="One of a classic cap's two rules: it changes only with its cap "
        "(PUT /api/v1/limits/<segment>/<channel>/)."
    )
    description = serializers.CharField(help_text="The rule in plain words.")
    findings = serializers.ListField(
        child=serializers.CharField(),
        help_text="What to know about it among the enabled rules: it never decides (a stricter "
        "rule always applies with it), or its reserve shuts lower priorities out.",
    )
    created_at = serializers.DateTimeField()
    changed_at = serializers.DateTimeField()


def rules_shown(rules: Iterable[Rule]) -> list[dict[str, Any]]:
    """Rules as the REST API answers them (RuleSerializer's fields), with the findings of the
    enabled rules as they stand."""
    findings = rules_findings()
    shown = []
    for rule in rules:
        name = rule.segment.name if rule.segment is not None else None
        shown.append(
            {
                **rule_as_json(rule),
                "description": rule_describe(rule_view(rule), segment_name=name),
                "findings": findings.get(rule.pk, []),
                "created_at": rule.created_at,
                "changed_at": rule.changed_at,
            }
        )
    return shown


class QuietHoursSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    segment = serializers.CharField(
        allow_null=True, help_text="A segment's slug; null: every segment."
    )
    channel = serializers.CharField(help_text='A channel, or "all": every channel.')
    start = serializers.RegexField(
        f"^{CLOCK.pattern}$", help_text="When the quiet hours start (HH:MM, the user's clock)."
    )
    end = serializers.RegexField(
        f"^{CLOCK.pattern}$",
        help_text="When they end (HH:MM); before the start, the next morning.",
    )
    spread_minutes = serializers.IntegerField(
        min_value=0,
        max_value=SPREAD_MAX,
        help_text="Held sends go out over this many minutes after the end (0: at once).",
    )
    enabled = serializers.BooleanField()
    description = serializers.CharField(help_text="The quiet hours in plain words.")
    created_at = serializers.DateTimeField()
    changed_at = serializers.DateTimeField()


def quiet_hours_shown(entries: Iterable[QuietHours]) -> list[dict[str, Any]]:
    """Quiet hours as the REST API answers them (QuietHoursSerializer's fields)."""
    entries = list(entries)
    names = {e.segment.slug: e.segment.name for e in entries if e.segment is not None}
    return [
        {
            **quiet_as_json(entry),
            "description": quiet_describe(quiet_view(entry), segment_names=names),
            "created_at": entry.created_at,
            "changed_at": entry.changed_at,
        }
        for entry in entries
    ]


class WindowQuotaSerializer(serializers.Serializer):
    used = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True)
    remaining = serializers.IntegerField(allow_null=True)


class ScopeQuotaSerializer(serializers.Serializer):
    daily = WindowQuotaSerializer()
    weekly = WindowQuotaSerializer()
    next_slot_in = serializers.FloatField(
        allow_null=True, help_text="Seconds until a slot frees, when full."
    )


class ExperimentArmSerializer(serializers.Serializer):
    """The running experiment the user is in, and their arm."""

    id = serializers.IntegerField(help_text="Its id in GET /api/v1/experiments/.")
    arm = serializers.CharField(help_text="The arm's name.")


class RuleQuotaSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="Below 0: a rule of the user's experiment arm.")
    kind = serializers.ChoiceField(
        choices=["rule", "arm"], help_text="rule: a marketer's rule; arm: their arm's."
    )
    name = serializers.CharField()
    channel = serializers.CharField(help_text='A channel, or "all".')
    description = serializers.CharField(help_text="The rule in plain words.")
    match = serializers.ChoiceField(choices=MATCHES)
    tag = serializers.CharField(allow_null=True)
    window = BodyShapedField(Window)
    limit = serializers.IntegerField()
    used = serializers.IntegerField(
        help_text="Sends it counts now (a per-campaign rule: of ?campaign=, else of the "
        "campaign that used most)."
    )
    remaining = serializers.IntegerField()
    next_slot_in = serializers.FloatField(
        allow_null=True, help_text="Seconds until a slot frees, when full."
    )
    reserve = BodyShapedField(Reserve, allow_null=True)
    classic = serializers.BooleanField(help_text="One of a classic cap's two rules.")


class QuotaSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    segment = serializers.CharField()
    snapshot_version = serializers.CharField()
    time_zone = serializers.CharField(
        help_text="The zone its calendar windows are read in: ?time_zone=, else the segment's, "
        "else GATEKEEPER_DEFAULT_TIME_ZONE."
    )
    experiment = ExperimentArmSerializer(
        allow_null=True,
        help_text="The running experiment the user is in and their arm (whose rules are "
        "among `rules`); null: none.",
    )
    scopes = serializers.DictField(
        child=ScopeQuotaSerializer(), help_text="The classic caps: each channel, and `all`."
    )
    rules = RuleQuotaSerializer(
        many=True, help_text="Every enabled rule that applies to the user, on every channel."
    )
    sent = serializers.DictField(
        child=serializers.IntegerField(),
        required=False,
        help_text="Only with ?window=: per channel, the marketing sends recorded in it.",
    )


class TopicSerializer(serializers.Serializer):
    slug = serializers.SlugField(help_text="Never changes: sends and preferences name it.")
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    channels = serializers.ListField(
        child=serializers.CharField(), help_text="The channels it is sent on; empty: every one."
    )
    default = serializers.ChoiceField(choices=list(DEFAULTS))
    reading = serializers.CharField(help_text="The topic in plain words.")
    created_at = serializers.DateTimeField()
    changed_at = serializers.DateTimeField()


def topics_shown(topics: Iterable[Topic]) -> list[dict[str, Any]]:
    """Topics as the REST API answers them (TopicSerializer's fields)."""
    return [
        {
            **(data := topic_as_json(topic)),
            "reading": topic_json_describe(data),
            "created_at": topic.created_at,
            "changed_at": topic.changed_at,
        }
        for topic in topics
    ]
