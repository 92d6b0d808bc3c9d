"""People's preferences against a model, with hypothesis: random replacements, patches, pauses
that end, their own frequencies, and reads of the journal or of the whole table, in any order;
after each step every person's answer from another process's cache (reading the journal) and
from a fresh one (reading the table) is the model's: `preference` naming what was switched off,
`paused`, or nothing, and the rules of their own the gate adds to their sends; and the logs keep
what the longest of them counts."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from gatekeeper.lib.instants import instant_ms
from limits.engine.table import own_rule
from limits.engine.topics import TopicView
from limits.models.people import Preference, PreferenceChange
from limits.people.preferences import (
    PreferenceCache,
    PreferencesFields,
    preferences_patch,
    preferences_replace,
)
from limits.policy.selectors import own_keeps_ms
from limits.reasons import Reason
from tests.conftest import examples

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

START = datetime(2026, 11, 27, 12, tzinfo=UTC)
TOPICS = {
    "news": TopicView("news", (), "subscribed"),
    "offers": TopicView("offers", ("email",), "unsubscribed"),
    "terms": TopicView("terms", (), "required"),
}
USERS = (1, 2, 3)
CHANNELS = ("email", "push")
ASKED = [(topic, channel) for topic in (None, "news", "offers", "terms") for channel in CHANNELS
         if topic != "offers" or channel == "email"]  # fmt: skip

choice = st.sampled_from([True, False, None])
topic_choices = st.fixed_dictionaries(
    {},
    optional={
        "news": st.dictionaries(st.sampled_from(CHANNELS), st.booleans(), max_size=2),
        "offers": st.dictionaries(st.just("email"), st.booleans(), max_size=1),
        "terms": st.dictionaries(st.sampled_from(CHANNELS), st.just(True), max_size=2),
    },
)
hours = st.integers(min_value=1, max_value=48)
# A person's own windows: a day and a week rolling, a calendar week (7 days and an hour at most).
WINDOWS = [
    {"kind": "rolling", "seconds": 86_400},
    {"kind": "rolling", "seconds": 604_800},
    {"kind": "calendar", "unit": "week"},
]


class Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Preference.objects.all().delete()
        PreferenceChange.objects.all().delete()
        self.now = START
        self.model: dict[int, PreferencesFields] = {}
        # Another process's cache, made at the start and kept: it follows the journal.
        self.other = PreferenceCache(ttl=60.0)

    @rule(user=st.sampled_from(USERS), topics=topic_choices,
          channels=st.dictionaries(st.sampled_from(CHANNELS), st.booleans(), max_size=2),
          pause=st.none() | hours, channel_pause=st.none() | hours)  # fmt: skip
    def replace(self, user, topics, channels, pause, channel_pause):
        prefs = PreferencesFields(
            topics={slug: c for slug, c in topics.items() if c},
            channels=channels,
            paused_until=None if pause is None else self.now + timedelta(hours=pause),
            paused_channels={}
            if channel_pause is None
            else {"push": self.now + timedelta(hours=channel_pause)},
        )
        preferences_replace(user_id=user, prefs=prefs, topics=TOPICS, source="api", now=self.now)
        self.model[user] = prefs

    @rule(user=st.sampled_from(USERS), channel=st.sampled_from(CHANNELS), news=choice,
          email=choice, pause=st.none() | hours)  # fmt: skip
    def patch(self, user, channel, news, email, pause):
        changes: dict[str, object] = {
            "topics": {"news": {channel: news}},
            "channels": {"email": email},
        }
        if pause is not None:
            changes["paused_until"] = self.now + timedelta(hours=pause)
        preferences_patch(user_id=user, changes=changes, topics=TOPICS, source="api",
                          now=self.now)  # fmt: skip
        mine = self.model.setdefault(user, PreferencesFields())
        news_choices = dict(mine.topics.get("news", {}))
        if news is None:
            news_choices.pop(channel, None)
        else:
            news_choices[channel] = news
        mine.topics = {**mine.topics, "news": news_choices}
        mine.topics = {slug: c for slug, c in mine.topics.items() if c}
        if email is None:
            mine.channels.pop("email", None)
        else:
            mine.channels["email"] = email
        if pause is not None:
            mine.paused_until = self.now + timedelta(hours=pause)

    @rule(user=st.sampled_from(USERS), channel=st.sampled_from(CHANNELS),
          limit=st.none() | st.integers(min_value=1, max_value=4),
          window=st.sampled_from(WINDOWS))  # fmt: skip
    def own_frequency(self, user, channel, limit, window):
        mine = self.model.setdefault(user, PreferencesFields())
        kept = [e for e in mine.frequency if (e["channel"], e["window"]) != (channel, window)]
        if limit is not None:
            kept.append({"channel": channel, "window": window, "limit": limit})
        preferences_patch(user_id=user, changes={"frequency": kept}, topics=TOPICS,
                          source="api", now=self.now)  # fmt: skip
        mine.frequency = kept

    @rule(hours=st.integers(min_value=1, max_value=30))
    def time_passes(self, hours):
        self.now += timedelta(hours=hours)

    def expected(self, user: int, topic: str | None, channel: str):
        said = self.model.get(user)
        view = TOPICS.get(topic) if topic else None
        if view is not None and view.default == "required":
            return None
        said = said or PreferencesFields()
        if said.channels.get(channel) is False:
            return (Reason.PREFERENCE, {"topic": None, "channel": channel})
        mine = said.topics.get(topic or "", {}).get(channel)
        if view is not None and (mine is False or (view.default == "unsubscribed" and not mine)):
            return (Reason.PREFERENCE, {"topic": topic, "channel": channel})
        ends = [t for t in (said.paused_until, said.paused_channels.get(channel)) if t]
        if any(t > self.now for t in ends):
            return (Reason.PAUSED, None)
        return None

    def answers(self, cache: PreferenceCache, topic: str | None, channel: str):
        found = cache.refusals(
            channel, TOPICS.get(topic) if topic else None, list(USERS), instant_ms(self.now)
        )
        return [None if r is None else (r[0], r[1]) for r in (found or [None] * len(USERS))]

    def own(self, cache: PreferenceCache, topic: str | None, channel: str):
        found = cache.own_rules(channel, TOPICS.get(topic) if topic else None, list(USERS))
        return [
            sorted((r.window_seconds or 0, r.window_unit, r.limit) for r in rules)
            for rules in (found or [()] * len(USERS))
        ]

    def own_expected(self, user: int, topic: str | None, channel: str):
        if topic == "terms":
            return []
        said = self.model.get(user) or PreferencesFields()
        return sorted(
            (e["window"].get("seconds", 0), e["window"].get("unit", ""), e["limit"])
            for e in said.frequency
            if e["channel"] == channel
        )

    @invariant()
    def the_logs_keep_the_longest_own_window(self):
        longest = max(
            (own_rule(**e).keeps() for said in self.model.values() for e in said.frequency),
            default=timedelta(0),
        )
        assert own_keeps_ms() == longest.total_seconds() * 1000

    @invariant()
    def every_cache_answers_as_the_model(self):
        self.other.read_now()  # its TTL passed: it reads the journal after its last change
        caches = [PreferenceCache(ttl=60.0), self.other]  # a process started now reads all
        for topic, channel in ASKED:
            expected = [self.expected(user, topic, channel) for user in USERS]
            own = [self.own_expected(user, topic, channel) for user in USERS]
            for cache in caches:
                assert self.answers(cache, topic, channel) == expected, (topic, channel)
                assert self.own(cache, topic, channel) == own, (topic, channel)


def test_preferences_match_the_model():
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=examples(40),
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
