"""The exact sliding-log limiter: Python side of limits/lua/limiter.lua.

Policy (which caps apply to a user) is the caller's; this module only keeps the logs. A batch
costs one round trip per Redis node: requests are grouped by the node that serves their slot
and each group goes out as one pipeline of FCALLs, each FCALL deciding up to
`USERS_PER_CALL` users (so one call keeps Redis busy for a few milliseconds at most).

On Redis Cluster every FCALL declares only keys of one slot: Redis checks declared keys before
it runs anything, so a call that reaches a node during a slot migration is refused whole
(MOVED/ASK) and is routed again; it never records half a batch. (`allow-cross-slot-keys` would
let one call touch many slots, but only through undeclared keys, which Redis checks one command
at a time: a migration would stop such a call half-way.) A batch to a cluster is therefore one
pipeline per node of one call per slot.
"""

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from hiredis import pack_command
from redis.cluster import ClusterNode, RedisCluster

from gatekeeper.lib.redis_client import get_redis

logger = logging.getLogger(__name__)

LIBRARY = (Path(__file__).parent / "lua" / "limiter.lua").read_text()
LOAD_COMMAND = pack_command(("FUNCTION", "LOAD", "REPLACE", LIBRARY))  # type: ignore[arg-type]
USERS_PER_CALL = 250
# A flush may race with our reload; a few tries make that a non-event.
LOAD_ATTEMPTS = 4
NO_CAP = -1
ALL = "all"
REASONS = {1: "allowed", 2: "duplicate", 3: "daily_cap", 4: "weekly_cap", 5: "blocked"}
UNAVAILABLE = "unavailable"
# Errors after which a group is answered `unavailable`: the server is gone or not serving.
REDIS_DOWN = (redis.exceptions.RedisError, OSError)
# Errors after which a cluster call is routed again: it ran nothing.
REROUTE = (
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


@dataclass(slots=True)
class Call:
    """One FCALL and the requests (by index) it decides, in reply order."""

    function: str
    args: list[Any]
    indexes: list[int]


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
    user_id: int
    message_id: str
    allowed: bool
    reason: str
    counts: dict[str, int]
    limits: dict[str, int | None]
    retry_after: float | None
    scope: str


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


def _is_missing_function(exc: BaseException) -> bool:
    return (
        isinstance(exc, redis.exceptions.ResponseError) and "function not found" in str(exc).lower()
    )


class Limiter:
    def __init__(self, client: Any, *, prefix: str = "gk:", fail_open: bool = False) -> None:
        self.client = client
        self.prefix = prefix
        self.fail_open = fail_open
        self._loaded: set[str] = set()

    # --- routing -----------------------------------------------------------------------------

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    def calls_by_slot(self, user_ids: Sequence[int], indexes: list[int]) -> list[list[int]]:
        """Split one node's requests into the groups that one FCALL may decide together."""
        if not self.is_cluster:
            return [indexes[i : i + USERS_PER_CALL] for i in range(0, len(indexes), USERS_PER_CALL)]
        by_slot: dict[int, list[int]] = {}
        for i in indexes:
            by_slot.setdefault(
                self.client.keyslot(log_key(self.prefix, user_ids[i], ALL)), []
            ).append(i)
        return [
            group[k : k + USERS_PER_CALL]
            for group in by_slot.values()
            for k in range(0, len(group), USERS_PER_CALL)
        ]

    def _groups(self, user_ids: Sequence[int]) -> dict[str, tuple[Any, list[int]]]:
        """Request indexes grouped by the node that serves their slot: node name -> (conn, idx)."""
        if not self.is_cluster:
            return {"single": (self.client, list(range(len(user_ids))))}
        client: RedisCluster = self.client
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, user_id in enumerate(user_ids):
            slot = client.keyslot(log_key(self.prefix, user_id, ALL))
            node: ClusterNode = client.nodes_manager.get_node_from_slot(slot)
            entry = groups.get(node.name)
            if entry is None:
                conn = client.get_redis_connection(node)
                entry = groups[node.name] = (conn, [])
            entry[1].append(i)
        return groups

    def _send_and_read(
        self,
        conn: Any,
        calls: Iterable[Call],
        on_reply: Callable[[Call, Any], None],
        *,
        reload: bool,
    ) -> None:
        """Write each call to the socket as soon as it is built, then read the replies in order.

        This is a hand-made pipeline: Redis starts on the first call while Python still builds
        the next ones, and Python parses each reply while Redis runs the calls after it, so the
        two overlap instead of taking turns. Error replies are handed over as exceptions; a
        broken connection raises and is dropped from the pool.
        """
        pool = conn.connection_pool
        connection = pool.get_connection()
        sent: list[Call] = []
        try:
            for call in calls:
                if reload:
                    # Right before the call, in the same write: Redis runs a client's pipelined
                    # commands back to back, so another client's flush rarely lands in between.
                    connection.send_packed_command([LOAD_COMMAND], check_health=False)
                packed = pack_command(("FCALL", call.function, *call.args))
                connection.send_packed_command([packed], check_health=False)
                sent.append(call)
            for call in sent:
                if reload:
                    with contextlib.suppress(redis.exceptions.ResponseError):
                        connection.read_response()
                try:
                    reply = connection.read_response()
                except redis.exceptions.ResponseError as exc:
                    reply = exc
                on_reply(call, reply)
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)

    def _run_group(
        self, conn: Any, calls: Iterable[Call], on_reply: Callable[[Call, Any], None], name: str
    ) -> None:
        """Run a node's calls; a missing library (FUNCTION FLUSH, a restart, a failover to a
        node without it) makes a call run nothing, so those calls are resent with the library."""
        missing: list[Call] = []

        def sort(call: Call, reply: Any) -> None:
            if _is_missing_function(reply):
                missing.append(call)
            else:
                on_reply(call, reply)

        if name not in self._loaded:
            # Once per node and process; afterwards only a missing-function reply reloads it.
            conn.function_load(LIBRARY, replace=True)
            self._loaded.add(name)
        self._send_and_read(conn, calls, sort, reload=False)
        for _ in range(LOAD_ATTEMPTS):
            if not missing:
                return
            logger.info("Limiter functions missing on %s: loading them again", name)
            todo, missing[:] = list(missing), []
            self._send_and_read(conn, todo, sort, reload=True)
        for call in missing:
            on_reply(call, redis.exceptions.ResponseError("limiter functions could not be loaded"))

    def _per_node(
        self,
        user_ids: Sequence[int],
        build: Callable[[list[int]], Iterable[Call]],
        collect: Callable[[Call, Any], None],
        fail: Callable[[list[int]], None],
    ) -> None:
        """Run the calls `build` makes for each node's requests; hand each reply to `collect`.

        Requests whose node is down get `fail`. In a cluster, a call refused because its slot
        moved (or a node that went away) refreshes the topology and is routed again, at most
        twice: a refused call ran nothing, so resending it cannot count a send twice.
        """
        pending = list(range(len(user_ids)))
        for attempt in range(3):
            if not pending:
                return
            retry: list[int] = []
            try:
                groups = self._groups([user_ids[i] for i in pending])
            except REDIS_DOWN as exc:
                logger.warning("Redis unavailable for the limiter: %s", exc)
                fail(pending)
                return
            for name, (conn, local) in groups.items():
                answered: set[int] = set()

                def on_reply(
                    call: Call,
                    reply: Any,
                    name: str = name,
                    answered: set[int] = answered,
                    attempt: int = attempt,
                    retry: list[int] = retry,
                ) -> None:
                    answered.update(call.indexes)
                    if not isinstance(reply, Exception):
                        collect(call, reply)
                    elif self.is_cluster and attempt < 2 and isinstance(reply, REROUTE):
                        retry.extend(call.indexes)
                    else:
                        logger.warning("Limiter call failed on %s: %s", name, reply)
                        fail(call.indexes)

                indexes = [pending[j] for j in local]
                try:
                    self._run_group(conn, build(indexes), on_reply, name)
                except REDIS_DOWN as exc:
                    unanswered = [i for i in indexes if i not in answered]
                    if self.is_cluster and attempt < 2 and isinstance(exc, REROUTE):
                        retry.extend(unanswered)
                    else:
                        logger.warning("Redis unavailable for the limiter on %s: %s", name, exc)
                        fail(unanswered)
            if retry:
                self._refresh()
            pending = retry
        if pending:
            fail(pending)

    def _refresh(self) -> None:
        logger.info("Cluster topology changed: refreshing")
        self._loaded.clear()
        try:
            self.client.nodes_manager.initialize()
        except REDIS_DOWN as err:
            logger.warning("Could not refresh the cluster topology: %s", err)

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

        def build(indexes: list[int]) -> Iterator[Call]:
            for chunk in self.calls_by_slot(user_ids, indexes):
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
            self._per_node(user_ids, build, collect, fail)
        return [d for d in results if d is not None]

    def release(self, channel: str, requests: Sequence[tuple[int, str]]) -> list[bool]:
        """Take recorded sends back out of both logs. False where nothing was recorded or
        Redis is unavailable (the caller logs it; the entry then ages out with the window)."""
        results = [False] * len(requests)

        user_ids = [u for u, _ in requests]

        def build(indexes: list[int]) -> Iterator[Call]:
            for chunk in self.calls_by_slot(user_ids, indexes):
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
            self._per_node(user_ids, build, collect, lambda _: None)
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

        self._per_node(
            [user_id],
            lambda idx: [Call("gk_peek", [2, *keys, *args], idx)],
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
