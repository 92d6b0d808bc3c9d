"""The limiter: decisions over each user's send log, on top of limits/engine/lua/limiter.lua.

Which rules apply to a request is the caller's (limits.engine.table gives them as `RuleSet`s); this
module builds each function call from the requests and their rule sets, and turns the replies
into decisions. How calls reach Redis (nodes, slots, pipelines, reloading the library, rerouting
on a cluster) is `limits.engine.transport`'s; the bytes of the log are `limits.engine.log`'s.
"""

import contextlib
import logging
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from django.conf import settings

from gatekeeper.lib.instants import ms_checked, ms_or_now
from gatekeeper.lib.redis_client import REDIS_DOWN, get_redis
from limits.channels import ALL
from limits.engine import log
from limits.engine.legacy import LegacyLogs
from limits.engine.table import DEFAULT_PRIORITY, NO_RULES, RuleSet, RuleView
from limits.engine.transport import LIMITER_LIBRARY, Call, FunctionLibrary, FunctionTransport
from limits.reasons import Reason

logger = logging.getLogger(__name__)

# The library's answers for an admitted request (limits/engine/lua/limiter.lua).
ALLOWED, DUPLICATE = 1, 2
_REQUEST = struct.Struct(">HB")
# How often a limiter asks Redis whether the logs have all moved into their groups.
GROUPED_CHECK_SECONDS = 60.0


@dataclass(slots=True)
class Decision:
    """One request's decision, from the limiter to the REST answer: the gate fills in
    `segment`, and decides exempt and unavailable requests itself with the same type.

    `counts`: the channel's recorded sends in the last 24 h and 7 days (after this one);
    `limits`: the classic caps of the request's channel (None: no cap); `rule`: the rule that
    refused it; `reserved`: the slots a priority reserve kept from it, when that refused it."""

    user_id: int
    message_id: str
    allowed: bool
    reason: str
    counts: dict[str, int]
    limits: dict[str, int | None]
    retry_after: float | None
    rule: dict[str, Any] | None = None
    reserved: int | None = None
    # On reason `reserved`: the scheduled job whose reservation held the slot back.
    reserved_for: int | None = None
    segment: str | None = None
    holder: int | None = None  # a duplicate's: the send job that recorded it (0: none)
    # On reason `preference`: what the person switched off ({"topic": slug or None, "channel"}).
    preference: dict[str, Any] | None = None
    # The user's running experiment and arm ({"id", "arm": its name}), whatever the reason;
    # `arm_place`: the arm's place in it (what the ledger keeps).
    experiment: dict[str, Any] | None = None
    arm_place: int | None = None
    # On reason `outranked` (a round, worker/rounds.py): the job that won the user's slot and
    # what its send was worth to them ({"job", "value"}).
    outranked_by: dict[str, Any] | None = None
    # Refused as an erased person (limits.people.suppression.erased_keys): not kept in the ledger.
    erased: bool = False


@dataclass(frozen=True, slots=True)
class RuleUsage:
    """One rule's figures for a user: what it counts now, and when a slot frees if it is full."""

    rule: RuleView
    channel: str
    used: int
    limit: int
    next_slot_in: float | None

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


class Decider(Protocol):
    """What decides a gate call's requests under their rules: the limiter (its function in
    Redis), or the decision model over logs held in memory (limits.engine.model.ModelLimiter,
    the plan's)."""

    def acquire(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        rule_sets: "RuleSet | Sequence[RuleSet]",
        *,
        campaign: str = "",
        tags: tuple[str, ...] = (),
        priority: int = DEFAULT_PRIORITY,
        retention_ms: int = 8 * 86_400_000,
        now_ms: int | None = None,
        dry_run: bool | Sequence[bool] = False,
        holder: int = 0,
        uncounted: bool = False,
    ) -> list[Decision]: ...


