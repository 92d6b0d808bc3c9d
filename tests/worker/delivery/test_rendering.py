"""A job's templates remember their outputs only where the output is a function of the values
they read: the remembered text is always the text a fresh render gives."""

import itertools
from typing import Any

import pytest
from django.template import engines

from worker.delivery.rendering import _Template

TEMPLATES = [
    "Hi {{ name }}!",
    '{{ text|default:"Rides are 10% off." }}',
    "{{ name|upper }} {{ city|default:name }}",
    "{{ name.first }} in {{ city }}",
    "{% if name %}Hi {{ name }}{% else %}Hello{% endif %}",
    "{{ names|random }}",
]
CONTEXTS: list[dict[str, Any]] = [
    {},
    {"name": None},
    {"name": ""},
    {"name": "ana", "city": "Porto"},
    {"name": "ana"},
    {"name": 1},
    {"name": True},
    {"name": 1.0},
    {"name": {"first": "Bo"}, "city": "Oslo"},
    {"name": ["x", "y"]},
    {"names": ["a", "b", "c", "d", "e", "f", "g", "h"]},
    {"name": "ana", "city": "Porto"},
]


@pytest.mark.parametrize("text", TEMPLATES)
def test_remembered_outputs_are_fresh_renders(text: str) -> None:
    compiled = engines["django"].from_string(text)
    remembering = _Template(compiled)
    for context in itertools.chain(CONTEXTS, reversed(CONTEXTS), CONTEXTS):
        if "names" in context:
            continue  # random: compared below
        assert outcome(remembering.render, context) == outcome(compiled.render, context), context


def outcome(render: Any, context: dict[str, Any]) -> str:
    """The text rendered, or the error raised (a filter argument naming nothing raises)."""
    try:
        return str(render(context))
    except Exception as exc:
        return f"raised {type(exc).__name__}"


def test_only_plain_templates_remember() -> None:
    def names(text: str) -> tuple[str, ...] | None:
        return _Template(engines["django"].from_string(text)).names

    assert names("Hi {{ name }}, {{ city|default:fallback }}") == ("city", "fallback", "name")
    assert names("{{ name.first|title }}") == ("name",)
    assert names("plain text") == ()
    assert names("{% if name %}x{% endif %}") is None
    assert names("{{ names|random }}") is None


def test_a_random_pick_is_made_for_every_recipient() -> None:
    remembering = _Template(engines["django"].from_string("{{ names|random }}"))
    context = {"names": [str(i) for i in range(50)]}
    assert len({remembering.render(context) for _ in range(40)}) > 1


def test_texts_are_remembered_and_other_values_are_not() -> None:
    remembering = _Template(engines["django"].from_string("Hi {{ name }}"))
    for name in ["ana", "bo", "ana", None, 1]:
        remembering.render({"name": name})
    assert set(remembering.outputs) == {("ana",), ("bo",)}
