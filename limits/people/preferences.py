"""A person's own say over their marketing: per topic and channel subscribed or not, per
channel on or off, a pause of all their marketing until an instant, and pauses of single
channels, and per channel their own frequency ("at most 2 a week": a rule of theirs, counted on
the same log as the marketer's rules and in the same call, worker/stages/rules.py) (DESIGN.md,
"Topics, preferences, ..."). Stored one row per person who said anything
(`Preference`); every change journaled (`PreferenceChange`) in commit order, as the
suppression list's are, so that every process can bring what it holds up to date by reading
the changes after the last one it has.

The one rule for valid preferences is `preferences_problems` (REST, the import, the preference
page): a topic that exists, on a channel it is sent on, never a `required` topic switched off;
channels from settings; a pause in the future, with its UTC offset; a frequency on a window the
rules may have, no longer than a week (a calendar week included) or the longest window the
rules count (the logs then keep what it counts: PolicyTable.own_keep), and tighter than every
rule that applies to everyone on its channel (a frequency such a rule always holds would never
decide). Choices about a topic that was deleted since, and pauses that have ended, are dropped
when preferences are read, so that a change made later is never refused for them. Whose they
are, when a body says it (`user_id`: a line of an imported file, or a REST body sent back as a
GET answers it), is decided by `preferences_user_id`.

Writes go through `preferences_replace` (the whole of them) and `preferences_patch` (some):
each takes PreferenceLock, changes the person's row (deleted when nothing is left) and
journals the change with its source and who made it, in one transaction; a change that
changes nothing writes nothing. Both write through `preferences_store`, as the import of a file
does a thousand people at a time (limits/people/preferences_import.py).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Protocol

import msgspec
import numpy as np
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone
from pyroaring import BitMap64

from gatekeeper.lib.accounts import account_acting
from gatekeeper.lib.ids import max_user_id, user_id_from_json
from gatekeeper.lib.integers import INT32_MAX
from gatekeeper.lib.leases import writers_locked
from gatekeeper.lib.problems import Problem
from gatekeeper.lib.words import count
from limits.channels import channel_problem, channels
from limits.engine.table import OWN_WEEK, RULE, PolicyTable, RuleView, own_rule
from limits.engine.topics import REQUIRED, TopicView, topic_on_unless_said
from limits.models.people import Preference, PreferenceChange, PreferenceLock
from limits.people.journaled import JournaledCache
from limits.policy.rules import always_stricter, duration_words, window_problems, window_words
from limits.policy.selectors import policy_cache
from limits.reasons import Reason

SOURCES = ("api", "import", "page", "admin")


@dataclass
class PreferencesFields:
    """A person's preferences, as a caller gives them and as they are stored."""

    topics: dict[str, dict[str, bool]] = field(default_factory=dict)
    channels: dict[str, bool] = field(default_factory=dict)
    paused_until: datetime | None = None
    paused_channels: dict[str, datetime] = field(default_factory=dict)
    # Per channel their own frequency: {"channel", "window" (a rule's), "limit"}.
    frequency: list[dict[str, Any]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.topics
            or self.channels
            or self.paused_until
            or self.paused_channels
            or self.frequency
        )


def preferences_problems(
    prefs: PreferencesFields,
    *,
    topics: Mapping[str, TopicView],
    now: datetime,
    table: PolicyTable | None = None,
) -> dict[str, list[str]]:
    """What is wrong with a person's preferences, by field (`topics.<topic>.<channel>`,
    `channels.<channel>`, `paused_until`, `paused_channels.<channel>`, `frequency.<n>.limit`);
    empty when nothing is. `topics`: the topics there are; `table`: the rules (a frequency is
    checked against them; None: no rule)."""
    problems: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    def channel_known(name: str, channel: str) -> bool:
        wrong = channel_problem(channel)
        if wrong is not None:
            add(name, wrong)
        return wrong is None

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
    for name, message in frequency_problems(prefs.frequency, table=table):
        add(name, message)
    return problems


