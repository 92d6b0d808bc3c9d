"""Cap rules in words and in checks: the one rule for a valid rule (REST, admin and commands
all use `rule_problems`), a rule read out in plain words, and the findings a marketer should
see: rules that never decide because a stricter one always applies with them, and reserves that
shut lower priorities out completely. Also what the authored stack (limits/policy/authored.py) needs
of a rule: its fields read from a row and put on one, its JSON, a change in words."""

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from gatekeeper.lib.integers import INT32_MAX
from gatekeeper.lib.problems import Problem
from gatekeeper.lib.words import count
from limits.channels import ALL, channel_problem, noun
from limits.engine.table import DAY_SECONDS, ROLLING_SECONDS, WEEK_SECONDS, RuleView
from limits.engine.windows import UNITS

TAG = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
TAG_WORDS = "Lowercase letters, digits, - and _, starting with a letter or digit; up to 64."
MATCHES = ("any", "tag", "campaign")
NAME_MAX = 100


TAGS_MAX = 8  # tags on one send
# A send's campaign (per-campaign rules count each on its own; the ledger keeps it whole).
CAMPAIGN_MAX = 200


def validate_tag(value: str) -> str | None:
    """The one rule for a tag (rules, gate calls and send jobs): None when valid, else why."""
    if not TAG.fullmatch(value):
        return f"'{value[:70]}' is not a tag. {TAG_WORDS}"
    return None


def tags_problem(tags: Sequence[object]) -> tuple[int | None, str] | None:
    """The one rule for a send's tags (gate calls, send jobs, the what-if): at most TAGS_MAX,
    each a tag, each once. None when valid, else (the bad tag's position, or None for the list
    as a whole; why)."""
    if len(tags) > TAGS_MAX:
        return None, f"At most {TAGS_MAX} tags; {len(tags)} given."
    seen: set[str] = set()
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            return i, f"A tag is a string, not {type(tag).__name__}."
        why = validate_tag(tag)
        if why is None and tag in seen:
            why = f"'{tag}' is listed twice: a send carries a tag or not."
        if why is not None:
            return i, why
        seen.add(tag)
    return None


@dataclass
class RuleFields:
    """A rule's editable fields, as a caller gives them (the REST body, an admin form)."""

    name: str
    segment: str | None  # a slug; None: every segment
    channel: str
    match: str
    tag: str
    window_kind: str
    window_seconds: int | None
    window_unit: str
    limit: int
    reserve_below_priority: int | None
    reserve_slots: int | None
    enabled: bool = True


RULE_FIELD_NAMES = frozenset(f.name for f in fields(RuleFields))
# What a record that lacks a field reads as (an old history record).
RULE_FIELD_DEFAULTS: dict[str, Any] = {
    "name": "",
    "segment": None,
    "channel": "",
    "match": "any",
    "tag": "",
    "window_kind": "rolling",
    "window_seconds": None,
    "window_unit": "",
    "limit": 0,
    "reserve_below_priority": None,
    "reserve_slots": None,
    "enabled": True,
}


def rule_problems(fields: RuleFields, *, segments: Iterable[str]) -> dict[str, list[str]]:
    """What is wrong with a rule, by field (the REST API's names); empty when nothing is."""
    problems: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        problems.setdefault(field, []).append(message)

    name = fields.name.strip()
    if not name:
        add("name", "Give the rule a name, in your words.")
    elif len(name) > NAME_MAX:
        add("name", f"At most {NAME_MAX} characters.")
    known = list(segments)
    if fields.segment is not None and fields.segment not in known:
        add("segment", f"No segment '{fields.segment}'. Known: {', '.join(known) or 'none'}.")
    if (unknown := channel_problem(fields.channel, scope=True)) is not None:
        add("channel", unknown)
    if fields.match not in MATCHES:
        add("match", f"Choose one of: {', '.join(MATCHES)}.")
    elif fields.match == "tag":
        if not fields.tag:
            add("tag", "A tag rule needs the tag it counts.")
        elif (why := validate_tag(fields.tag)) is not None:
            add("tag", why)
    elif fields.tag:
        add("tag", f"Only a tag rule counts a tag; this one counts {_match_words(fields.match)}.")
    for name, message in window_problems(
        fields.window_kind, fields.window_seconds, fields.window_unit
    ):
        add(name, message)
    if not 0 <= fields.limit <= INT32_MAX:
        add("limit", f"From 0 (blocked) to {INT32_MAX:,}.")
    below, slots = fields.reserve_below_priority, fields.reserve_slots
    if (below is None) != (slots is None):
        add("reserve", "A reserve needs both below_priority and slots.")
    elif below is not None and slots is not None:
        if not 1 <= below <= 9:
            add("reserve.below_priority", "From 1 to 9: sends below it may not use the reserve.")
        if slots < 1:
            add("reserve.slots", "At least 1 slot, or no reserve.")
        elif slots > fields.limit:
            add(
                "reserve.slots",
                f"{slots:,} slots kept out of a limit of {fields.limit:,}: at most the limit.",
            )
    return problems


