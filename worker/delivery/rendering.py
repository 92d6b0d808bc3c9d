"""A send job's templates: the one rule for a template's name, which templates exist for which
channel, and rendering them per recipient into the Message a dispatcher sends.

A template is a folder `templates/<channel>/<name>/` holding `body.txt`, and on the channels
that show a title, the title: `subject.txt` for email (plus an optional `body.html`), `title.txt`
for push. An SMS is its body alone."""

import functools
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.template import TemplateDoesNotExist
from django.template.base import TextNode, Variable, VariableNode
from django.template.loader import get_template, render_to_string

from gatekeeper.lib.bodies import words_for_pattern
from limits.channels import EMAIL, PUSH
from limits.channels import channels as dispatch_channels
from limits.people.preference_page import preferences_url
from limits.people.unsubscribe import unsubscribe_headers
from limits.reasons import Category
from worker.delivery.base import Message, Recipient

TEMPLATE_NAME_WORDS = (
    "A template name is 1 to 100 lower-case letters, digits, - and _, starting with a letter or "
    "digit (templates/<channel>/<name>/)."
)
TEMPLATE_NAME = words_for_pattern("^[a-z0-9][a-z0-9_-]{0,99}$", TEMPLATE_NAME_WORDS)
TEMPLATE_NAME_RE = re.compile(TEMPLATE_NAME)


# The file of a channel's title; a channel without one (sms) sends its body alone.
TITLES = {EMAIL: "subject.txt", PUSH: "title.txt"}


def template_files(channel: str) -> tuple[str, ...]:
    """The files a template must have on `channel`."""
    title = TITLES.get(channel)
    return (title, "body.txt") if title else ("body.txt",)


def template_check(*, channel: str, template: str) -> None:
    """Raise TemplateDoesNotExist unless the channel's templates for `template` exist."""
    for name in template_files(channel):
        render_to_string(f"{channel}/{template}/{name}", {})


def template_names() -> list[str]:
    """The templates a send job may name: those of the project's templates directory that are
    complete for at least one channel (a job is refused when its channel lacks them)."""
    found = set()
    directories: list[Any] = list(settings.TEMPLATES[0]["DIRS"])  # type: ignore[call-overload]
    for directory in directories:
        for channel in dispatch_channels():
            root = Path(directory) / channel
            if not root.is_dir():
                continue
            for candidate in root.iterdir():
                if not TEMPLATE_NAME_RE.fullmatch(candidate.name):
                    continue
                try:
                    template_check(channel=channel, template=candidate.name)
                except TemplateDoesNotExist:
                    continue
                found.add(candidate.name)
    return sorted(found)


# Filters whose output is not a function of their input alone: a template using one is
# rendered for every recipient.
_UNSTABLE_FILTERS = frozenset({"random"})
_REMEMBERED = 4096  # outputs one template keeps, per chunk
_REMEMBERED_CHARACTERS = 1_000_000  # and characters: personal HTML bodies seldom repeat
_MISSING = object()  # a name the context lacks (renders unlike None)


class _Template:
    """A compiled template that remembers its outputs when it can.

    A template made only of text and `{{ variables|filters }}` renders the same text for the
    same values of the names it reads, and a campaign's texts mostly repeat (the same offer,
    a handful of cities or first names): such a template is rendered once per distinct set of
    values, then read from a dictionary (at most _REMEMBERED outputs and _REMEMBERED_CHARACTERS;
    afterwards the rest are rendered). Any other template (tags), or other values than texts, is
    rendered every time."""

    def __init__(self, template: Any) -> None:
        self.template = template
        self.names = _names_read(template)
        self.outputs: dict[tuple[Any, ...], str] = {}
        self.room = _REMEMBERED_CHARACTERS

    def render(self, context: dict[str, Any]) -> str:
        if self.names is None:
            return self.template.render(context)
        key = tuple([context.get(name, _MISSING) for name in self.names])
        # Only texts and absent names make keys: 1, 1.0 and True are equal keys that render
        # differently, and a list is no key at all.
        if not all(type(value) is str or value is _MISSING for value in key):
            return self.template.render(context)
        output = self.outputs.get(key)
        if output is None:
            output = self.template.render(context)
            if len(self.outputs) < _REMEMBERED and len(output) <= self.room:
                self.outputs[key] = output
                self.room -= len(output)
        return output


def _names_read(template: Any) -> tuple[str, ...] | None:
    """The context names a template of text and variables reads, or None when its output may
    depend on more than their values (tags, unstable filters, another engine)."""
    nodelist = getattr(getattr(template, "template", None), "nodelist", None)
    if nodelist is None:
        return None
    names: set[str] = set()

    def read(value: Any) -> None:
        if isinstance(value, Variable) and value.lookups:
            names.add(value.lookups[0])

    for node in nodelist:
        if isinstance(node, TextNode):
            continue
        if not isinstance(node, VariableNode):
            return None
        expression = node.filter_expression
        read(expression.var)
        for function, arguments in expression.filters:
            if getattr(function, "_filter_name", None) in _UNSTABLE_FILTERS:
                return None
            for _lookup, argument in arguments:
                read(argument)
    return tuple(sorted(names))


class Renderer:
    """A job's templates, loaded and compiled once, rendered per recipient."""

    def __init__(
        self, *, channel: str, template: str, campaign: str, category: str = Category.MARKETING
    ) -> None:
        self.channel, self.campaign = channel, campaign
        # Marketing email carries its one-click unsubscribe link (RFC 8058); receipts do not.
        self.unsubscribable = channel == EMAIL and category == Category.MARKETING
        title = TITLES.get(channel)
        self.title = _Template(get_template(f"{channel}/{template}/{title}")) if title else None
        self.body = _Template(get_template(f"{channel}/{template}/body.txt"))
        self.html = None
        if channel == EMAIL:
            try:
                self.html = _Template(get_template(f"email/{template}/body.html"))
            except TemplateDoesNotExist:
                self.html = None
        self.subjects: dict[str, str] = {}  # a title as rendered: its spaces made one

    def __call__(self, recipient: Recipient) -> Message:
        data = recipient.context
        context = {
            **data,
            "user_id": recipient.user_id,
            "campaign": self.campaign,
            # Signed only when a template asks for it (a callable: the template calls it).
            "preferences_url": functools.partial(preferences_url, recipient.user_id),
        }
        title = self.title.render(context) if self.title is not None else ""
        subject = self.subjects.get(title)
        if subject is None:
            subject = " ".join(title.split())
            if len(self.subjects) < _REMEMBERED:
                self.subjects[title] = subject
        return Message(
            message_id=recipient.message_id,
            user_id=recipient.user_id,
            address=recipient.address,
            subject=subject,
            body=self.body.render(context),
            html=self.html.render(context) if self.html is not None else None,
            data=data,
            headers=(
                unsubscribe_headers(user_id=recipient.user_id, channel=self.channel)
                if self.unsubscribable
                else {}
            ),
        )
