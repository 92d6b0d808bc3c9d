"""The exact sliding-log limiter: the decisions, on top of limits/lua/limiter.lua.

Policy (which caps apply to a user) is the caller's; this module builds each function call from
the requests and the caps, and turns the replies into decisions. How calls reach Redis (nodes,
slots, pipelines, reloading the library, rerouting on a cluster) is `limits.transport`'s.
"""

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings

from gatekeeper.lib.redis_client import get_redis
from limits.transport import Call, FunctionTransport

logger = logging.getLogger(__name__)

NO_CAP = -1
ALL = "all"
REASONS = {1: "allowed", 2: "duplicate", 3: "daily_cap", 4: "weekly_cap", 5: "blocked"}
UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's caps. None: no cap for that window; 0: nothing at all."""

    daily: int | None = None
    weekly: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {"daily": self.daily, "weekly": self.weekly}


@dataclass(frozen=True, slots=True)
class Policy:
    """The caps that apply to one user on one channel: the channel's and the `all` scope's."""

    channel: Limits
    all: Limits


@dataclass(slots=True)
class Decision:
    """One request's decision, from the limiter to the REST answer: the gate fills in
    `segment`, and decides exempt and unavailable requests itself with the same type."""

    user_id: int
    message_id: str
    allowed: bool
    reason: str
    counts: dict[str, int]
    limits: dict[str, int | None]
    retry_after: float | None
    scope: str  # the log the counts describe: the channel's or `all`
    segment: str | None = None


@dataclass(slots=True)
class ScopeUsage:
    scope: str
    daily_used: int
    weekly_used: int
    limits: Limits
    daily_remaining: int | None
    weekly_remaining: int | None
    next_slot_in: float | None


def log_key(prefix: str, user_id: int, scope: str) -> str:
    # The {u:<id>} hash tag puts all of one user's logs in one cluster slot.
    return f"{prefix}{{u:{user_id}}}:{scope}"


def _cap(value: int | None) -> int:
    return NO_CAP if value is None else value


def _remaining(cap: int | None, used: int) -> int | None:
    return None if cap is None else max(cap - used, 0)


