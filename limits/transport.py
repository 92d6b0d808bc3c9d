"""Running the limiter's Redis Functions: the transport under `limits.limiter`, as a storage is
under a strategy in alisaifee/limits. It knows nodes, slots, pipelines and the library, and
nothing of caps or decisions.

A batch costs one round trip per Redis node: requests are grouped by the node that serves their
slot and each group goes out as one hand-made pipeline of FCALLs, each deciding up to
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from hiredis import pack_command
from redis.cluster import ClusterNode, RedisCluster

from gatekeeper.lib.redis_client import BROKEN, REDIS_DOWN, SLOT_MOVED

logger = logging.getLogger(__name__)

LIBRARY = (Path(__file__).parent / "lua" / "limiter.lua").read_text()
LOAD_COMMAND = pack_command(("FUNCTION", "LOAD", "REPLACE", LIBRARY))  # type: ignore[arg-type]
USERS_PER_CALL = 250
# A flush may race with our reload; a few tries make that a non-event.
LOAD_ATTEMPTS = 4
# Errors after which a cluster call is routed again on a map read afresh: its slot moved
# (MOVED, or READONLY from a primary a failover demoted), is being moved (ASK) or is briefly
# unserved (TRYAGAIN, CLUSTERDOWN), all of which ran nothing; or its node went away.
REROUTE = (
    *SLOT_MOVED,
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    *BROKEN,
)


@dataclass(slots=True)
class Call:
    """One FCALL and the requests (by index) it decides, in reply order."""

    function: str
    args: list[Any]
    indexes: list[int]


def _is_missing_function(exc: BaseException) -> bool:
    return (
        isinstance(exc, redis.exceptions.ResponseError) and "function not found" in str(exc).lower()
    )


class FunctionTransport:
    """Calls of the limiter library on one Redis or a Redis Cluster. `slot_key(user_id)` names
    a key in the user's slot (the hash tag of the user's log), to route by; `order_key` sorts
    each call's requests so that those sharing a key come together (stable: one user's
    requests keep their order)."""

    def __init__(
        self,
        client: Any,
        *,
        slot_key: Callable[[int], str],
        order_key: Callable[[int], int] | None = None,
    ) -> None:
        self.client = client
        self.slot_key = slot_key
        self.order_key = order_key
        self._loaded: set[str] = set()

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    def _batches(self, user_ids: Sequence[int], indexes: list[int]) -> list[list[int]]:
        """Split one node's requests into the groups that one FCALL may decide together."""
        if self.order_key is not None:
            order = self.order_key
            indexes = sorted(indexes, key=lambda i: order(user_ids[i]))
        if not self.is_cluster:
            return [indexes[i : i + USERS_PER_CALL] for i in range(0, len(indexes), USERS_PER_CALL)]
        by_slot: dict[int, list[int]] = {}
        for i in indexes:
            by_slot.setdefault(self.client.keyslot(self.slot_key(user_ids[i])), []).append(i)
        return [
            group[k : k + USERS_PER_CALL]
            for group in by_slot.values()
            for k in range(0, len(group), USERS_PER_CALL)
        ]

    def _nodes(self, user_ids: Sequence[int]) -> dict[str, tuple[Any, list[int]]]:
        """Request indexes grouped by the node that serves their slot: node name -> (conn, idx)."""
        if not self.is_cluster:
            return {"single": (self.client, list(range(len(user_ids))))}
        client: RedisCluster = self.client
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, user_id in enumerate(user_ids):
            slot = client.keyslot(self.slot_key(user_id))
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

    def _run_node(
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
            # A primary that a failover demoted refuses the load with READONLY: that raises
            # before the node counts as loaded, and `run` routes the calls again (REROUTE).
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

    def run(
        self,
        user_ids: Sequence[int],
        build: Callable[[list[list[int]]], Iterable[Call]],
        collect: Callable[[Call, Any], None],
        fail: Callable[[list[int]], None],
    ) -> None:
        """Run the calls `build` makes for each node's requests, given as the groups of request
        indexes one call may decide together; hand each reply to `collect`.

        Requests whose node is down get `fail`. In a cluster, a call refused because its slot
        moved (MOVED, or READONLY from a primary that a failover demoted to replica; see
        REROUTE) or whose node went away is routed again on a map read afresh (once for all of
        a round's refused calls), at most twice: a refused call ran nothing, so resending it
        cannot count a send twice. On a single node READONLY is `fail`, as any other error.
        """
        pending = list(range(len(user_ids)))
        for attempt in range(3):
            if not pending:
                return
            retry: list[int] = []
            try:
                groups = self._nodes([user_ids[i] for i in pending])
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
                    self._run_node(conn, build(self._batches(user_ids, indexes)), on_reply, name)
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
        """Read the slot map again. READONLY names no node, so redis-py's `move_slot` (which
        patches one slot from a MOVED) cannot serve: the whole map is read."""
        logger.info("Cluster topology changed: refreshing")
        # Threads sharing the client may refresh at once: initialize() reads the map once and
        # the others return (it compares an epoch under its lock). A node another thread marks
        # loaded right after this clear costs at most a missing-function reply and a reload.
        self._loaded.clear()
        try:
            self.client.nodes_manager.initialize()
        except REDIS_DOWN as err:
            logger.warning("Could not refresh the cluster topology: %s", err)