def window_problems(kind: str, seconds: int | None, unit: str) -> list[tuple[str, str]]:
    """The one rule for a window (a rule's, a person's own frequency's): what is wrong with it,
    as (field, message) pairs under the REST API's names (`window.seconds`); empty when valid."""
    if kind == "rolling":
        low, high = ROLLING_SECONDS
        if seconds is None:
            return [("window.seconds", "A rolling window needs its length in seconds.")]
        if not low <= seconds <= high:
            message = f"From {low:,} (1 minute) to {high:,} (90 days); {seconds:,} is not."
            return [("window.seconds", message)]
        return []
    if kind == "calendar":
        return [] if unit in UNITS else [("window.unit", f"Choose one of: {', '.join(UNITS)}.")]
    return [("window.kind", "Choose rolling or calendar.")]


# --- lengths of time -----------------------------------------------------------------------

UNIT_SECONDS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600),
    **dict.fromkeys(("d", "day", "days"), 86_400),
    **dict.fromkeys(("w", "wk", "week", "weeks"), 604_800),
}
_UNITS = "|".join(sorted(UNIT_SECONDS, key=len, reverse=True))
# Parts of a number and a unit ("1 day 12 h", "3h", "90 minutes"), or a number of seconds. The
# REST schema shows the same pattern (`?window=`), so the two cannot disagree.
DURATION = re.compile(rf"(?:[0-9]{{1,9}} ?(?:{_UNITS})(?:, ?| )?)+|[0-9]{{1,9}}")
_DURATION_PART = re.compile(rf"([0-9]{{1,9}}) ?({_UNITS})")
DURATION_WORDS = (
    "A length of time: a number and a unit (s, m, h, d, w or their words), several of them or a "
    "number of seconds: 3h, 90 minutes, 1 day 12 h, 3600."
)


class NotADuration(Problem):
    """Text that is not a length of time; the message says why, in words."""


def duration_from_text(text: str, *, field: str = "") -> int:
    """The one rule for a length of time typed as text (a rule's window in the admin, the
    quota's `?window=`): its seconds. Lowercase, as DURATION has it; the bounds are the
    caller's to judge. NotADuration names `field`."""
    if not DURATION.fullmatch(text):
        shown = text if len(text) <= 30 else text[:27] + "..."
        raise NotADuration(f"'{shown}' is not a length of time. {DURATION_WORDS}", field=field)
    if text.isdigit():
        return int(text)
    return sum(int(number) * UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(text))


# --- words ----------------------------------------------------------------------------------


def _match_words(match: str) -> str:
    return {
        "any": "every send",
        "tag": "the sends carrying a tag",
        "campaign": "each campaign",
    }.get(match, match)


