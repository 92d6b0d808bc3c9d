"""Warm-up plans: a new sending domain's volume per mailbox provider for each day.

Mailbox providers judge a domain by its history: a new one that sends a million messages on its
first day is throttled or sent to spam. A plan (`WarmupPlan`) says, for each day since its start
in its time zone, how many messages each group (worker/delivery/mailboxes.py) may get from the
domain; a group the plan does not name is not held.

- The day's count is one Redis hash a domain and day (`<prefix>warmup:{<domain>}:<YYYY-MM-DD>`,
  group -> messages), kept three days. A chunk run takes its sends' volume before the gate, in
  one call (worker/delivery/lua/warmup.lua); what is beyond the day's volume waits for the
  next day's start (deferred with the reason `warming_up`, never dropped), without having
  charged anybody's caps. What the gate then refuses is given back.
- After the last day, the last day's volume holds every day until a day's sends reach it: then
  the group's ramp has ended (`ended`, with the day) and it is held no more. A plan ends when
  every group it names has ended.
- Before its first day a plan holds nothing.
- A run that dies after taking volume leaves it taken: the day counts a little more than went
  out, never less.

The one rule for a plan's fields is `warmup_problems`; DEFAULT_RAMP is the ramp offered.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from gatekeeper.lib.redis_client import get_redis
from gatekeeper.lib.zones import UnknownTimeZone, zone
from worker.delivery.dns_checks import hostname_problem

# The ramp offered for each group of a new plan: messages a day, doubling at first, then by
# half, to 700,000 on day 20.
DEFAULT_RAMP = (
    50, 100, 200, 400, 800, 1_500, 3_000, 5_000, 8_000, 12_000,
    18_000, 27_000, 40_000, 60_000, 90_000, 135_000, 200_000, 300_000, 450_000, 700_000,
)  # fmt: skip
DAYS_MAX = 366
VOLUME_MAX = 100_000_000
KEPT_SECONDS = 3 * 86_400
PLANS_TTL = 5.0  # seconds a process keeps the plans it read
_SCRIPT = (Path(__file__).parent / "lua" / "warmup.lua").read_text()


@dataclass(frozen=True)
class Plan:
    """A plan as a chunk run reads it."""

    id: int
    domain: str
    time_zone: str
    starts_on: date
    volumes: dict[str, list[int]]
    ended: dict[str, str]

    def day(self, now: datetime) -> tuple[int, date, datetime]:
        """(the day's index since the start (negative: before it), its date, when the next
        day starts) at `now`, in the plan's zone."""
        tz = zone(self.time_zone)
        today = now.astimezone(tz).date()
        following = datetime.combine(today + timedelta(days=1), datetime.min.time(), tz)
        return (today - self.starts_on).days, today, following

    def volume(self, group: str, index: int) -> int | None:
        """The group's volume on day `index`, None when it is not held (not named, ended, or
        before the start)."""
        ramp = self.volumes.get(group)
        if ramp is None or group in self.ended or index < 0:
            return None
        return ramp[min(index, len(ramp) - 1)]

    @property
    def over(self) -> bool:
        return all(group in self.ended for group in self.volumes)


_read: tuple[float, dict[str, Plan]] | None = None


def warmup_plans(*, fresh: bool = False) -> dict[str, Plan]:
    """The plans by domain, read from the database at most every PLANS_TTL seconds."""
    global _read
    now = time.monotonic()
    if fresh or _read is None or now - _read[0] > PLANS_TTL:
        from worker.models import WarmupPlan

        plans = {row.domain: plan_of(row) for row in WarmupPlan.objects.all()}
        _read = (now, plans)
    return _read[1]


def plan_of(row: Any) -> Plan:
    """A WarmupPlan row as a chunk run reads it."""
    return Plan(row.pk, row.domain, row.time_zone, row.starts_on, row.volumes, dict(row.ended))


