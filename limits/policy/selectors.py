"""Reads of caps and rules, with the in-process cache every gate call uses."""

import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from limits.engine.assignment import HoldoutView
from limits.engine.quiet import quiet_view
from limits.engine.table import ARM, ArmView, ExperimentView, PolicyTable, RuleView, arm_rule_id
from limits.engine.topics import TopicView, topic_view
from limits.models.people import Preference
from limits.models.policy import Cap, Holdout, QuietHours, Rule, Topic
from limits.models.studies import Experiment
from limits.policy.rules import rule_fields_of_json, rule_findings, rule_read, rule_view_of
from segments.models import Segment


def holdout_view() -> HoldoutView | None:
    """The group as the gate reads it, or None when there is none (and the studies' drain)."""
    row = Holdout.objects.filter(pk=1).first()
    if row is None or row.share <= 0:
        return None
    return HoldoutView(
        share=row.share,
        salt=row.salt,
        exclude_segments=frozenset(row.exclude_segments or ()),
        exclude_tags=frozenset(row.exclude_tags or ()),
    )


def rule_view(rule: Rule) -> RuleView:
    """A stored rule as decisions read it."""
    return rule_view_of(rule_read(rule), id=rule.pk, classic=rule.cap_id is not None)


def rules_findings() -> dict[int, list[str]]:
    """What a marketer should know about the enabled rules, per rule id (limits.policy.rules)."""
    enabled = [
        rule_view(rule) for rule in Rule.objects.filter(enabled=True).select_related("segment")
    ]
    names = dict(Segment.objects.values_list("slug", "name"))
    return rule_findings(enabled, segment_names=names)


def policy_read(*, rules: list[Rule] | None = None) -> PolicyTable:
    """Every enabled rule (in the rules list's order), the classic caps, the segments' time
    zones, the enabled quiet hours and the topics, straight from the database. `rules`: use these
    instead of the enabled ones (what-if over draft rules)."""
    if rules is None:
        rules = list(Rule.objects.filter(enabled=True).select_related("segment"))
    classic = {
        (segment, channel): (daily, weekly)
        for segment, channel, daily, weekly in Cap.objects.values_list(
            "segment__slug", "channel", "daily", "weekly"
        )
    }
    zones = dict(Segment.objects.values_list("slug", "time_zone"))
    quiet = QuietHours.objects.filter(enabled=True).select_related("segment")
    return PolicyTable(
        rules=tuple(rule_view(rule) for rule in rules),
        classic=classic,
        zones=zones,
        quiet=tuple(quiet_view(entry) for entry in quiet),
        topics=topics_read(),
        own_keeps_ms=own_keeps_ms(),
        holdout=holdout_view(),
        experiments=experiments_view(),
    )


def experiments_view(now: datetime | None = None) -> tuple[ExperimentView, ...]:
    """The experiments the gate may apply (active and not yet ended), as it reads them."""
    now = now or timezone.now()
    rows = (
        Experiment.objects.filter(state=Experiment.State.ACTIVE, ends_at__gt=now)
        .select_related("segment")
        .prefetch_related("arms")
    )
    views = []
    for row in rows:
        slug = row.segment.slug if row.segment is not None else None
        arms = []
        for arm in row.arms.all():
            rules = []
            for place, data in enumerate(arm.rules):
                fields = rule_fields_of_json(data)
                fields.segment = slug
                view = rule_view_of(fields, id=arm_rule_id(arm.pk, place))
                rules.append(replace(view, kind=ARM))
            arms.append(ArmView(name=arm.name, mode=arm.mode, rules=tuple(rules)))
        views.append(
            ExperimentView(
                id=row.pk,
                segment=slug,
                salt=row.salt,
                starts_ms=int(row.starts_at.timestamp() * 1000),
                ends_ms=int(row.ends_at.timestamp() * 1000),
                shares=tuple(arm.share for arm in row.arms.all()),
                arms=tuple(arms),
            )
        )
    return tuple(views)


def own_keeps_ms() -> int:
    """The longest window of any person's own frequency, in ms (0: nobody has one): an index's
    one entry (the partial index on `keeps_seconds`)."""
    longest = Preference.objects.filter(keeps_seconds__gt=0).aggregate(m=Max("keeps_seconds"))
    return int(longest["m"] or 0) * 1000


def topics_read() -> dict[str, TopicView]:
    """Every topic as the gate reads it, by slug, straight from the database."""
    return {topic.slug: topic_view(topic) for topic in Topic.objects.all()}


@dataclass
class _Cached:
    table: PolicyTable
    read_at: float


class PolicyCache:
    """Rules, caps and zones kept in process for `ttl` seconds.

    Every gate call needs them; reading them from the database each time would cost more than
    the limiter itself. A short TTL bounds how long an edit made in the admin or over the API
    takes to govern decisions in every process (no restart, no signal needed).
    """

    def __init__(self, *, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cached: _Cached | None = None

    def table(self, *, monotonic: float | None = None) -> PolicyTable:
        """The table, read again once `ttl` seconds of the process's monotonic clock (given:
        tests) have passed since the last read."""
        now = time.monotonic() if monotonic is None else monotonic
        cached = self._cached
        if cached is not None and now - cached.read_at < self.ttl:
            return cached.table
        with self._lock:
            cached = self._cached
            if cached is None or now - cached.read_at >= self.ttl:
                cached = _Cached(table=policy_read(), read_at=now)
                self._cached = cached
        return cached.table

    @classmethod
    def holding(cls, table: PolicyTable) -> "PolicyCache":
        """A cache that always answers `table`, never the database (benchmarks, the what-if's
        drafts)."""
        cache = cls(ttl=float("inf"))
        cache._cached = _Cached(table=table, read_at=time.monotonic())
        return cache

    def invalidate(self) -> None:
        self._cached = None


_policy_cache: PolicyCache | None = None


def policy_cache_invalidate_on_commit(**kwargs: object) -> None:
    """A signal receiver: a segment saved or deleted changes the rules' table (its time zone,
    its rules); this process reads it again once the change is committed, the others within
    the cache's TTL."""
    transaction.on_commit(policy_cache().invalidate)


def policy_cache() -> PolicyCache:
    global _policy_cache
    if _policy_cache is None:
        _policy_cache = PolicyCache(ttl=settings.GATEKEEPER_CAPS_TTL_SECONDS)
    return _policy_cache
