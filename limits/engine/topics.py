"""Topics: what a marketing send is about (a newsletter, product news, offers, a legal notice),
as the marketer defines them, so that a person can say which they want on which channel.

A topic has a slug (it never changes: sends and people's preferences name it), a name and a
description in the words a person reads on their preference page, the channels it is sent on
(none listed: every channel) and a default: `subscribed` (a person gets it until they say
otherwise), `unsubscribed` (only once they ask for it) or `required` (notices no preference can
block, such as a change of terms). The one rule for a valid topic is `topic_problems` (REST,
admin and commands); the authored stack (limits/policy/authored.py) writes topics and keeps their
history, as it does rules and quiet hours.
"""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from limits.channels import channel_problem, channels, noun

SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")
SLUG_WORDS = "A slug is 1 to 64 letters, digits, - and _ (sends and preferences name it)."
NAME_MAX = 200
DESCRIPTION_MAX = 5000
SUBSCRIBED, UNSUBSCRIBED, REQUIRED = "subscribed", "unsubscribed", "required"
DEFAULTS = (SUBSCRIBED, UNSUBSCRIBED, REQUIRED)
DEFAULT_WORDS = {
    SUBSCRIBED: "everyone gets it until they switch it off",
    UNSUBSCRIBED: "only those who switch it on get it",
    REQUIRED: "everyone gets it; no preference can switch it off",
}


@dataclass
class TopicFields:
    """A topic's editable fields, as a caller gives them (the REST body, an admin form)."""

    slug: str
    name: str
    description: str = ""
    channels: list[str] = field(default_factory=list)  # none: every channel
    default: str = SUBSCRIBED


def topic_problems(fields: TopicFields, *, segments: Iterable[str] = ()) -> dict[str, list[str]]:
    """What is wrong with a topic, by field (the REST API's names); empty when nothing is. The
    one rule for topics: REST, admin and commands all use it. (`segments`: unused, as every
    authored kind is asked with them.)"""
    problems: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    if not SLUG.fullmatch(fields.slug):
        add("slug", f"'{fields.slug[:70]}' is not a slug. {SLUG_WORDS}")
    name = fields.name.strip()
    if not name or "\x00" in fields.name:
        add("name", "A topic needs a name people read on their preference page.")
    elif len(fields.name) > NAME_MAX:
        add("name", f"At most {NAME_MAX} characters; {len(fields.name)} given.")
    if len(fields.description) > DESCRIPTION_MAX or "\x00" in fields.description:
        add("description", f"At most {DESCRIPTION_MAX} characters, and no NUL.")
    seen: set[str] = set()
    for i, channel in enumerate(fields.channels):
        if (unknown := channel_problem(channel)) is not None:
            add("channels", f"channels[{i}]: {unknown}")
        elif channel in seen:
            add("channels", f"channels[{i}]: '{channel}' is listed twice.")
        seen.add(channel)
    if fields.default not in DEFAULTS:
        add("default", f"'{fields.default[:70]}' is not a default. Choose one of: "
            f"{', '.join(DEFAULTS)}.")  # fmt: skip
    return problems


def topic_read(topic: Any) -> TopicFields:
    """A stored topic's editable fields (the base of a partial change)."""
    return TopicFields(
        slug=topic.slug,
        name=topic.name,
        description=topic.description,
        channels=list(topic.channels or []),
        default=topic.default,
    )


def topic_apply(topic: Any, fields: TopicFields, segment: Any = None) -> None:
    """Put checked fields on a topic row; its channels in the settings' order."""
    known = channels()
    topic.slug = fields.slug
    topic.name = fields.name.strip()
    topic.description = fields.description
    topic.channels = sorted(set(fields.channels), key=known.index)
    topic.default = fields.default


def topic_as_json(topic: Any) -> dict[str, Any]:
    """A topic as the REST API shows it (and as its history keeps it)."""
    return {
        "slug": topic.slug,
        "name": topic.name,
        "description": topic.description,
        "channels": list(topic.channels or []),
        "default": topic.default,
    }


def channels_words(chosen: Sequence[str]) -> str:
    return ", ".join(noun(c, 2) for c in chosen) if chosen else "every channel"


def topic_json_describe(data: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """A topic (as topic_as_json has it) in plain words: 'Product news, on emails and push
    notifications: everyone gets it until they switch it off'."""
    default = DEFAULT_WORDS.get(str(data.get("default")), str(data.get("default")))
    return f"{data.get('name')}, on {channels_words(data.get('channels') or [])}: {default}"


def topic_value_words(key: str, value: Any, names: Mapping[str, str] | None = None) -> str:
    """One field of a topic as its history keeps it, in words."""
    if key == "channels":
        return channels_words(value or [])
    return "none" if value in (None, "") else str(value)


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic as the gate reads it (in the rules' table, limits.engine.table.PolicyTable)."""

    slug: str
    channels: tuple[str, ...]  # none: every channel
    default: str


def topic_view(topic: Any) -> TopicView:
    return TopicView(slug=topic.slug, channels=tuple(topic.channels or ()), default=topic.default)


def topic_on_unless_said(topic: TopicView) -> bool:
    """Whether a person who said nothing about `topic` on a channel gets it there: yes unless
    people must ask for it (`unsubscribed`)."""
    return topic.default != UNSUBSCRIBED


def topic_problem(topics: Mapping[str, TopicView], slug: str, channel: str) -> str | None:
    """The one rule for a send's topic (gate calls, send jobs): None when `slug` names a topic
    sent on `channel`, else why not."""
    topic = topics.get(slug)
    if topic is None:
        known = (
            ", ".join(sorted(topics)) or "none yet (add them in the admin or POST /api/v1/topics/)"
        )
        return f"No topic '{slug[:70]}'. Known: {known}."
    if topic.channels and channel not in topic.channels:
        return f"Topic '{slug}' is not sent on {channel}: it is on {', '.join(topic.channels)}."
    return None


TOPIC_SHOWN = (
    ("name", "name"),
    ("description", "description"),
    ("channels", "channels"),
    ("default", "default"),
)
