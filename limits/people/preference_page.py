"""The hosted preference page (`/p/<token>/`): where a person says, without logging in, which
topics they want on which channel, switches a whole channel off, says how many a week they want
at most on a channel, in any 7 days or in each calendar week, Monday to Sunday (their own
frequency: only the numbers tighter than the rules for everyone are offered), or pauses their
marketing for a week, a month or until a day. Linked from every message
(`{{ preferences_url }}` in the templates); the link carries the user id signed with SECRET_KEY
(salted for this use, as the unsubscribe link is), so it cannot be made for another person.

A plain HTML form: it works without JavaScript, every switch has its label and the page reads
in the person's language (English and French are shipped: the browser's Accept-Language
chooses). What it saves goes through `preferences_replace` with source `page`, checked by the
one rule, and the gate follows it at once in this process and within the suppression TTL in
every other.
"""

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from limits.channels import channels
from limits.engine.table import PolicyTable
from limits.engine.topics import REQUIRED, UNSUBSCRIBED
from limits.models.policy import Topic
from limits.people.preferences import (
    PreferencesFields,
    frequency_problems,
    preferences_read,
    preferences_replace,
)
from limits.policy.selectors import policy_cache, topics_read

_SALT = "gatekeeper.preferences"
PAUSES = {"week": timedelta(days=7), "month": timedelta(days=30)}
WEEK = {"kind": "rolling", "seconds": 604_800}  # the page's "a week": any 7 days
CALENDAR_WEEK = {"kind": "calendar", "unit": "week"}  # Monday to Sunday, in the person's zone
# The weeks the page offers, by the prefix of a choice's value in the form ("2": at most 2 in
# any 7 days; "calendar:2": at most 2 each calendar week).
WEEKS = {"": WEEK, "calendar": CALENDAR_WEEK}
OFTEN_MAX = 7  # the most a week the page offers


def preferences_token(user_id: int) -> str:
    return signing.Signer(salt=_SALT).sign(str(user_id))


def preferences_reader(token: str) -> int | None:
    """The user id of a link this gatekeeper signed, or None."""
    try:
        value = signing.Signer(salt=_SALT).unsign(token)
    except signing.BadSignature:
        return None
    return int(value) if value.isdigit() else None


def preferences_url(user_id: int) -> str:
    path = reverse("preferences", args=[preferences_token(user_id)])
    return f"{settings.GATEKEEPER_PUBLIC_URL.rstrip('/')}{path}"


def _switches(topic: Topic) -> list[tuple[str, str, bool]]:
    """A topic's switches on the form, one per channel it is sent on: (the field's name, the
    channel, whether it is on by default)."""
    default = topic.default != UNSUBSCRIBED
    return [(f"topic:{topic.slug}:{c}", c, default) for c in topic.channels or channels()]


def _rows(prefs: PreferencesFields) -> list[dict[str, Any]]:
    """The topics as the page lists them: each with its switches per channel (ticked when the
    person gets it), or marked required."""
    rows = []
    for topic in Topic.objects.all():
        said = prefs.topics.get(topic.slug, {})
        rows.append(
            {
                "slug": topic.slug,
                "name": topic.name,
                "description": topic.description,
                "required": topic.default == REQUIRED,
                "switches": [
                    {"name": name, "channel": channel, "on": said.get(channel, default)}
                    for name, channel, default in _switches(topic)
                ],
            }
        )
    return rows


def _value(prefix: str, limit: int) -> str:
    """A choice's value in the form."""
    return f"{prefix}:{limit}" if prefix else str(limit)


def _weekly(prefs: PreferencesFields, channel: str) -> list[dict[str, Any]]:
    """The person's own frequencies on `channel` over a week the page offers."""
    return [e for e in prefs.frequency if e["channel"] == channel and e["window"] in WEEKS.values()]


def _shown(prefs: PreferencesFields, channel: str) -> str:
    """The value the page shows chosen for `channel` ("": none): their weekly frequency (the
    first, should they have set two over the API)."""
    for e in _weekly(prefs, channel):
        prefix = next(p for p, window in WEEKS.items() if window == e["window"])
        return _value(prefix, e["limit"])
    return ""