def per_request(
    requests: Sequence[tuple[int, str]],
    rule_sets: RuleSet | Sequence[RuleSet],
    dry_run: bool | Sequence[bool],
) -> tuple[Sequence[RuleSet], list[bool]]:
    """A call's rule sets and dry-run flags, one per request (given for all, or per request);
    a ValueError when a list's length is not the requests'."""
    sets = [rule_sets] * len(requests) if isinstance(rule_sets, RuleSet) else rule_sets
    if len(sets) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(sets)} rule sets")
    dry = [dry_run] * len(requests) if isinstance(dry_run, bool) else list(dry_run)
    if len(dry) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(dry)} dry-run flags")
    return sets, dry


# Rule sets a call of gk_decide_each may have: a request's set byte + 128 marks a dry run.
EACH_SETS = 127


def _now_arg(now_ms: int | None) -> str:
    """The clock a library call is given: empty for Redis's own."""
    return "" if now_ms is None else str(now_ms)


class Limiter:
    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "gk:",
        fail_open: bool = False,
        upgrade: bool = False,
        library: FunctionLibrary = LIMITER_LIBRARY,
        groups: bool = True,
    ) -> None:
        """`library`: the function library it calls, this release's unless told (a test runs
        another release's beside it). `groups`: the home of a user's logs is its group's key, not
        its bucket (docs/limiter.md, "Buckets and groups": what the next release does; tests run
        it beside this one)."""
        self.client = client
        self.prefix = prefix
        self.fail_open = fail_open
        self.groups = groups
        self.home = log.group_key if groups else log.bucket_key
        self._grouped, self._grouped_checked = False, 0.0
        self.transport = FunctionTransport(
            client,
            slot_key=lambda u: self.home(prefix, u),
            order_key=lambda u: u,
            slot_group=lambda u: u >> log.BUCKET_BITS,
            library=library,
        )
        # While logs of the earlier format may remain: moved into the new log before deciding.
        self.legacy = (
            LegacyLogs(client, prefix=prefix, import_entries=self.import_entries)
            if upgrade
            else None
        )

    # --- deciding ------------------------------------------------------------------------------

    def acquire(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        rule_sets: RuleSet | Sequence[RuleSet],
        *,
        campaign: str = "",
        tags: tuple[str, ...] = (),
        priority: int = DEFAULT_PRIORITY,
        retention_ms: int = 8 * 86_400_000,
        now_ms: int | None = None,
        dry_run: bool | Sequence[bool] = False,
        holder: int = 0,
        uncounted: bool = False,
    ) -> list[Decision]:
        """One decision per request, in order. Records the admitted ones unless `dry_run` (for
        all, or per request: marked one by one in the same calls, gk_decide_each).
        `rule_sets`: one per request (or one for all): the rules each must fit.
        `holder`: the send job the entries are recorded for (a duplicate answers the holder of
        the entry found); `uncounted`: record in the users' uncounted logs (a job's
        transactional sends: claimed, never counted), the rule sets then being empty.
        `now_ms`: the clock, epoch milliseconds (None: Redis's own)."""
        now_ms = ms_checked(now_ms)
        sets, dry = per_request(requests, rule_sets, dry_run)
        if not requests:
            return []
        user_ids = [user_id for user_id, _ in requests]
        results: list[Decision | None] = [None] * len(requests)

        def fail(indexes: list[int]) -> None:
            for i in indexes:
                user_id, message_id = requests[i]
                results[i] = Decision(
                    user_id=user_id,
                    message_id=message_id,
                    allowed=self.fail_open,
                    reason=Reason.UNAVAILABLE,
                    counts={},
                    limits=sets[i].limits,
                    retry_after=None,
                )

        if not self._legacy_moved(user_ids, now_ms=now_ms, retention_ms=retention_ms):
            # The old logs could not be counted: deciding without them could admit too much.
            fail(list(range(len(requests))))
            return [d for d in results if d is not None]
        heads = {
            flag: [
                _now_arg(now_ms),
                "1" if flag else "0",
                channel,
                str(priority),
                str(retention_ms),
            ]
            for flag in (False, True)
        }
        tail = [str(holder), "1" if uncounted else "0", "1" if self.grouped() else "0"]
        tag_hashes = log.tags_bytes(tags)
        payload_head = log.short_hash(campaign) + bytes((len(tag_hashes) // 4,)) + tag_hashes
        hashes = [log.message_hash(message_id) for _, message_id in requests]

        mixed = len(set(dry)) > 1

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for chunk in batches:
                flags = {dry[i] for i in chunk} if mixed else {dry[chunk[0]]}
                if len(flags) == 1:
                    yield call_of(chunk, heads[flags.pop()], each=False)
                    continue
                call = call_of(chunk, heads[False], each=True)
                if call is not None:
                    yield call
                    continue
                for flag in (False, True):  # too many rule sets to mark: a call each
                    yield call_of([i for i in chunk if dry[i] == flag], heads[flag], each=False)

        def call_of(chunk: list[int], head: list[str], *, each: bool) -> Any:
            """A call deciding `chunk`; `each`: its dry runs marked one by one (gk_decide_each;
            None when its rule sets are too many to mark)."""
            keys: dict[str, int] = {}
            set_index: dict[bytes, int] = {}
            set_records: list[bytes] = []  # each: its rule count, then its records
            parts: list[bytes] = []
            for i in chunk:
                user_id = user_ids[i]
                key = self.home(self.prefix, user_id)
                k = keys.get(key)
                if k is None:
                    k = keys[key] = len(keys) + 1
                rule_set = sets[i]
                # By its records: rule sets that differ only in what their decisions show (a
                # reservation's hold naming its job) are one set of the call.
                s = set_index.get(rule_set.records)
                if s is None:
                    set_records.append(bytes((len(rule_set.rules),)) + rule_set.records)
                    s = set_index[rule_set.records] = len(set_records)
                    if each and s > EACH_SETS:
                        return None
                mark = s + 128 if each and dry[i] else s
                parts.append(_REQUEST.pack(k, user_id & 0xFF) + hashes[i] + bytes((mark,)))
            payload = b"".join((payload_head, bytes((len(set_records),)), *set_records, *parts))
            name = "gk_decide_each" if each else "gk_decide"
            return Call(name, [len(keys), *keys, *head, payload, *tail], chunk)

        def collect(call: Call, reply: list[Any]) -> None:
            for i, answer in zip(call.indexes, log.iter_replies(reply[1]), strict=True):
                results[i] = self._decision(
                    requests[i], sets[i], *answer, now_ms=int(reply[0]), priority=priority
                )

        self.transport.run(user_ids, build, collect, fail)
        return [d for d in results if d is not None]

    @staticmethod
    def _decision(
        request: tuple[int, str],
        rule_set: RuleSet,
        outcome: int,
        rule_at: int,
        used: int,
        retry: int,
        day: int,
        week: int,
        *,
        now_ms: int,
        priority: int,
    ) -> Decision:
        user_id, message_id = request
        counts = {"daily": day, "weekly": week}
        if outcome in (ALLOWED, DUPLICATE):
            return Decision(
                user_id=user_id,
                message_id=message_id,
                allowed=True,
                reason=Reason.ALLOWED if outcome == ALLOWED else Reason.DUPLICATE,
                counts=counts,
                limits=rule_set.limits,
                retry_after=None,
                holder=None if outcome == ALLOWED else used,
            )
        rule = rule_set.rules[rule_at - 1]
        reason, reserved, reserved_for = rule.reason(), None, None
        retry_after = (retry - 1) / 1000 if retry else None
        hold = rule_set.held[rule_at - 1] if rule_set.held else None
        if hold is not None and used < rule.limit_for(priority):
            # The rule had room, even after its priority reserve; a reservation's hold did not:
            # held until the reserved job starts.
            reason, reserved, reserved_for = Reason.RESERVED, hold[0], hold[1]
            retry_after = max(0.0, (hold[2] - now_ms) / 1000)
        elif rule_set.effective[rule_at - 1] < rule.limit and used < rule.limit:
            reserved = rule.reserve_slots  # the rule had room; its reserve did not
        return Decision(
            user_id=user_id,
            message_id=message_id,
            allowed=False,
            reason=reason,
            counts=counts,
            limits=rule_set.limits,
            retry_after=retry_after,
            rule=rule.as_decision(used),
            reserved=reserved,
            reserved_for=reserved_for,
        )

    def release(
        self,
        channel: str,
        requests: Sequence[tuple[int, str]],
        *,
        holder: int = 0,
        uncounted: bool = False,
    ) -> list[bool]:
        """Take recorded sends back out of their users' logs (the uncounted logs with
        `uncounted`; with `holder`, only entries that send job recorded). False where nothing
        was recorded or Redis is unavailable (the caller logs it; the entry then ages out with
        the window)."""
        results = [False] * len(requests)
        user_ids = [u for u, _ in requests]
        if not requests or not self._legacy_moved(user_ids, now_ms=None):
            return results
        field = log.uncounted_field if uncounted else log.bucket_field

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for chunk in batches:
                keys = [self.home(self.prefix, user_ids[i]) for i in chunk]
                args: list[Any] = [channel, holder]
                for i in chunk:
                    args.append(field(user_ids[i]))
                    args.append(log.message_hash(requests[i][1]))
                yield Call("gk_release", [len(keys), *keys, *args], chunk)

        def collect(call: Call, reply: list[Any]) -> None:
            for i, removed in zip(call.indexes, reply, strict=True):
                results[i] = bool(removed)

        self.transport.run(user_ids, build, collect, lambda _: None)
        return results

    # --- reading -------------------------------------------------------------------------------

    def usage(
        self,
        user_id: int,
        groups: Sequence[tuple[str, RuleSet]],
        *,
        campaign: str = "",
        now_ms: int | None = None,
    ) -> list[RuleUsage] | None:
        """Each rule's figures for one user, per (channel, rule set) group; None if Redis is
        unavailable. A per-campaign rule without `campaign` shows the campaign that used most."""
        now_ms = ms_checked(now_ms)
        if not self._legacy_moved([user_id], now_ms=now_ms):
            return None
        args: list[Any] = [_now_arg(now_ms), log.bucket_field(user_id), log.short_hash(campaign)]
        for channel, rule_set in groups:
            args.extend((channel, rule_set.records))
        key = self.home(self.prefix, user_id)
        out: list[Any] = []

        def collect(call: Call, reply: list[Any]) -> None:
            out.extend(reply)

        self.transport.run(
            [user_id],
            lambda batches: [Call("gk_usage", [1, key, *args], batch) for batch in batches],
            collect,
            lambda _: None,
        )
        if not out:
            return None
        figures, k = [], 1
        for channel, rule_set in groups:
            for rule, limit in zip(rule_set.rules, rule_set.effective, strict=True):
                used, retry = int(out[k]), int(out[k + 1])
                k += 2
                figures.append(
                    RuleUsage(
                        rule=rule,
                        channel=channel,
                        used=used,
                        limit=limit,
                        next_slot_in=None if retry < 0 else retry / 1000,
                    )
                )
        return figures

    def entries(self, user_id: int, *, uncounted: bool = False) -> list[log.Entry]:
        """The user's log as it is stored (every channel, entries not trimmed yet included);
        with `uncounted`, the user's uncounted log (a send job's transactional sends)."""
        field = log.uncounted_field(user_id) if uncounted else log.bucket_field(user_id)
        pipe = self.client.pipeline(transaction=False)
        for key in log.user_keys(self.prefix, user_id):
            pipe.hget(key, field)
        in_bucket, in_group = pipe.execute()
        return log.decode(in_bucket or in_group)

    def history(self, user_id: int, *, now_ms: int | None = None) -> list[log.Entry]:
        """Recorded sends in the last 7 days, newest first (`now_ms`: None, this process's
        clock)."""
        now_ms = ms_checked(now_ms)
        since = ms_or_now(now_ms) - 7 * 86_400_000
        found = [e for e in self.entries(user_id) if e.at_ms > since]
        return sorted(found, key=lambda e: -e.at_ms)

    def reset(self, user_id: int) -> bool:
        """Forget the user's log (an audited admin action). True if there was one."""
        forgot = False
        if self.legacy is not None:
            # The old logs first: a move running meanwhile then has nothing to bring back.
            forgot = self.legacy.forget(user_id)
        field = log.bucket_field(user_id)
        pipe = self.client.pipeline(transaction=False)
        for key in log.user_keys(self.prefix, user_id):
            pipe.hdel(key, field)
        return any(pipe.execute()) or forgot

    def forget(self, user_ids: Sequence[int]) -> int:
        """Forget the users' logs, counted and uncounted (an erasure): one HDEL per bucket, in
        pipelines (on a cluster, each node's part to its node). Returns the fields removed."""
        forgot = 0
        if self.legacy is not None:
            forgot += sum(bool(self.legacy.forget(user_id)) for user_id in user_ids)
        fields: dict[str, list[bytes]] = {}
        for user_id in user_ids:
            for key in log.user_keys(self.prefix, user_id):
                fields.setdefault(key, []).extend(
                    (log.bucket_field(user_id), log.uncounted_field(user_id))
                )
        keys = list(fields)
        for first in range(0, len(keys), 500):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[first : first + 500]:
                pipe.hdel(key, *fields[key])
            forgot += sum(int(n) for n in pipe.execute())
        return forgot

    def _legacy_moved(
        self, user_ids: Sequence[int], *, now_ms: int | None, retention_ms: int = 0
    ) -> bool:
        """While upgrading: move these users' old logs into the new one first. False when
        Redis did not answer (the old sends could not be counted)."""
        if self.legacy is None:
            return True
        try:
            self.legacy.move(user_ids, now_ms=now_ms, retention_ms=retention_ms)
        except REDIS_DOWN as exc:
            logger.warning("Redis unavailable while moving logs of the earlier format: %s", exc)
            return False
        return True

    def ping(self) -> bool:
        """True when Redis answers the real function path (for /readyz)."""
        return self.usage(0, [(ALL, NO_RULES)]) is not None

    # --- upkeep --------------------------------------------------------------------------------

    def sweep(
        self, keys: Sequence[str | bytes], *, retention_ms: int, now_ms: int | None = None
    ) -> tuple[int, int]:
        """Drop the users of these buckets (or groups) whose newest entry has left the
        retention, and the keys left with nobody. Returns (users dropped, keys deleted). One
        pipeline per node; raises when Redis does not answer (the sweep tries again on its next
        run)."""
        replies = self._each_key("gk_sweep", keys, retention_ms, now_ms, "the sweep stopped")
        return sum(int(r[0]) for r in replies), sum(int(r[1]) for r in replies)

    def group_buckets(
        self, keys: Sequence[str | bytes], *, retention_ms: int, now_ms: int | None = None
    ) -> int:
        """Move every user's logs in these buckets into its group (docs/limiter.md, "Buckets
        and groups"). Returns how many logs moved; raises when Redis does not answer (what
        moved stays moved: running it again moves the rest)."""
        replies = self._each_key(
            "gk_group", keys, retention_ms, now_ms, "the logs were not all moved"
        )
        return sum(int(r) for r in replies)

    def _each_key(
        self,
        function: str,
        keys: Sequence[str | bytes],
        retention_ms: int,
        now_ms: int | None,
        stopped: str,
    ) -> list[Any]:
        """One call of the upkeep function `function` (keys[1] a bucket or group; args: now,
        retention) per key, pipelined per node: their replies. Raises ConnectionError saying
        `stopped` when Redis does not answer."""
        now_ms = ms_checked(now_ms)
        names = [key.decode() if isinstance(key, bytes) else key for key in keys]
        user_ids = [log.bucket_of(key) << log.BUCKET_BITS for key in names]
        replies: list[Any] = []

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for batch in batches:
                for i in batch:
                    yield Call(function, [1, names[i], _now_arg(now_ms), retention_ms], [i])

        def fail(indexes: list[int]) -> None:
            raise ConnectionError(f"Redis is not answering: {stopped}")

        if names:
            self.transport.run(user_ids, build, lambda _, reply: replies.append(reply), fail)
        return replies

    def grouped(self) -> bool:
        """Whether every user's logs are in its group, its bucket read no more: said by Redis
        once `manage.py group_logs` has moved them all, and looked up at most every
        GROUPED_CHECK_SECONDS (never again once said)."""
        if self._grouped or not self.groups:
            return self._grouped
        now = time.monotonic()
        if now >= self._grouped_checked:
            self._grouped_checked = now + GROUPED_CHECK_SECONDS
            with contextlib.suppress(*REDIS_DOWN):  # the call itself says what Redis answers
                self._grouped = bool(self.client.exists(log.grouped_key(self.prefix)))
        return self._grouped

    def import_entries(
        self,
        user_id: int,
        entries: Sequence[tuple[str, int, str]],
        *,
        retention_ms: int,
        now_ms: int | None = None,
    ) -> int:
        """Add (channel, time ms, message id) entries to a user's log unless there already (the
        upgrade from the earlier format). Returns how many were added."""
        return self.restore(
            [
                Restored(user_id, channel, at_ms, message_id)
                for channel, at_ms, message_id in entries
            ],
            retention_ms=retention_ms,
            now_ms=now_ms,
        )

    def restore(
        self, entries: Sequence["Restored"], *, retention_ms: int, now_ms: int | None = None
    ) -> int:
        """Put sends back into their users' logs (rebuild_logs, from the send ledger), unless
        there already, by channel and message: running it twice adds nothing. Entries older than
        `retention_ms` are left out. Returns how many were added."""
        now_ms = ms_checked(now_ms)
        if not entries:
            return 0
        user_ids = [entry.user_id for entry in entries]
        added: list[int] = []

        def build(batches: list[list[int]]) -> Iterator[Call]:
            for batch in batches:
                by_key: dict[str, list[int]] = {}
                for i in batch:
                    by_key.setdefault(self.home(self.prefix, user_ids[i]), []).append(i)
                for key, found in by_key.items():
                    found.sort(key=lambda i: (user_ids[i], entries[i].at_ms))
                    args: list[Any] = [_now_arg(now_ms), retention_ms]
                    for i in found:
                        entry = entries[i]
                        args.extend(
                            (
                                log.bucket_field(entry.user_id),
                                entry.channel,
                                entry.at_ms,
                                log.message_hash(entry.message_id)
                                + log.short_hash(entry.campaign)
                                + bytes((entry.priority,))
                                + log.tags_bytes(entry.tags),
                            )
                        )
                    yield Call("gk_restore", [1, key, *args], found)

        def collect(call: Call, reply: Any) -> None:
            added.append(int(reply))

        def fail(indexes: list[int]) -> None:
            raise ConnectionError(
                f"Redis is not answering: {len(indexes)} sends could not be put back"
            )

        self.transport.run(user_ids, build, collect, fail)
        return sum(added)


@dataclass(frozen=True, slots=True)
class Restored:
    """A send to put back into a user's log (Limiter.restore)."""

    user_id: int
    channel: str
    at_ms: int
    message_id: str
    campaign: str = ""
    priority: int = DEFAULT_PRIORITY
    tags: tuple[str, ...] = ()


@cache
def _limiter_for(url: str, cluster: bool, prefix: str, fail_open: bool, upgrade: bool) -> Limiter:
    return Limiter(get_redis(), prefix=prefix, fail_open=fail_open, upgrade=upgrade)


def get_limiter() -> Limiter:
    """The process-wide limiter for the current settings."""
    return _limiter_for(
        settings.REDIS_URL,
        bool(settings.REDIS_CLUSTER),
        settings.GATEKEEPER_KEY_PREFIX,
        bool(settings.GATEKEEPER_FAIL_OPEN),
        bool(settings.GATEKEEPER_LOG_UPGRADE),
    )


def reset_limiter() -> None:
    _limiter_for.cache_clear()
