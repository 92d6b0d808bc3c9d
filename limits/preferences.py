"""A person's own say over their marketing: per topic and channel subscribed or not, per
channel on or off, a pause of all their marketing until an instant, and pauses of single
channels (DESIGN.md, "Topics, preferences, ..."). Stored one row per person who said anything
(`Preference`); every change journaled (`PreferenceChange`) in commit order, as the
suppression list's are, so that every process can bring what it holds up to date by reading
the changes after the last one it has.

The one rule for valid preferences is `preferences_problems` (REST, the import, the preference
page): a topic that exists, on a channel it is sent on, never a `required` topic switched off;
channels from settings; a pause in the future, with its UTC offset. Choices about a topic that
was deleted since, and pauses that have ended, are dropped when preferences are read, so that a
change made later is never refused for them.

Writes go through `preferences_replace` (the whole of them) and `preferences_patch` (some):
each takes PreferenceLock, changes the person's row (deleted when nothing is left) and
journals the change with its source and who made it, in one transaction; a change that
changes nothing writes nothing.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from limits.channels import channels
from limits.models import Preference, PreferenceChange, PreferenceLock
from limits.topics import REQUIRED, TopicView

SOURCES = ("api", "import", "page", "admin")


@dataclass
class PreferencesFields:
    """A person's preferences, as a caller gives them and as they are stored."""

    topics: dict[str, dict[str, bool]] = field(default_factory=dict)
    channels: dict[str, bool] = field(default_factory=dict)
    paused_until: datetime | None = None
    paused_channels: dict[str, datetime] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.topics or self.channels or self.paused_until or self.paused_channels)


def preferences_problems(
    prefs: PreferencesFields, *, topics: Mapping[str, TopicView], now: datetime
) -> dict[str, list[str]]:
    """What is wrong with a person's preferences, by field (`topics.<topic>.<channel>`,
    `channels.<channel>`, `paused_until`, `paused_channels.<channel>`); empty when nothing is.
    `topics`: the topics there are."""
    problems: dict[str, list[str]] = {}
    known = channels()

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    def channel_known(name: str, channel: str) -> bool:
        if channel not in known:
            add(name, f"Unknown channel '{channel[:70]}'. Choose from: {', '.join(known)}.")
            return False
        return True

    for slug, choices in prefs.topics.items():
        topic = topics.get(slug)
        if topic is None:
            listed = ", ".join(sorted(topics)) or "none"
            add(f"topics.{slug[:70]}", f"No topic '{slug[:70]}'. Known: {listed}.")
            continue
        for channel, subscribed in choices.items():
            name = f"topics.{slug}.{channel[:70]}"
            if not channel_known(name, channel):
                continue
            if topic.channels and channel not in topic.channels:
                add(name, f"Topic '{slug}' is not sent on {channel}: it is on "
                    f"{', '.join(topic.channels)}.")  # fmt: skip
            elif topic.default == REQUIRED and not subscribed:
                add(name, f"Topic '{slug}' is required (notices no preference may block): it "
                    "cannot be switched off.")  # fmt: skip
    for channel in prefs.channels:
        channel_known(f"channels.{channel[:70]}", channel)
    pauses = [("paused_until", prefs.paused_until)] + [
        (f"paused_channels.{channel[:70]}", until)
        for channel, until in prefs.paused_channels.items()
        if channel_known(f"paused_channels.{channel[:70]}", channel)
    ]
    for name, until in pauses:
        if until is None:
            continue
        if until.tzinfo is None:
            add(name, "An instant with its UTC offset (2026-12-24T00:00:00+01:00 or ...Z).")
        elif until <= now:
            add(name, f"A pause ends in the future; {until.isoformat()} has passed.")
    return problems


def preferences_as_json(user_id: int, prefs: PreferencesFields) -> dict[str, Any]:
    """A person's preferences as the REST API shows them (and as their journal keeps them)."""
    return {
        "user_id": user_id,
        "topics": {slug: dict(sorted(c.items())) for slug, c in sorted(prefs.topics.items())},
        "channels": dict(sorted(prefs.channels.items())),
        "paused_until": _instant(prefs.paused_until),
        "paused_channels": {
            channel: _instant(until) for channel, until in sorted(prefs.paused_channels.items())
        },
    }


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def preferences_read(
    user_id: int, *, topics: Mapping[str, TopicView], now: datetime | None = None
) -> PreferencesFields:
    """A person's preferences as they stand: nothing said is empty; choices about topics
    deleted since (or channels no longer configured) and pauses that ended are left out."""
    row = Preference.objects.filter(user_id=user_id).first()
    return _standing(row, topics=topics, now=now or timezone.now())