def frequency_problems(
    frequency: Sequence[Mapping[str, Any]], *, table: PolicyTable | None
) -> list[tuple[str, str]]:
    """What is wrong with a person's own frequency, as (field, message) pairs
    (`frequency.<n>.window.seconds`)."""
    problems: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    rules = table.rules if table is not None else ()
    keep = table.own_keep() if table is not None else None
    for n, entry in enumerate(frequency):
        at = f"frequency.{n}"
        channel, window, limit = entry["channel"], entry["window"], entry["limit"]
        if (unknown := channel_problem(channel)) is not None:
            problems.append((f"{at}.channel", unknown))
        wrong = window_problems(
            str(window.get("kind")), window.get("seconds"), str(window.get("unit") or "")
        )
        problems += [(f"{at}.{name}", message) for name, message in wrong]
        if not 1 <= limit <= INT32_MAX:
            problems.append((f"{at}.limit", "At least 1 (for none, switch the channel off)."))
        if unknown or wrong or not 1 <= limit <= INT32_MAX:
            continue
        mine = own_rule(channel=channel, window=window, limit=limit)
        key = (channel, window_words(mine))
        if key in seen:
            problems.append((at, f"A second frequency on {channel} {key[1]}: one is enough."))
        seen.add(key)
        if keep is not None and mine.keeps() > keep:
            problems.append((f"{at}.window", _too_long(keep)))
        for rule in rules:
            if rule.kind == RULE and rule.segment is None and always_stricter(rule, mine):
                problems.append((f"{at}.limit", f"No fewer than the rule '{rule.name}' already "
                                 f"allows everyone ({rule.limit} {window_words(rule)}): choose "
                                 "fewer, or a shorter window."))  # fmt: skip
                break
    return problems


def _too_long(keep: timedelta) -> str:
    """Why a window is longer than a person's own frequency may count (`keep`:
    PolicyTable.own_keep)."""
    if keep <= OWN_WEEK:
        return "At most a week (any 7 days, or a calendar week): the rules count no longer window."
    seconds = int(keep.total_seconds())
    days, rest = divmod(seconds, 86_400)
    longest = duration_words(seconds)
    if days >= 2 and rest and rest % 3_600 == 0:  # a calendar month's: 31 days and 1 hour
        longest = f"{count(days, 'day')} and {count(rest // 3_600, 'hour')}"
    return f"The rules count no window longer than {longest}."


def preferences_user_id(given: Any, *, path: int | None = None, maximum: int | None = None) -> int:
    """Whose preferences a body says they are: its `user_id`, read by the one rule for a user id
    in a JSON body (gatekeeper.lib.ids.user_id_from_json: an integer, or a string of its
    digits, within `maximum`, by default the configured width's). A line of an imported file
    names its person (`path` None); a body sent to a person's own URL (`path`: the id it names)
    may leave it out or give it, as a GET answers it, and never names another person. Raises
    a Problem (a ValueError) with the words, naming `user_id`."""
    if given is msgspec.UNSET:
        if path is None:
            raise Problem("Required: the user id whose preferences these are.", field="user_id")
        return path
    maximum = max_user_id() if maximum is None else maximum
    user_id = user_id_from_json(given, maximum=maximum, field="user_id")
    if path is not None and user_id != path:
        raise Problem(
            f"These are the preferences of user {path} (the user id in the path): leave "
            f"user_id out or give {path}, not {user_id}.",
            field="user_id",
        )
    return user_id


def preferences_given(body: Any) -> PreferencesFields:
    """A person's preferences as a body gives them whole (limits.people.bodies.PreferencesBody: the
    REST PUT, a line of an imported file)."""
    return PreferencesFields(
        topics=body.topics,
        channels=body.channels,
        paused_until=body.paused_until,
        paused_channels=body.paused_channels,
        frequency=msgspec.to_builtins(body.frequency),
    )


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
        "frequency": sorted(
            (
                {"channel": e["channel"], "window": dict(e["window"]), "limit": e["limit"]}
                for e in prefs.frequency
            ),
            key=lambda e: (e["channel"], sorted(e["window"].items()), e["limit"]),
        ),
    }