def duration_words(seconds: int) -> str:
    """90 -> '90 seconds'; 14400 -> '4 hours'; 86400 -> '24 hours'; 604800 -> '7 days'."""
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds % size == 0 and (unit != "day" or seconds >= 2 * 86_400):
            return count(seconds // size, unit)
    return count(seconds, "second")


def window_words(rule: RuleView) -> str:
    if rule.calendar:
        unit = rule.window_unit
        period = "calendar week (Monday to Sunday)" if unit == "week" else f"calendar {unit}"
        return f"per {period}, in their own time zone"
    return f"in any {duration_words(int(rule.window_seconds or 0))}"


def rule_describe(rule: RuleView, *, segment_name: str | None = None) -> str:
    """'Gold users: at most 1 promo-tagged email per calendar day, in their own time zone'."""
    who = f"{segment_name or rule.segment} users" if rule.segment else "Everyone"
    what = noun(rule.channel, 2 if rule.limit != 1 else 1)
    if rule.match == "tag":
        what = f"{rule.tag}-tagged {what}"
    if rule.limit == 0:
        text = f"no {rule.tag + '-tagged ' if rule.match == 'tag' else ''}{noun(rule.channel, 2)}"
        if rule.match == "campaign":
            text += " of any campaign"
        return f"{who}: {text}"
    text = f"at most {rule.limit:,} {what}"
    if rule.match == "campaign":
        text += " of each campaign"
    text += f" {window_words(rule)}"
    if rule.limit == 1 and not rule.calendar:
        text += f" (at least {duration_words(int(rule.window_seconds or 0))} apart)"
    if rule.reserve_below_priority is not None and rule.reserve_slots:
        kept = count(rule.reserve_slots, "slot")
        text += f"; the last {kept} kept for priority {rule.reserve_below_priority} and above"
    return f"{who}: {text}"


# --- findings -------------------------------------------------------------------------------


def _covers_window(strict: RuleView, loose: RuleView) -> bool:
    """Whether `strict`'s window always holds `loose`'s (so it counts at least as much)."""
    if not strict.calendar and not loose.calendar:
        return (strict.window_seconds or 0) >= (loose.window_seconds or 0)
    if not strict.calendar and loose.calendar:
        # A rolling window at least as long as the longest such period holds the current one.
        longest = {"day": 25 * 3_600, "week": 7 * 86_400 + 3_600, "month": 31 * 86_400 + 3_600}
        return (strict.window_seconds or 0) >= longest[loose.window_unit]
    if strict.calendar and loose.calendar:
        # The current week or month holds the current day; a month does not hold a week.
        order = {"day": 0, "week": 1, "month": 1}
        same = strict.window_unit == loose.window_unit
        return same or (loose.window_unit == "day" and order[strict.window_unit] > 0)
    return False


def _applies_whenever(strict: RuleView, loose: RuleView) -> bool:
    """Whether `strict` applies to every send `loose` applies to, counting at least its sends."""
    if strict.segment is not None and strict.segment != loose.segment:
        return False
    if strict.channel != ALL and strict.channel != loose.channel:
        return False
    if strict.match == "tag" and not (loose.match == "tag" and loose.tag == strict.tag):
        return False
    if strict.match == "campaign" and loose.match != "campaign":
        return False
    return _covers_window(strict, loose)


def _at_least_as_strict(strict: RuleView, loose: RuleView) -> bool:
    return all(strict.limit_for(p) <= loose.limit_for(p) for p in range(10))


def always_stricter(strict: RuleView, loose: RuleView) -> bool:
    """Whether `strict` applies whenever `loose` does, counting at least its sends, with a limit
    no higher at every priority: `loose` then never decides (a rule's finding; a person's own
    frequency refused as no tighter than the rules)."""
    return _applies_whenever(strict, loose) and _at_least_as_strict(strict, loose)


def rule_findings(
    rules: Sequence[RuleView], *, segment_names: Mapping[str, str] | None = None
) -> dict[int, list[str]]:
    """Per rule id, what a marketer should know: rules that never decide (another rule always
    applies with them and is at least as strict), and reserves that leave lower priorities
    nothing."""
    findings: dict[int, list[str]] = {}
    for rule in rules:
        for other in rules:
            if other.id == rule.id:
                continue
            if always_stricter(other, rule):
                # Two rules that each cover the other: only the later one is called dead.
                mutual = always_stricter(rule, other)
                if mutual and rule.id < other.id:
                    continue
                name = (segment_names or {}).get(other.segment or "")
                findings.setdefault(rule.id, []).append(
                    f"Never decides: '{other.name}' always applies with it and is at least as "
                    f"strict ({rule_describe(other, segment_name=name)})."
                )
                break
        if rule.reserve_slots is not None and rule.reserve_slots >= rule.limit > 0:
            findings.setdefault(rule.id, []).append(
                f"The reserve keeps all {count(rule.limit, 'slot')}: sends below priority "
                f"{rule.reserve_below_priority} are always refused."
            )
    return findings


def rule_as_json(rule: Any) -> dict[str, Any]:
    """A Rule row as the REST API shows it (and as its history keeps it)."""
    return {
        "id": rule.pk,
        "name": rule.name,
        "segment": rule.segment.slug if rule.segment is not None else None,
        "channel": rule.channel,
        "match": rule.match,
        "tag": rule.tag or None,
        "window": rule.window(),
        "limit": rule.limit,
        "reserve": rule.reserve(),
        "enabled": rule.enabled,
        "classic": rule.cap_id is not None,
    }


def window_seconds_of(classic: str) -> int:
    return DAY_SECONDS if classic == "daily" else WEEK_SECONDS


# --- a rule as an authored record (limits/policy/authored.py) -------------------------------------

# The fields a change line of a rule's history names, in this order, with their words.
RULE_SHOWN = tuple(
    (key, key)
    for key in (
        "name",
        "segment",
        "channel",
        "match",
        "tag",
        "window",
        "limit",
        "reserve",
        "enabled",
    )
)


def rule_read(rule: Any) -> RuleFields:
    """A stored rule's editable fields (the base of a partial change)."""
    return RuleFields(
        name=rule.name,
        segment=rule.segment.slug if rule.segment is not None else None,
        channel=rule.channel,
        match=rule.match,
        tag=rule.tag,
        window_kind=rule.window_kind,
        window_seconds=rule.window_seconds,
        window_unit=rule.window_unit,
        limit=rule.limit,
        reserve_below_priority=rule.reserve_below_priority,
        reserve_slots=rule.reserve_slots,
        enabled=rule.enabled,
    )


def rule_apply(rule: Any, fields: RuleFields, segment: Any) -> None:
    """Put checked fields on a rule row (`segment`: the fields' Segment, or None); what does not
    apply to its kind of window or match is emptied."""
    rule.name = fields.name.strip()
    rule.segment = segment
    rule.channel = fields.channel
    rule.match = fields.match
    rule.tag = fields.tag if fields.match == "tag" else ""
    rule.window_kind = fields.window_kind
    rule.window_seconds = fields.window_seconds if fields.window_kind == "rolling" else None
    rule.window_unit = fields.window_unit if fields.window_kind == "calendar" else ""
    rule.limit = fields.limit
    rule.reserve_below_priority = fields.reserve_below_priority
    rule.reserve_slots = fields.reserve_slots
    rule.enabled = fields.enabled


def rule_changes_of_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """A rule's fields as its JSON names them (a REST body, the history's records: `window` and
    `reserve` as objects) as changes of RuleFields, for the fields `data` has."""
    changes: dict[str, Any] = {}
    for name, value in data.items():
        if name == "window":
            calendar = value.get("kind") == "calendar"
            changes["window_kind"] = "calendar" if calendar else "rolling"
            changes["window_seconds"] = None if calendar else value.get("seconds")
            changes["window_unit"] = (value.get("unit") or "") if calendar else ""
        elif name == "reserve":
            changes["reserve_below_priority"] = value.get("below_priority") if value else None
            changes["reserve_slots"] = value.get("slots") if value else None
        elif name == "tag":
            changes["tag"] = value or ""
        elif name in RULE_FIELD_NAMES:
            changes[name] = value
    return changes


def rule_changes_given(given: Mapping[str, Any]) -> dict[str, Any]:
    """A change's fields (a PATCH body's, a draft's: only those it has) as changes of
    RuleFields."""
    changes = rule_changes_of_json(given)
    if "match" in given and given["match"] != "tag" and "tag" not in given:
        # A rule that stops counting a tag forgets it, rather than being refused for keeping it.
        changes["tag"] = ""
    return changes


def rule_fields_of_json(data: Mapping[str, Any]) -> RuleFields:
    """A whole rule as its JSON has it (a REST body, a history record)."""
    return RuleFields(**{**RULE_FIELD_DEFAULTS, **rule_changes_of_json(data)})


def rule_fields_as_json(fields: RuleFields) -> dict[str, Any]:
    """A rule's fields as its REST body names them (rule_fields_of_json's inverse)."""
    calendar = fields.window_kind == "calendar"
    below, slots = fields.reserve_below_priority, fields.reserve_slots
    return {
        "name": fields.name,
        "segment": fields.segment,
        "channel": fields.channel,
        "match": fields.match,
        "tag": fields.tag or None,
        "window": {"kind": "calendar", "unit": fields.window_unit}
        if calendar
        else {"kind": "rolling", "seconds": fields.window_seconds},
        "limit": fields.limit,
        "reserve": None
        if below is None or slots is None
        else {"below_priority": below, "slots": slots},
        "enabled": fields.enabled,
    }


def rule_view_of(fields: RuleFields, *, id: int, classic: bool = False) -> RuleView:
    """A rule's fields as decisions and words read them."""
    return RuleView(
        id=id,
        name=fields.name,
        segment=fields.segment,
        channel=fields.channel,
        match=fields.match,
        tag=fields.tag,
        window_kind=fields.window_kind,
        window_seconds=fields.window_seconds,
        window_unit=fields.window_unit,
        limit=fields.limit,
        reserve_below_priority=fields.reserve_below_priority,
        reserve_slots=fields.reserve_slots,
        classic=classic,
    )


def rule_json_describe(data: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """A rule as its history keeps it, in plain words (`names`: segment names by slug)."""
    view = rule_view_of(rule_fields_of_json(data), id=data.get("id") or 0)
    return rule_describe(view, segment_name=names.get(view.segment or ""))


def rule_value_words(key: str, value: Any, names: Mapping[str, str]) -> str:
    """One field of a rule as its history keeps it, in words."""
    if key == "window" and value:
        if value.get("kind") == "calendar":
            return f"calendar {value.get('unit')}"
        return f"rolling {duration_words(int(value.get('seconds') or 0))}"
    if key == "reserve":
        return "none" if not value else f"{value['slots']} for priority {value['below_priority']}+"
    if key == "enabled":
        return "yes" if value else "no"
    return "none" if value in (None, "") else str(value)
