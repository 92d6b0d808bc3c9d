"""Provider rate limits: one sending rate per provider that every worker together keeps.

A provider takes so many sends a second (Amazon SES: the account's maximum send rate, 14 by
default; FCM and APNs: a few hundred to thousands) and answers more with throttling errors.
`GATEKEEPER_PROVIDER_RATES` (`smtp=14,webhook=500`) names the providers that have one, by the
dispatcher's `provider`; each gets a token bucket in Redis (`<prefix>rate:{<provider>}`, one
key, so one slot on a cluster) that every worker process takes from before handing sends over:

- the bucket fills at `rate` tokens a second up to a burst of 4% of a second's worth (at
  least 1), so the rate holds, within 4%, over any second a provider counts in;
- a worker asks for as many tokens as it has sends and is granted what is there; for the rest
  it is told how long until the next token, waits, and asks again (the chunk's lease renewed
  while it waits);
- a provider that answers "too many" anyway (HTTP 429, SES Throttling) holds the bucket for
  every worker for the time it asked (`Retry-After`) or a second, and the refused sends are
  sent again after it, as often as RETHROTTLED_MAX times, before they count as transient
  failures (a later chunk);
- the clock is Redis's (`TIME`), one for every worker; tests pass `now_ms`;
- the bucket's node away (a failover: a replica is promoted within seconds) is waited for, a
  quarter second then twice as long each time, 7.75 s at most, before the run gives up: a
  worker asks for tokens after its batch's places are marked `sending`, so a run that gave up
  at once would leave a batch it never sent to be counted as ambiguous.

A provider without a rate is not throttled and costs no round trip.
"""

import functools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured

from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis

T = TypeVar("T")
R = TypeVar("R")

PROVIDER = re.compile(r"[a-z][a-z0-9_-]{0,31}")
RATE_MAX = 1_000_000  # sends a second
# The burst: 4% of a second's sends, so that no second a provider counts in sees more than
# the rate and 4%.
BURST_SECONDS = 0.04
RETHROTTLED_MAX = 5  # times a send the provider refused for its rate is sent again in a run

# The bucket's script, loaded once per client (register_script: EVALSHA, EVAL when Redis lost
# it); its header says what it takes and answers.
TAKE = (Path(__file__).parent / "lua" / "throttle.lua").read_text()


@dataclass(frozen=True, slots=True)
class Rate:
    per_second: float
    burst: int


@functools.lru_cache(maxsize=8)
def parse_rates(text: str) -> dict[str, Rate]:
    """`GATEKEEPER_PROVIDER_RATES`: `provider=rate` pairs separated by commas (`smtp=14,
    webhook=500`; a rate may have decimals: `smtp=0.5`). Raises ImproperlyConfigured naming
    the pair that is wrong."""
    rates: dict[str, Rate] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        name, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not PROVIDER.fullmatch(name):
            raise ImproperlyConfigured(
                f"GATEKEEPER_PROVIDER_RATES: {pair!r} is not provider=rate (a provider is "
                "lowercase letters, digits, '-' and '_', starting with a letter; e.g. smtp=14)."
            )
        try:
            per_second = float(value)
        except ValueError:
            per_second = float("nan")
        if not 0 < per_second <= RATE_MAX:  # also refuses nan
            raise ImproperlyConfigured(
                f"GATEKEEPER_PROVIDER_RATES: the rate of {name!r} is {value!r}; a rate is sends "
                f"a second, more than 0 and at most {RATE_MAX:,}."
            )
        if name in rates:
            raise ImproperlyConfigured(f"GATEKEEPER_PROVIDER_RATES names {name!r} twice.")
        rates[name] = Rate(per_second, max(1, int(per_second * BURST_SECONDS)))
    return rates


def bucket_key(provider: str) -> str:
    return f"{settings.GATEKEEPER_KEY_PREFIX}rate:{{{provider}}}"