def preferences_words(prefs: PreferencesFields, names: Mapping[str, str]) -> list[str]:
    """A person's preferences as lines a marketer reads ("Product news on email: switched
    off"); `names`: topics' names by slug."""
    lines = [
        f"{names.get(slug, slug)} on {channel}: {'switched on' if subscribed else 'switched off'}"
        for slug, choices in sorted(prefs.topics.items())
        for channel, subscribed in sorted(choices.items())
    ]
    lines += [
        f"All {channel}: {'on' if on else 'switched off'}"
        for channel, on in sorted(prefs.channels.items())
    ]
    if prefs.paused_until is not None:
        lines.append(f"All marketing paused until {prefs.paused_until:%Y-%m-%d %H:%M} UTC")
    lines += [
        f"{channel} paused until {until.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        for channel, until in sorted(prefs.paused_channels.items())
    ]
    lines += [
        f"{e['channel']}: at most {e['limit']} {window_words(own_rule(**e))} (their own)"
        for e in preferences_as_json(0, prefs)["frequency"]
    ]
    return lines


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def preferences_read(
    user_id: int, *, topics: Mapping[str, TopicView], now: datetime | None = None
) -> PreferencesFields:
    """A person's preferences as they stand: nothing said is empty; choices about topics
    deleted since (or channels no longer configured) and pauses that ended are left out."""
    row = Preference.objects.filter(user_id=user_id).first()
    return _standing(row, topics=topics, now=now or timezone.now())


class Said(Protocol):
    """What a person's row holds (a Preference, or its values as read in bulk)."""

    topics: Any
    channels: Any
    paused_until: datetime | None
    paused_channels: Any
    frequency: Any


def _standing(
    row: Said | None, *, topics: Mapping[str, TopicView], now: datetime
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
        frequency=[e for e in (row.frequency or []) if e.get("channel") in known],
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
    null takes one back to the default); `paused_until` replaces the pause (null: none), and
    `frequency` the person's own frequency, whole (null or []: none)."""

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
            frequency=list(changes.get("frequency", current.frequency) or []),
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
        preference_lock()
        row = Preference.objects.select_for_update().filter(user_id=user_id).first()
        current = _standing(row, topics=topics, now=now)
        new = make(current)
        problems = preferences_problems(new, topics=topics, now=now, table=policy_cache().table())
        if problems:
            raise ValidationError(problems)
        row_id = row.pk if row is not None else None
        preferences_store([(user_id, row_id, current, new)], source=source, by=by)
    return new


def preference_lock() -> None:
    """Take PreferenceLock, in the caller's transaction, before reading anyone's row: writers
    then commit one after another, so the journal's ids are in commit order."""
    writers_locked(PreferenceLock)


def preferences_standing(
    user_ids: Sequence[int], *, topics: Mapping[str, TopicView], now: datetime
) -> dict[int, tuple[int | None, PreferencesFields]]:
    """Each person's row's id (None: they said nothing) and their preferences as they stand,
    read in one query (values, not models: a third cheaper); under PreferenceLock
    (`preference_lock`)."""
    rows = {
        row.user_id: row
        for row in Preference.objects.select_for_update()
        .filter(user_id__in=user_ids)
        .values_list("id", "user_id", *SAID, named=True)
    }
    standing: dict[int, tuple[int | None, PreferencesFields]] = {}
    for user_id in user_ids:
        row = rows.get(user_id)
        standing[user_id] = (row.id if row else None, _standing(row, topics=topics, now=now))
    return standing


SAID = ("topics", "channels", "paused_until", "paused_channels", "frequency")
# Per person: their user id, their row's id (None: none), their preferences as they stand and
# as they become.
PreferencesWrite = tuple[int, int | None, PreferencesFields, PreferencesFields]
ROW_COLUMNS = (
    "topics", "channels", "paused_until", "paused_channels", "frequency", "keeps_seconds",
    "changed_at",
)  # fmt: skip
JOURNAL_COLUMNS = ("user_id", "before", "after", "source", "changed_by", "changed_at")


