"""How many people switched each topic off, and back on, per UTC day, from the journal of
preference changes (`PreferenceChange`): the dashboard's opt-outs by topic.

A person switched a topic off on a day when a change of theirs took one of its channels from
on to off, and back on when one went from off to on. On or off as the gate reads it: what they
said about the topic on that channel, else the topic's default (`topic_on_unless_said`), so a
person's first "no" to a topic everyone gets counts, and so does taking back a "yes" to one
people must ask for. A person counts once a day per topic and direction, however often they
switched. Topics as they are now: their channels, their default; required topics cannot be
switched off and are left out; a channel switched off as a whole, or a pause, is no topic's.

One grouped query, bounded to the days asked for (the journal's index on `changed_at`); per
topic and channel the database reads two booleans from each change's JSON.
"""

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, cast

from django.db import NotSupportedError
from django.db.models import CharField, Count, F, Func, Q, Value
from django.db.models.functions import Coalesce, TruncDate
from django.db.models.lookups import Exact
from django.utils import timezone

from limits.channels import channels
from limits.engine.topics import REQUIRED, TopicView, topic_on_unless_said, topic_problem
from limits.models.people import PreferenceChange

ON, OFF = "true", "false"  # a switch as the query reads it: JSON's own words for the booleans


class JsonBoolean(Func):
    """'true' or 'false' for the boolean at `keys` in a JSON column, NULL when there is none.
    Each key is an object's key: Django's own key transforms read a key of digits as a
    position in an array, and a topic's slug may be digits alone."""

    output_field = CharField()

    def __init__(self, column: str, *keys: str) -> None:
        super().__init__(F(column))
        self.keys = keys

    def as_sql(self, *args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError("JSON booleans are read on SQLite and PostgreSQL only.")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        column, params = compiler.compile(self.source_expressions[0])
        path = "$" + "".join(f".{json.dumps(key)}" for key in self.keys)
        return (
            f"CASE JSON_TYPE({column}, %s) WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END",
            (*params, path),
        )

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        column, params = compiler.compile(self.source_expressions[0])
        at = f"{column} #> CAST(%s AS text[])"
        return (
            f"CASE WHEN JSONB_TYPEOF({at}) = 'boolean' THEN {column} #>> CAST(%s AS text[]) END",
            (*params, list(self.keys), *params, list(self.keys)),
        )


def _switched(topic: TopicView, channel: str, *, was: str, became: str) -> Q:
    default = Value(ON if topic_on_unless_said(topic) else OFF)
    before = Coalesce(JsonBoolean("before", "topics", topic.slug, channel), default)
    after = Coalesce(JsonBoolean("after", "topics", topic.slug, channel), default)
    return Q(Exact(before, Value(was))) & Q(Exact(after, Value(became)))


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def topic_switches(
    *, topics: Mapping[str, TopicView], days: int, now: datetime | None = None
) -> dict[str, Any] | None:
    """Per topic (by slug) and UTC day of the last `days` (today's included), how many people
    switched it off and back on; None when nobody switched any. `days`: the days as dates;
    `topics`: those anyone switched, each with `off` and `on` per day and their totals; `rows`:
    every day and topic with a switch, newest first (a table's lines)."""
    now = now or timezone.now()
    last = now.astimezone(UTC).date()
    dates = [last - timedelta(days=n) for n in reversed(range(days))]
    counted: list[TopicView] = []
    counts: dict[str, Count] = {}
    for topic in (topics[slug] for slug in sorted(topics)):
        sent_on = [c for c in channels() if topic_problem(topics, topic.slug, c) is None]
        if topic.default == REQUIRED or not sent_on:
            continue
        went_off, came_on = Q(), Q()
        for channel in sent_on:
            went_off |= _switched(topic, channel, was=ON, became=OFF)
            came_on |= _switched(topic, channel, was=OFF, became=ON)
        n = len(counted)
        counts[f"off_{n}"] = Count("user_id", distinct=True, filter=went_off)
        counts[f"on_{n}"] = Count("user_id", distinct=True, filter=came_on)
        counted.append(topic)
    if not counted:
        return None
    found = (
        PreferenceChange.objects.filter(
            changed_at__gte=_midnight(dates[0]),
            changed_at__lt=_midnight(last + timedelta(days=1)),
            # A change to nothing at all (no "after") says nothing about what they want.
            after__isnull=False,
        )
        .annotate(day=TruncDate("changed_at", tzinfo=UTC))
        .values("day")
        .annotate(**counts)
        .order_by("day")
    )
    place = {day: n for n, day in enumerate(dates)}
    per_topic: dict[str, dict[str, list[int]]] = {
        topic.slug: {"off": [0] * days, "on": [0] * days} for topic in counted
    }
    for row in cast(Iterable[dict[str, Any]], found):
        at = place[row["day"]]
        for n, topic in enumerate(counted):
            per_topic[topic.slug]["off"][at] = row[f"off_{n}"]
            per_topic[topic.slug]["on"][at] = row[f"on_{n}"]
    series: list[dict[str, Any]] = [
        {"slug": slug, **values, "off_total": sum(values["off"]), "on_total": sum(values["on"])}
        for slug, values in per_topic.items()
        if any(values["off"]) or any(values["on"])
    ]
    if not series:
        return None
    rows = [
        {"day": day, "slug": s["slug"], "off": s["off"][at], "on": s["on"][at]}
        for at, day in reversed(list(enumerate(dates)))
        for s in series
        if s["off"][at] or s["on"][at]
    ]
    return {
        "days": dates,
        "topics": series,
        "rows": rows,
        "off_total": sum(s["off_total"] for s in series),
        "on_total": sum(s["on_total"] for s in series),
    }