def _often(prefs: PreferencesFields, table: PolicyTable) -> list[dict[str, Any]]:
    """Per channel, the "at most N a week" choices the rules leave, in any 7 days and each
    calendar week (each checked by the one rule for a frequency), and the person's own, if
    they have one."""
    rows = []
    for channel in channels():
        mine = _shown(prefs, channel)
        weeks = []
        for prefix, window in WEEKS.items():
            choices = [
                {"value": _value(prefix, n), "n": n}
                for n in range(1, OFTEN_MAX + 1)
                if _value(prefix, n) == mine
                or not frequency_problems(
                    [{"channel": channel, "window": window, "limit": n}], table=table
                )
            ]
            weeks.append({"calendar": bool(prefix), "choices": choices})
        rows.append({"channel": channel, "weeks": weeks, "mine": mine})
    return rows


def _often_posted(value: str) -> dict[str, Any] | str | None:
    """The window and limit of a choice posted ("2", "calendar:2"), None for none, or why it
    cannot be read."""
    if not value:
        return None
    prefix, _colon, limit = value.rpartition(":")
    if prefix not in WEEKS or not limit.isdigit() or value != _value(prefix, int(limit)):
        return _("Choose how many a week from the list.")
    return {"window": WEEKS[prefix], "limit": int(limit)}


def _posted(data: Any, current: PreferencesFields, today: date) -> PreferencesFields | str:
    """The preferences the form posted (a choice is kept only where it differs from the
    topic's default), or why they cannot be read."""
    topics: dict[str, dict[str, bool]] = {}
    for topic in Topic.objects.exclude(default=REQUIRED):
        for name, channel, default in _switches(topic):
            on = data.get(name) == "on"
            if on != default:
                topics.setdefault(topic.slug, {})[channel] = on
    chosen = {c: False for c in channels() if data.get(f"channel:{c}") != "on"}
    pause = data.get("pause", "keep")
    until: datetime | None
    if pause == "none":
        until = None
    elif pause in PAUSES:
        until = timezone.now() + PAUSES[pause]
    elif pause == "until":
        try:
            day = date.fromisoformat(data.get("until", ""))
        except ValueError:
            return _("Give the day the pause ends, as the calendar shows it.")
        if day <= today:
            return _("A pause ends on a day after today.")
        until = datetime.combine(day, time(), tzinfo=UTC)
    else:
        until = current.paused_until
    # "At most N a week" per channel, in any 7 days or each calendar week; their other
    # frequencies (set elsewhere) are kept, and so are their weekly ones on a channel whose
    # choice stays as the page showed it.
    frequency = [e for e in current.frequency if e["window"] not in WEEKS.values()]
    for channel in channels():
        often = data.get(f"often:{channel}", "")
        if often == _shown(current, channel):
            frequency += _weekly(current, channel)
            continue
        picked = _often_posted(often)
        if isinstance(picked, str):
            return picked
        if picked is not None:
            frequency.append({"channel": channel, **picked})
    return PreferencesFields(
        topics=topics,
        channels=chosen,
        paused_until=until,
        paused_channels=current.paused_channels,
        frequency=frequency,
    )


@require_http_methods(["GET", "POST"])
def preference_page(request: HttpRequest, token: str) -> HttpResponse:
    """The page, in the person's language (their browser's, among settings.LANGUAGES)."""
    with translation.override(translation.get_language_from_request(request)):
        response = _page(request, token)
        response.headers["Content-Language"] = translation.get_language()
        response.headers.setdefault("Vary", "Accept-Language")
        return response


def _page(request: HttpRequest, token: str) -> HttpResponse:
    user_id = preferences_reader(token)
    if user_id is None:
        return render(request, "limits/preferences.html", {"state": "invalid"}, status=400)
    topics = topics_read()
    current = preferences_read(user_id, topics=topics)
    state, problem, status = "ask", "", 200
    if request.method == "POST":
        posted = _posted(request.POST, current, timezone.now().date())
        if isinstance(posted, str):
            problem, status = posted, 400
        else:
            try:
                current = preferences_replace(
                    user_id=user_id, prefs=posted, topics=topics, source="page"
                )
                state = "saved"
            except ValidationError:
                # Only a form made by hand reaches this (the page offers valid choices only);
                # the rules may also have tightened since the page was shown.
                problem, status = _("Those choices are no longer offered: look again."), 400
    context = {
        "state": state,
        "problem": problem,
        "topics": _rows(current),
        "channels": [{"name": c, "off": current.channels.get(c) is False} for c in channels()],
        "often": _often(current, policy_cache().table()),
        "paused_until": current.paused_until,
        "tomorrow": (timezone.now().date() + timedelta(days=1)).isoformat(),
    }
    return render(request, "limits/preferences.html", context, status=status)
