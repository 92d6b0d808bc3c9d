"""A history of gate calls for backtests' tests: a policy with calendar rules in each user's
zone, tag and campaign rules with a reserve and quiet hours with a spread; calls over days with
repeated users and message ids and sends given back; made through the real gate."""

import random
import time
from collections import Counter
from datetime import date, timedelta

import pytest

from limits.engine.quiet import QuietFields
from limits.policy.rules import rule_fields_of_json
from limits.policy.selectors import policy_cache
from limits.policy.services import QUIET_HOURS, RULES
from limits.reasons import Reason
from segments.models import Segment
from tests.support.clocks import instant
from worker.gate import _default_gate, gate_check, gate_release
from worker.modelled import REASONS

DAY = 86_400
START = 1_763_856_000  # 2025-11-23 00:00 UTC
DAYS = 6
VIP = list(range(1, 21))
OTHERS = list(range(21, 51))
ZONES = [None, "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kathmandu"]


@pytest.fixture
def policy(published):
    published(vip=(10, VIP, {"email": (2, 5)}))
    Segment.objects.filter(slug="vip").update(time_zone="Europe/London")
    RULES.create(
        fields=rule_fields_of_json(
            {
                "name": "one push a day, their day",
                "segment": None,
                "channel": "push",
                "window": {"kind": "calendar", "unit": "day"},
                "limit": 1,
            }
        )
    )
    RULES.create(
        fields=rule_fields_of_json(
            {
                "name": "promos",
                "segment": None,
                "channel": "all",
                "match": "tag",
                "tag": "promo",
                "window": {"kind": "rolling", "seconds": 3 * DAY},
                "limit": 3,
                "reserve": {"below_priority": 7, "slots": 1},
            }
        )
    )
    RULES.create(
        fields=rule_fields_of_json(
            {
                "name": "one spring a week",
                "segment": "vip",
                "channel": "all",
                "match": "campaign",
                "window": {"kind": "calendar", "unit": "week"},
                "limit": 1,
            }
        )
    )
    QUIET_HOURS.create(
        fields=QuietFields(
            segment=None, channel="sms", start="22:00", end="07:00", spread_minutes=30
        )
    )
    policy_cache().invalidate()


def traffic(seed: int) -> list[dict]:
    """Calls over DAYS days: channels, campaigns, tags, priorities, zones, repeated users and
    message ids, and some admitted sends given back right after."""
    rng = random.Random(seed)
    zone_of = {u: rng.choice(ZONES) for u in VIP + OTHERS}
    calls = []
    t = START + 600
    while t < START + DAYS * DAY:
        users = rng.sample(VIP + OTHERS, rng.randint(1, 12))
        if rng.random() < 0.2:
            users.append(rng.choice(users))  # one user twice in a call
        campaign = rng.choice(["spring", "news", "flash"])
        custom = rng.random() < 0.3
        calls.append(
            {
                "at": t,
                "channel": rng.choice(["email", "push", "sms"]),
                "campaign": campaign,
                "tags": tuple(rng.sample(["promo", "news"], rng.randint(0, 2))),
                "priority": rng.choice([3, 5, 8]),
                "requests": [
                    (u, f"m{rng.randint(0, 3)}" if custom else f"{campaign}:{u}") for u in users
                ],
                "zones": [zone_of[u] for u in users],
                "give_back": rng.random() < 0.25,
            }
        )
        t += rng.randint(600, 4 * 3600)
    return calls


def made(calls: list[dict], *, since: int = 0, until: int = 2**62) -> list[tuple]:
    """The calls made through the real gate (those from `since` to `until`): each call's
    (day, segment, channel, campaign, reason) per decision. A call that gives a send back gives
    back its first admitted one the first time it is made, and the same send (if admitted)
    every time after, as the ledger says what was given back, not when."""
    out = []
    for call in calls:
        if not since <= call["at"] < until:
            continue
        decisions = gate_check(
            channel=call["channel"],
            requests=call["requests"],
            campaign=call["campaign"],
            tags=call["tags"],
            priority=call["priority"],
            time_zones=call["zones"],
            now=instant(call["at"]),
        )
        day = (date(1970, 1, 1) + timedelta(seconds=call["at"])).isoformat()
        for d in decisions:
            out.append((day, d.segment, call["channel"], call["campaign"], d.reason))
        if call["give_back"]:
            admitted = [(d.user_id, d.message_id) for d in decisions if d.reason == Reason.ALLOWED]
            call.setdefault("given_back", admitted[:1])
            back = [send for send in call["given_back"] if send in admitted]
            if back:
                gate_release(channel=call["channel"], requests=back)
                _default_gate.outcomes(
                    channel=call["channel"],
                    since=instant(call["at"]),
                    outcomes=[(u, m, "released") for u, m in back],
                )
    return out


def counted(result, which: str) -> Counter:
    found: Counter = Counter()
    for entry in result.groups.values():
        for code, n in enumerate(entry[which]):
            if n:
                key = (entry["day"], entry["segment"], entry["channel"], entry["campaign"])
                found[(*key, REASONS[code].value)] += n
    return found


def recent_start() -> int:
    """Midnight UTC six days ago: inside the ledger's days."""
    return int(time.time()) // DAY * DAY - 6 * DAY