def warmup_forget() -> None:
    global _read
    _read = None


def day_key(domain: str, day: date) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}warmup:{{{domain}}}:{day.isoformat()}"


def warmup_take(
    plan: Plan, day: date, wants: Mapping[str, tuple[int, int]], *, client: Any = None
) -> dict[str, tuple[int, int]]:
    """Take (or, a negative want, give back) volume of the day: `wants` is group -> (messages,
    the day's volume). Returns group -> (granted, taken that day after)."""
    if not wants:
        return {}
    client = client or get_redis()
    args: list[Any] = [KEPT_SECONDS]
    for group, (want, volume) in wants.items():
        args.extend((group, want, volume))
    answer = client.register_script(_SCRIPT)(keys=[day_key(plan.domain, day)], args=args)
    return {
        group: (int(granted), int(used))
        for group, (granted, used) in zip(wants, answer, strict=True)
    }


def warmup_taken(plan: Plan, day: date, *, client: Any = None) -> dict[str, int]:
    """The messages each group got from the domain on `day`."""
    client = client or get_redis()
    found = client.hgetall(day_key(plan.domain, day))
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in found.items()}


def warmup_ended(plan: Plan, groups: Sequence[str], day: date) -> None:
    """The groups' ramps ended on `day` (a day's sends reached the last day's volume)."""
    from worker.models import WarmupPlan

    with transaction.atomic():
        row = WarmupPlan.objects.select_for_update().filter(pk=plan.id).first()
        if row is None:
            return
        ended = dict(row.ended)
        for group in groups:
            ended.setdefault(group, day.isoformat())
        if ended != row.ended:
            WarmupPlan.objects.filter(pk=plan.id).update(ended=ended)
    warmup_forget()


# --- the one rule for a plan's fields ---------------------------------------------------------


def warmup_problems(fields: Mapping[str, Any], *, groups: Sequence[str]) -> dict[str, list[str]]:
    """Problems by field of a plan's fields (domain, time_zone, starts_on, volumes); `groups`:
    the mailbox providers' slugs."""
    problems: dict[str, list[str]] = {}
    domain = fields.get("domain")
    wrong = hostname_problem(domain) if isinstance(domain, str) else "A domain: a text."
    if wrong:
        problems["domain"] = [wrong]
    name = fields.get("time_zone")
    try:
        zone(name if isinstance(name, str) else "")
    except UnknownTimeZone as exc:
        problems["time_zone"] = [exc.message]
    if not isinstance(fields.get("starts_on"), date):
        problems["starts_on"] = ["A date, YYYY-MM-DD: the plan's first day."]
    found = volumes_problems(fields.get("volumes"), groups=groups)
    if found:
        problems["volumes"] = found
    return problems


def volumes_problems(volumes: Any, *, groups: Sequence[str]) -> list[str]:
    if not isinstance(volumes, dict) or not volumes:
        return ['Each group\'s volume for each day: {"gmail": [50, 100, ...], ...}.']
    problems = []
    for group, ramp in volumes.items():
        if group not in groups:
            problems.append(
                f"{group!r} is no mailbox provider (there are: {', '.join(sorted(groups))})."
            )
            continue
        if not isinstance(ramp, list) or not 1 <= len(ramp) <= DAYS_MAX:
            problems.append(f"{group}: a list of 1 to {DAYS_MAX} daily volumes.")
            continue
        for day, volume in enumerate(ramp, start=1):
            if isinstance(volume, bool) or not isinstance(volume, int):
                problems.append(f"{group}, day {day}: {volume!r} is not a whole number.")
            elif volume < 1:
                problems.append(
                    f"{group}, day {day}: {volume}; each day sends at least 1 (a day of 0 "
                    "would hold the group's mail to the next day)."
                )
            elif volume > VOLUME_MAX:
                problems.append(f"{group}, day {day}: {volume:,} is more than {VOLUME_MAX:,}.")
    return problems