class Limiter:
    def __init__(self, client: Any, *, prefix: str = "gk:", fail_open: bool = False) -> None:
        self.client = client
        self.prefix = prefix
        self.fail_open = fail_open
        self.transport = FunctionTransport(client, slot_key=lambda u: log_key(prefix, u, ALL))

    # --- public API ----------------------------------------------------------------------------

    def acquire(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        caps: Policy | Sequence[Policy],
        *,
        now: float | None = None,
        dry_run: bool = False,
    ) -> list[Decision]:
        """One decision per request, in order. Records the admitted ones unless `dry_run`."""
        policies: Sequence[Policy] = [caps] * len(requests) if isinstance(caps, Policy) else caps
        if len(policies) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(policies)} policies")
        now_arg = "" if now is None else str(round(now * 1000))
        user_ids = [user_id for user_id, _ in requests]
        results: list[Decision | None] = [None] * len(requests)

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for chunk in batches:
                keys: list[Any] = []
                args: list[Any] = [now_arg, "1" if dry_run else "0", channel]
                for i in chunk:
                    user_id, message_id = requests[i]
                    policy = policies[i]
                    keys.append(log_key(self.prefix, user_id, channel))
                    keys.append(log_key(self.prefix, user_id, ALL))
                    args.extend(
                        (
                            message_id,
                            _cap(policy.channel.daily),
                            _cap(policy.channel.weekly),
                            _cap(policy.all.daily),
                            _cap(policy.all.weekly),
                        )
                    )
                yield Call("gk_acquire", [len(keys), *keys, *args], chunk)

        def collect(call: Call, reply: list[Any]) -> None:
            for position, i in enumerate(call.indexes):
                k = 1 + 5 * position
                reason, scope_code, daily, weekly, retry = reply[k : k + 5]
                user_id, message_id = requests[i]
                scope = ALL if scope_code == 1 else channel
                limits = policies[i].all if scope_code == 1 else policies[i].channel
                name = REASONS[reason]
                results[i] = Decision(
                    user_id=user_id,
                    message_id=message_id,
                    allowed=name in ("allowed", "duplicate"),
                    reason=name,
                    counts={"daily": daily, "weekly": weekly},
                    limits=limits.as_dict(),
                    retry_after=None if retry < 0 else retry / 1000,
                    scope=scope,
                )

        def fail(indexes: list[int]) -> None:
            for i in indexes:
                user_id, message_id = requests[i]
                results[i] = Decision(
                    user_id=user_id,
                    message_id=message_id,
                    allowed=self.fail_open,
                    reason=UNAVAILABLE,
                    counts={},
                    limits=policies[i].channel.as_dict(),
                    retry_after=None,
                    scope=channel,
                )

        if requests:
            self.transport.run(user_ids, build, collect, fail)
        return [d for d in results if d is not None]

    def release(self, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
        """Take recorded sends back out of both logs. False where nothing was recorded or
        Redis is unavailable (the caller logs it; the entry then ages out with the window)."""
        results = [False] * len(requests)

        user_ids = [u for u, _ in requests]

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for chunk in batches:
                keys: list[Any] = []
                for i in chunk:
                    keys.append(log_key(self.prefix, requests[i][0], channel))
                    keys.append(log_key(self.prefix, requests[i][0], ALL))
                args = [channel, *(requests[i][1] for i in chunk)]
                yield Call("gk_release", [len(keys), *keys, *args], chunk)

        def collect(call: Call, reply: list[Any]) -> None:
            for i, removed in zip(call.indexes, reply, strict=True):
                results[i] = bool(removed)

        if requests:
            self.transport.run(user_ids, build, collect, lambda _: None)
        return results

    def peek(
        self, channel: str, user_id: int, caps: Policy, *, now: float | None = None
    ) -> list[ScopeUsage] | None:
        """The user's usage in the channel log and the `all` log; None if Redis is unavailable."""
        now_arg = "" if now is None else str(round(now * 1000))
        keys = [log_key(self.prefix, user_id, channel), log_key(self.prefix, user_id, ALL)]
        args = [
            now_arg,
            _cap(caps.channel.daily),
            _cap(caps.channel.weekly),
            _cap(caps.all.daily),
            _cap(caps.all.weekly),
        ]
        out: list[Any] = []

        def collect(call: Call, reply: list[Any]) -> None:
            out.extend(reply)

        self.transport.run(
            [user_id],
            lambda batches: [Call("gk_peek", [2, *keys, *args], batch) for batch in batches],
            collect,
            lambda _: None,
        )
        if not out:
            return None
        usage = []
        for s, (scope, limits) in enumerate(((channel, caps.channel), (ALL, caps.all))):
            daily, weekly, retry = out[1 + 3 * s : 4 + 3 * s]
            usage.append(
                ScopeUsage(
                    scope=scope,
                    daily_used=daily,
                    weekly_used=weekly,
                    limits=limits,
                    daily_remaining=_remaining(limits.daily, daily),
                    weekly_remaining=_remaining(limits.weekly, weekly),
                    next_slot_in=None if retry < 0 else retry / 1000,
                )
            )
        return usage

    def history(
        self, user_id: int, scope: str, *, now: float | None = None
    ) -> list[tuple[str, float]]:
        """Recorded sends in the weekly window, newest first: (member, epoch seconds)."""
        now_ms = time.time() * 1000 if now is None else now * 1000
        entries = self.client.zrevrangebyscore(
            log_key(self.prefix, user_id, scope),
            "+inf",
            f"({now_ms - 7 * 86400000}",
            withscores=True,
        )
        return [(m.decode() if isinstance(m, bytes) else m, score / 1000) for m, score in entries]

    def reset(self, user_id: int, scopes: Sequence[str]) -> int:
        """Forget the user's logs (an audited admin action). Returns how many logs existed."""
        keys = [log_key(self.prefix, user_id, scope) for scope in scopes]
        if not keys:
            return 0
        # One slot: the keys share the user's hash tag, so one DEL works on a cluster too.
        return int(self.client.delete(*keys))

    def ping(self) -> bool:
        """True when Redis answers the real function path (for /readyz)."""
        return self.peek("probe", 0, Policy(channel=Limits(), all=Limits())) is not None


@cache
def _limiter_for(url: str, cluster: bool, prefix: str, fail_open: bool) -> Limiter:
    return Limiter(get_redis(), prefix=prefix, fail_open=fail_open)


def get_limiter() -> Limiter:
    """The process-wide limiter for the current settings."""
    return _limiter_for(
        settings.REDIS_URL,
        bool(settings.REDIS_CLUSTER),
        settings.GATEKEEPER_KEY_PREFIX,
        bool(settings.GATEKEEPER_FAIL_OPEN),
    )


def reset_limiter() -> None:
    _limiter_for.cache_clear()