def preferences_store(writes: Sequence[PreferencesWrite], *, source: str, by: Any) -> int:
    """Write people's new preferences, already checked, in the caller's transaction under
    PreferenceLock: each person's row (created, changed, or deleted when nothing is left) and
    one journal entry per change, with its source and who made it (`writes`: a person once).
    A change that changes nothing writes nothing. Returns the people changed.

    Four statements whatever the number of people (the import writes a thousand at a time),
    each executed for many rows at once with the values as the database takes them: the ORM's
    bulk_create and bulk_update (a CASE per row) wrote fewer than 3,000 people a second on
    SQLite, mostly in Python preparing each value; these, 5,000 to 8,000."""
    created: list[list[Any]] = []
    updated: list[list[Any]] = []
    deleted: list[int] = []
    journal: list[list[Any]] = []
    ops = connection.ops

    def json_value(value: Any) -> Any:
        return ops.adapt_json_value(value, None)

    at = ops.adapt_datetimefield_value(timezone.now())
    acting = account_acting(by)
    changed_by = acting.pk if acting is not None else None
    longest = 0  # the longest own frequency written, in seconds
    for user_id, row_id, current, new in writes:
        before = preferences_as_json(user_id, current)
        after = preferences_as_json(user_id, new)
        if before == after and (row_id is None) == new.empty():
            continue
        if new.empty():
            if row_id is not None:
                deleted.append(row_id)
        else:
            keeps = own_keeps_seconds(after["frequency"])
            longest = max(longest, keeps)
            values = [
                json_value(after["topics"]),
                json_value(after["channels"]),
                ops.adapt_datetimefield_value(new.paused_until),
                json_value(after["paused_channels"]),
                json_value(after["frequency"]),
                keeps,
                at,
            ]
            if row_id is None:
                created.append([user_id, *values])
            else:
                updated.append([*values, row_id])
        if before != after:
            journal.append([user_id, json_value(before), json_value(after), source, changed_by, at])
    if deleted:
        Preference.objects.filter(pk__in=deleted).delete()
    with connection.cursor() as cursor:
        if updated:
            cursor.executemany(_update_sql(Preference, ROW_COLUMNS), updated)
        if created:
            cursor.executemany(_insert_sql(Preference, ("user_id", *ROW_COLUMNS)), created)
        if journal:
            cursor.executemany(_insert_sql(PreferenceChange, JOURNAL_COLUMNS), journal)
    if journal:
        transaction.on_commit(preference_cache().read_now)
    if longest and longest * 1000 > policy_cache().table().retention_ms:
        # The logs must keep longer (PolicyTable.own_keeps_ms): at once in this process, as
        # the person's frequency is enforced; within the cache's TTL in every other.
        transaction.on_commit(policy_cache().invalidate)
    return len(journal)


def _columns(model: type[Model], names: Sequence[str]) -> list[str]:
    fields = [model._meta.get_field(name) for name in names]
    return [connection.ops.quote_name(str(getattr(f, "column", f.name))) for f in fields]


def _insert_sql(model: type[Model], names: Sequence[str]) -> str:
    table = connection.ops.quote_name(model._meta.db_table)
    marks = ", ".join(["%s"] * len(names))
    return f"INSERT INTO {table} ({', '.join(_columns(model, names))}) VALUES ({marks})"


def _update_sql(model: type[Model], names: Sequence[str]) -> str:
    table = connection.ops.quote_name(model._meta.db_table)
    sets = ", ".join(f"{column} = %s" for column in _columns(model, names))
    return f"UPDATE {table} SET {sets} WHERE {_columns(model, ['id'])[0]} = %s"


def own_keeps_seconds(frequency: Sequence[Mapping[str, Any]]) -> int:
    """How long the logs must keep entries for a person's own frequency to count (0: none)."""
    return max((int(own_rule(**e).keeps().total_seconds()) for e in frequency), default=0)


# --- in every process ---------------------------------------------------------------------------


class PreferencesUnavailable(Exception):
    """People's preferences have never been read in this process (the database is away):
    nobody can be told they did not say no, so the gate refuses marketing as `unavailable`."""


END_MAX = 2**32 - 1  # a pause's end in whole seconds: a later one (after 2106) ends then


class Pauses:
    """Until when users are paused (epoch seconds), 12 bytes a person: a sorted array of their
    ids and one of their ends (whole seconds), built when the table is read whole, and the
    changes read from the journal since in a dictionary beside it (an end of 0: none)."""

    __slots__ = ("ends", "ids", "recent")

    def __init__(self, ids: Any = None, ends: Any = None) -> None:
        self.ids = np.empty(0, dtype=np.uint64) if ids is None else ids
        self.ends = np.empty(0, dtype=np.uint32) if ends is None else ends
        self.recent: dict[int, int] = {}

    @classmethod
    def built(cls, ids: Sequence[int] | Any, ends: Sequence[float] | Any) -> "Pauses":
        """From users and their ends in any order (a user once)."""
        order_ids = np.asarray(ids, dtype=np.uint64)
        order = np.argsort(order_ids, kind="stable")
        clamped = np.minimum(np.asarray(ends, dtype=np.float64), END_MAX)
        return cls(order_ids[order], clamped.astype(np.uint32)[order])

    def __bool__(self) -> bool:
        return bool(len(self.ids) or self.recent)

    def set(self, user_id: int, end: float) -> None:
        self.recent[user_id] = min(int(end), END_MAX)

    def drop(self, user_id: int) -> None:
        self.recent[user_id] = 0

    def ends_of(self, user_ids: Sequence[int]) -> Any:
        """Each user's end (0: not paused), as an array."""
        ends = np.zeros(len(user_ids), dtype=np.float64)
        if len(self.ids):
            wanted = np.asarray(user_ids, dtype=np.uint64)
            at = np.searchsorted(self.ids, wanted)
            inside = at < len(self.ids)
            found = np.zeros(len(user_ids), dtype=bool)
            found[inside] = self.ids[at[inside]] == wanted[inside]
            ends[found] = self.ends[at[found]]
        if self.recent:
            for k, user_id in enumerate(user_ids):
                end = self.recent.get(user_id)
                if end is not None:
                    ends[k] = end
        return ends

    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.ends.nbytes) + 100 * len(self.recent)