class Throttle:
    """One provider's bucket (or a dispatcher's for one mailbox provider: `key`), shared by
    every process through Redis."""

    def __init__(
        self,
        provider: str,
        rate: Rate,
        *,
        client: Any = None,
        clock: Callable[[], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        key: str | None = None,
    ) -> None:
        """`clock()` (tests): the time in ms, instead of Redis's; `sleep(seconds)` then is
        what moves it on."""
        self.provider, self.rate = provider, rate
        self.key = key or bucket_key(provider)
        self.client = client or get_redis()
        self.script = self.client.register_script(TAKE)
        self.clock, self.sleep = clock, sleep
        self.ahead = 0  # tokens taken already (taken_together), handed out before asking

    def take(self, want: int, least: int = 1) -> tuple[int, float]:
        """(tokens granted, at most `want`: none, or at least `least` (capped at the burst);
        seconds until `least` more are there when short)."""
        if self.ahead:
            granted = min(want, self.ahead)
            self.ahead -= granted
            return granted, 0.0
        return self._call(want, least, 0)

    def hold(self, seconds: float) -> None:
        """No tokens for anyone for `seconds` (the provider said "too many")."""
        self._call(0, 0, max(1, round(seconds * 1000)))

    def _args(self, want: int, least: int) -> list[Any]:
        return [repr(self.rate.per_second), self.rate.burst, want, least]

    def _call(self, want: int, least: int, hold_ms: int) -> tuple[int, float]:
        now_ms = -1 if self.clock is None else self.clock()
        ((granted, wait),) = self.script(
            keys=[self.key], args=[now_ms, hold_ms, *self._args(want, least)]
        )
        return int(granted), int(wait) / 1000


def taken_together(wanted: Sequence[tuple[Throttle, int]]) -> None:
    """What each bucket has now, up to what is wanted of it, taken in one call (their keys in
    one slot, one client and clock) and kept as the throttle's `ahead`; nothing waited for."""
    if not wanted:
        return
    first = wanted[0][0]
    now_ms = -1 if first.clock is None else first.clock()
    args: list[Any] = [now_ms, 0]
    for throttle, want in wanted:
        args.extend(throttle._args(want, 0))
    answer = first.script(keys=[t.key for t, _ in wanted], args=args)
    for (throttle, _), (granted, _wait) in zip(wanted, answer, strict=True):
        throttle.ahead += int(granted)


def group_bucket_key(provider: str, group: str) -> str:
    """A dispatcher's bucket for one mailbox provider: tagged with the dispatcher's name, so
    that its groups' buckets share a slot and are taken from in one call."""
    return f"{settings.GATEKEEPER_KEY_PREFIX}rate:{{{provider}}}:{group}"


def throttle_named(provider: str, group: str, rate: Rate) -> Throttle:
    """A dispatcher's bucket for one mailbox provider (worker/delivery/mailboxes.py), shared by
    every process as a provider's is."""
    return Throttle(f"{provider}:{group}", rate, key=group_bucket_key(provider, group))


def throttle_for(provider: str | None) -> Throttle | None:
    """The provider's throttle, or None when GATEKEEPER_PROVIDER_RATES gives it no rate."""
    rate = parse_rates(settings.GATEKEEPER_PROVIDER_RATES).get(provider or "")
    return None if rate is None else Throttle(provider or "", rate)


def paced(
    throttle: Throttle | None,
    items: Sequence[T],
    send: Callable[[Sequence[T]], list[R]],
    *,
    waiting: Callable[[float], None] | None = None,
    later: Callable[[Sequence[T], float], list[R]] | None = None,
    waits_max: float = float("inf"),
) -> list[R]:
    """`send` over `items` in the order given, no faster than the throttle grants tokens, in
    parts of at least half a burst (2% of a second of the rate) or what is left, so that a
    provider's batch calls stay batches. `waiting(seconds)` waits (the worker renews its
    chunk's lease in it); the throttle's `sleep` by default. Without a throttle, one call.
    With `later`, a wait longer than `waits_max` seconds is not waited: `later(the items left,
    the wait)` answers for them."""
    if throttle is None or not items:
        return send(items)
    wait_for = waiting or throttle.sleep
    results: list[R] = []
    start = 0
    while start < len(items):
        left = len(items) - start
        # Half a burst at least: a bucket waited on until full would lose what came while
        # the worker woke and asked.
        least = min(left, max(1, throttle.rate.burst // 2))
        granted, wait = _taken(throttle, left, least, wait_for)
        if not granted and later is not None and wait > waits_max:
            return results + later(items[start:], wait)
        if granted:
            results.extend(send(items[start : start + granted]))
            start += granted
        if start < len(items) and wait > 0:
            wait_for(wait)
    return results


# How long each wait for the bucket's node is, one after the other (7.75 s in all).
AWAY_WAITS = (0.25, 0.5, 1.0, 2.0, 4.0)


def _taken(
    throttle: Throttle, want: int, least: int, wait_for: Callable[[float], None]
) -> tuple[int, float]:
    """throttle.take, its node waited for while it is away (AWAY_WAITS), then given up."""
    for pause in AWAY_WAITS:
        try:
            return throttle.take(want, least=least)
        except REDIS_DOWN:
            wait_for(pause)
    return throttle.take(want, least=least)


@register()
def provider_rates_check(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    try:
        parse_rates(str(settings.GATEKEEPER_PROVIDER_RATES))
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="e.g. GATEKEEPER_PROVIDER_RATES=smtp=14,webhook=500",
                id="worker.E001",
            )
        ]
    return []