def _standing(
    row: Preference | None, *, topics: Mapping[str, TopicView], now: datetime
) -> PreferencesFields:
    if row is None:
        return PreferencesFields()
    known = set(channels())
    kept_topics = {
        slug: {c: bool(v) for c, v in choices.items() if c in known}
        for slug, choices in (row.topics or {}).items()
        if slug in topics
    }
    paused = {
        channel: until
        for channel, text in (row.paused_channels or {}).items()
        if channel in known and (until := datetime.fromisoformat(text)) > now
    }
    return PreferencesFields(
        topics={slug: choices for slug, choices in kept_topics.items() if choices},
        channels={c: bool(v) for c, v in (row.channels or {}).items() if c in known},
        paused_until=row.paused_until if row.paused_until and row.paused_until > now else None,
        paused_channels=paused,
    )


def preferences_replace(
    *,
    user_id: int,
    prefs: PreferencesFields,
    topics: Mapping[str, TopicView],
    source: str,
    by: Any = None,
    now: datetime | None = None,
) -> PreferencesFields:
    """Replace a person's preferences whole. A ValidationError by field, nothing changed, for
    anything wrong with them."""
    return _write(user_id, lambda _: prefs, topics=topics, source=source, by=by, now=now)


def preferences_patch(
    *,
    user_id: int,
    changes: Mapping[str, Any],
    topics: Mapping[str, TopicView],
    source: str,
    by: Any = None,
    now: datetime | None = None,
) -> PreferencesFields:
    """Change some of a person's preferences: `changes` as a PATCH body has them, each key
    optional. `topics` and `channels` and `paused_channels` are merged choice by choice (a
    null takes one back to the default); `paused_until` replaces the pause (null: none)."""

    def merged(current: PreferencesFields) -> PreferencesFields:
        new_topics = {slug: dict(c) for slug, c in current.topics.items()}
        for slug, choices in (changes.get("topics") or {}).items():
            mine = new_topics.setdefault(slug, {})
            for channel, value in choices.items():
                if value is None:
                    mine.pop(channel, None)
                else:
                    mine[channel] = value
        return PreferencesFields(
            topics={slug: c for slug, c in new_topics.items() if c},
            channels=_merge(current.channels, changes.get("channels")),
            paused_until=changes.get("paused_until", current.paused_until),
            paused_channels=_merge(current.paused_channels, changes.get("paused_channels")),
        )

    return _write(user_id, merged, topics=topics, source=source, by=by, now=now)


def _merge(current: Mapping[str, Any], changes: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(current)
    for key, value in (changes or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _write(
    user_id: int,
    make: Any,
    *,
    topics: Mapping[str, TopicView],
    source: str,
    by: Any,
    now: datetime | None,
) -> PreferencesFields:
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    now = now or timezone.now()
    with transaction.atomic():
        if not PreferenceLock.objects.select_for_update().filter(pk=1).exists():
            PreferenceLock.objects.get_or_create(pk=1)
            PreferenceLock.objects.select_for_update().filter(pk=1).exists()
        row = Preference.objects.select_for_update().filter(user_id=user_id).first()
        current = _standing(row, topics=topics, now=now)
        new = make(current)
        problems = preferences_problems(new, topics=topics, now=now)
        if problems:
            raise ValidationError(problems)
        before = preferences_as_json(user_id, current)
        after = preferences_as_json(user_id, new)
        if before == after and (row is None) == new.empty():
            return new
        if new.empty():
            if row is not None:
                row.delete()
        else:
            row = row or Preference(user_id=user_id)
            row.topics = after["topics"]
            row.channels = after["channels"]
            row.paused_until = new.paused_until
            row.paused_channels = after["paused_channels"]
            row.save()
        if before != after:
            PreferenceChange.objects.create(
                user_id=user_id,
                before=before,
                after=after,
                source=source,
                changed_by=by
                if by is not None and getattr(by, "is_authenticated", False)
                else None,
            )
    return new