class PreferenceCache(JournaledCache):
    """What people said, in memory, as the gate asks it: per topic and channel a bitmap of
    those who switched it off and one of those who switched it on (a topic people must ask
    for); per channel a bitmap of those who switched it off; the pauses (of everything, of each
    channel) as sorted arrays (`Pauses`). Kept up to date from the journal
    (limits.people.journaled)."""

    what = "People's preferences"
    unavailable = PreferencesUnavailable

    def _reset(self) -> None:
        self._off: dict[tuple[str, str], BitMap64] = {}
        self._on: dict[tuple[str, str], BitMap64] = {}
        self._channel_off: dict[str, BitMap64] = {}
        self._paused = Pauses()
        self._paused_channels: dict[str, Pauses] = {}
        # Per channel, per own frequency (a rule of theirs), the people who chose it.
        self._own: dict[str, dict[RuleView, BitMap64]] = {}

    @classmethod
    def holding(cls, said: Mapping[int, Mapping[str, Any]]) -> "PreferenceCache":
        """A cache that always answers what `said` holds (user id -> preferences as
        preferences_as_json has them), never the database (benchmarks)."""
        cache = cls(ttl=float("inf"))
        for user_id, prefs in said.items():
            cache._learn(user_id, prefs)
        cache._compact()
        cache._loaded_now()
        return cache

    def refusals(
        self, channel: str, topic: TopicView | None, user_ids: Sequence[int], now_ms: int
    ) -> list[tuple[Reason, dict[str, Any] | None, float | None] | None] | None:
        """Per user id, why their marketing send on `channel` about `topic` must not go at
        `now_ms` (epoch milliseconds, the gate's clock) (`preference` with what they switched
        off, or `paused` with the seconds until the pause ends), or None; None for all when
        nobody said anything that applies (free).
        A required topic is never refused. Raises PreferencesUnavailable while never read."""
        self._fresh()
        if topic is not None and topic.default == REQUIRED:
            return None
        slug = topic.slug if topic is not None else None
        off = self._off.get((slug, channel)) if slug is not None else None
        ask = topic is not None and not topic_on_unless_said(topic)
        on = self._on.get((slug, channel)) if ask and slug is not None else None
        channel_off = self._channel_off.get(channel)
        paused, paused_here = self._paused, self._paused_channels.get(channel)
        if not (off or ask or channel_off or paused or paused_here):
            return None
        ends = np.zeros(len(user_ids)) if not paused else paused.ends_of(user_ids)
        if paused_here:
            ends = np.maximum(ends, paused_here.ends_of(user_ids))
        # Seconds each pause still lasts at `now_ms` (not positive: none), for all at once.
        left = ((ends * 1000 - now_ms) / 1000).tolist()
        out: list[tuple[Reason, dict[str, Any] | None, float | None] | None] = []
        for k, user_id in enumerate(user_ids):
            if channel_off is not None and user_id in channel_off:
                out.append((Reason.PREFERENCE, {"topic": None, "channel": channel}, None))
            elif (off is not None and user_id in off) or (
                ask and (on is None or user_id not in on)
            ):
                out.append((Reason.PREFERENCE, {"topic": slug, "channel": channel}, None))
            else:
                out.append((Reason.PAUSED, None, left[k]) if left[k] > 0 else None)
        return out if any(out) else None

    def own_rules(
        self, channel: str, topic: TopicView | None, user_ids: Sequence[int]
    ) -> list[tuple[RuleView, ...]] | None:
        """Per user id, the rules of their own frequency on `channel` (empty: none); None for
        all when nobody in `user_ids` has one (free). A required topic's sends have none. Read
        after `refusals` in the same gate call (which brings the cache up to date)."""
        chosen = self._own.get(channel)
        if not chosen or (topic is not None and topic.default == REQUIRED):
            return None
        batch = BitMap64(user_ids)
        theirs: dict[int, tuple[RuleView, ...]] = {}
        for rule, users in chosen.items():
            for user_id in batch & users:
                theirs[user_id] = (*theirs.get(user_id, ()), rule)
        if not theirs:
            return None
        return [theirs.get(user_id, ()) for user_id in user_ids]

    def _read_all(self) -> None:
        # The journal's end first: changes committed while the rows are read are read again
        # afterwards, and applying a change twice gives the same result.
        last = PreferenceChange.objects.order_by("-id").values_list("id", flat=True).first()
        self._reset()
        rows = Preference.objects.order_by().values(
            "user_id", "topics", "channels", "paused_until", "paused_channels", "frequency"
        )
        for row in rows.iterator(chunk_size=20_000):
            self._learn(row["user_id"], row)
        self._compact()
        self._last_change = last or 0
        self._read_changes()

    def _read_changes(self) -> None:
        changes = (
            PreferenceChange.objects.filter(id__gt=self._last_change)
            .order_by("id")
            .values_list("id", "user_id", "after")
        )
        for change_id, user_id, after in changes.iterator(chunk_size=20_000):
            self._forget(user_id)
            if after:
                self._learn(user_id, after)
            self._last_change = change_id

    def _learn(self, user_id: int, said: Mapping[str, Any]) -> None:
        """Add what a person said (a row, or preferences_as_json's shape: the same keys)."""
        topics, chosen = said.get("topics"), said.get("channels")
        until, paused = said.get("paused_until"), said.get("paused_channels")
        for slug, choices in (topics or {}).items():
            for channel, subscribed in choices.items():
                kept = self._on if subscribed else self._off
                kept.setdefault((slug, channel), BitMap64()).add(user_id)
        for channel, on in (chosen or {}).items():
            if not on:
                self._channel_off.setdefault(channel, BitMap64()).add(user_id)
        if until:
            self._paused.set(user_id, _epoch(until))
        for channel, ends in (paused or {}).items():
            self._paused_channels.setdefault(channel, Pauses()).set(user_id, _epoch(ends))
        for entry in said.get("frequency") or ():
            rule = own_rule(**entry)
            self._own.setdefault(rule.channel, {}).setdefault(rule, BitMap64()).add(user_id)

    def _forget(self, user_id: int) -> None:
        for bitmaps in (self._off, self._on):
            for bitmap in bitmaps.values():
                bitmap.discard(user_id)
        for bitmap in self._channel_off.values():
            bitmap.discard(user_id)
        self._paused.drop(user_id)
        for pauses in self._paused_channels.values():
            pauses.drop(user_id)
        for chosen in self._own.values():
            for bitmap in chosen.values():
                bitmap.discard(user_id)

    def _compact(self) -> None:
        """The pauses learnt one by one (a whole read) made arrays."""
        for name, pauses in [(None, self._paused), *self._paused_channels.items()]:
            kept = [(u, e) for u, e in pauses.recent.items() if e]
            built = Pauses.built([u for u, _ in kept], [e for _, e in kept])
            if name is None:
                self._paused = built
            else:
                self._paused_channels[name] = built

    def nbytes(self) -> int:
        """About what it holds in memory: the bitmaps (as CRoaring keeps them, about their
        serialized size) and the pauses' arrays."""
        bitmaps = [*self._off.values(), *self._on.values(), *self._channel_off.values()]
        bitmaps += [b for chosen in self._own.values() for b in chosen.values()]
        return sum(len(b.serialize()) for b in bitmaps) + sum(
            p.nbytes() for p in [self._paused, *self._paused_channels.values()]
        )


def _epoch(value: Any) -> float:
    """An instant as stored (a datetime), journaled (ISO 8601 text) or given (epoch seconds)."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return float(value.timestamp())


@cache
def preference_cache() -> PreferenceCache:
    """This process's copy of people's preferences (one per process)."""
    return PreferenceCache(ttl=settings.GATEKEEPER_SUPPRESSION_TTL_SECONDS)
