"""limits/channels.py decides what a channel is and words an unknown one: every check (a rule's,
quiet hours', a topic's, a person's frequency, the ledger's filters, a cap's model) gives its
words, and no other module words it."""

from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from limits.channels import channel_problem, validate_channel, validate_scope
from limits.engine.topics import TopicFields, topic_problems
from limits.ledger.reports import FILTER_PROBLEMS
from limits.people.preferences import frequency_problems

ROOT = Path(__file__).resolve().parents[2]
CODE = ("limits", "worker", "segments", "gatekeeper", "bench")


def test_a_channel_is_one_of_the_settings_and_a_scope_may_be_all():
    assert channel_problem("email") is None
    assert channel_problem("all", scope=True) is None
    assert channel_problem("all") == "Unknown channel 'all'. Choose one of: email, push, sms."
    assert channel_problem("fax", scope=True) == (
        "Unknown channel 'fax'. Choose one of: email, push, sms, all."
    )
    # A long value is shown cut, not whole.
    assert channel_problem("x" * 500) == (
        f"Unknown channel '{'x' * 70}'. Choose one of: email, push, sms."
    )


def test_every_check_of_a_channel_words_it_as_channel_problem():
    words = channel_problem("fax")
    assert _refused(lambda: validate_channel("fax")) == [words]
    assert _refused(lambda: validate_scope("fax")) == [channel_problem("fax", scope=True)]
    assert FILTER_PROBLEMS["channel"]("fax") == words
    topic = topic_problems(TopicFields(slug="news", name="News", channels=["email", "fax"]))
    assert topic["channels"] == [f"channels[1]: {words}"]
    frequency = [{"channel": "fax", "window": {"kind": "rolling", "seconds": 86_400}, "limit": 1}]
    assert ("frequency.0.channel", words) in frequency_problems(frequency, table=None)


def _refused(call: Callable[[], None]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        call()
    return list(caught.value.messages)


def test_no_module_but_limits_channels_words_an_unknown_channel():
    worded = [
        str(path.relative_to(ROOT))
        for top in CODE
        for path in sorted((ROOT / top).rglob("*.py"))
        if "unknown channel '" in path.read_text().lower() and path != ROOT / "limits/channels.py"
    ]
    assert not worded, "Call limits.channels.channel_problem instead:\n" + "\n".join(worded)
