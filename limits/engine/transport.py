"""Running the limiter's Redis Functions: the transport under `limits.engine.limiter`, as a storage
is under a strategy in alisaifee/limits. It knows nodes, slots, pipelines and the library, and
nothing of caps or decisions.

A batch costs one round trip per Redis node: requests are grouped by the node that serves their
slot and each group goes out as one hand-made pipeline of FCALLs, each deciding up to
`USERS_PER_CALL` users (so one call keeps Redis busy for a few milliseconds at most).

On Redis Cluster every FCALL declares only keys of one slot: Redis checks declared keys before
it runs anything, so a call that reaches a node during a slot migration is refused whole
(MOVED/ASK/TRYAGAIN) and is routed again; it never records half a batch. (`allow-cross-slot-keys`
would let one call touch many slots, but only through undeclared keys, which Redis checks one
command at a time: a migration would stop such a call half-way.) A batch to a cluster is
therefore one pipeline per node of one call per slot.

During a slot's migration (resharding) its owner runs a call only if it still holds every key
the call declares: a call whose keys have all moved is refused with ASK, naming the importing
node, and one declaring keys on both sides with TRYAGAIN. Requests so refused are sent again one
declared key per call (a call of one key is never refused for holding only part of its keys),
those of an ASK to the node it names, preceded by ASKING (see `run`).

The library is loaded under names of its release's own (`FunctionLibrary`): callers name a
function as the Lua registers it (`gk_decide`), and the transport calls the version of it that
this release loaded, so two releases' processes running side by side (a rolling upgrade) each
call their own functions on the same data.
"""

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from hiredis import pack_command
from redis.cluster import PRIMARY, ClusterNode, RedisCluster, get_node_name

from gatekeeper.lib.redis_client import (
    ATTEMPTS,
    BROKEN,
    BUSY_PAUSE,
    REDIS_DOWN,
    SLOT_BUSY,
    SLOT_MOVED,
)

logger = logging.getLogger(__name__)

SOURCE = (Path(__file__).parent / "lua" / "limiter.lua").read_text()
LIBRARY_BASE = "gatekeeper_limiter"  # every release's library is named so, then `_<version>`
ASKING_COMMAND = pack_command(("ASKING",))
USERS_PER_CALL = 250
# A flush may race with our reload; a few tries make that a non-event.
LOAD_ATTEMPTS = 4
# Errors after which a cluster call is sent again (`Retries.add` says where and when): its slot
# moved (MOVED, or READONLY from a primary a failover demoted), is being moved (ASK) or is
# briefly unserved (TRYAGAIN, CLUSTERDOWN), all of which ran nothing; or its node went away.
REROUTE = (*SLOT_MOVED, redis.exceptions.AskError, *SLOT_BUSY, *BROKEN)
# Where a request goes next: None for the node the slot map names, or the node an ASK named.
Route = ClusterNode | None


class FunctionLibrary:
    """A release's library as Redis gets it: its name and its functions' names end in
    `_<version>`, ten hex digits of the sha1 of the Lua text as the file holds it (`SOURCE`).

    Function names are global across a server's libraries: two libraries registering one name
    cannot both be loaded (under one library name, as before versions, loading either replaced
    the other, and the other release's next call found its function missing; under two, the
    second load is refused). With the version in every name, releases whose Lua differs load
    libraries side by side and neither replaces the other; releases whose Lua is the same share
    one, which either loads again as it is (`REPLACE`: idempotent).
    Libraries of releases no longer running are dropped by `manage.py limiter_functions
    --drop-others`."""

    SUFFIX_LINE = "local SUFFIX = ''"

    def __init__(self, source: str) -> None:
        self.version = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()[:10]
        self.name = f"{LIBRARY_BASE}_{self.version}"
        first, _, rest = source.partition("\n")
        if first != f"#!lua name={LIBRARY_BASE}" or rest.count(self.SUFFIX_LINE) != 1:
            raise ValueError(
                f"a limiter library starts with '#!lua name={LIBRARY_BASE}' and sets its "
                f"names' suffix once, in a line {self.SUFFIX_LINE!r}"
            )
        rest = rest.replace(self.SUFFIX_LINE, f"local SUFFIX = '_{self.version}'")
        self.text = f"#!lua name={self.name}\n{rest}"
        self.load_command = pack_command(("FUNCTION", "LOAD", "REPLACE", self.text))  # type: ignore[arg-type]

    def function(self, name: str) -> str:
        """The name Redis knows this library's function `name` by."""
        return f"{name}_{self.version}"

    def load(self, conn: Any) -> None:
        """Load it on one node (a client of that node), replacing only itself."""
        conn.function_load(self.text, replace=True)


LIMITER_LIBRARY = FunctionLibrary(SOURCE)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(entry: Any) -> dict[str, Any]:
    """A FUNCTION LIST entry (a flat list of names and values, or a map) as a dict."""
    if isinstance(entry, dict):
        return {_text(k): v for k, v in entry.items()}
    return {_text(entry[i]): entry[i + 1] for i in range(0, len(entry) - 1, 2)}


def libraries_loaded(conn: Any) -> dict[str, list[str]]:
    """The limiter libraries of every release loaded on one node (a client of that node):
    name -> its functions' names. Other libraries on the server are not the limiter's."""
    found: dict[str, list[str]] = {}
    for entry in conn.function_list():
        fields = _fields(entry)
        name = _text(fields["library_name"])
        if name == LIBRARY_BASE or name.startswith(f"{LIBRARY_BASE}_"):
            found[name] = sorted(_text(_fields(f)["name"]) for f in fields["functions"])
    return found


@dataclass(slots=True)
class Call:
    """One FCALL and the requests (by index) it decides, in reply order; `function` as the
    Lua registers it (the transport adds its library's version)."""

    function: str
    args: list[Any]
    indexes: list[int]


class Retries:
    """The requests of one round's refused calls: where each goes next, and what comes first."""

    def __init__(self, transport: "FunctionTransport") -> None:
        self.transport = transport
        self.todo: dict[int, Route] = {}
        self.one_key: set[int] = set()  # sent again one declared key per call
        self.refresh = False  # read the slot map again first
        self.pause = False  # wait BUSY_PAUSE first

    def add(self, indexes: list[int], error: BaseException) -> bool:
        """Take the requests of a call refused with `error` for the next round; False (and
        nothing taken) when `error` is not one after which a call goes again."""
        if not isinstance(error, REROUTE):
            return False
        route: Route = None
        if isinstance(error, redis.exceptions.AskError):
            # For this call only: the map stays as it is (the slot is still the source's).
            route = self.transport.ask_node(error.host, error.port)
            self.one_key.update(indexes)
        elif isinstance(error, SLOT_BUSY):
            self.pause = True
            if isinstance(error, redis.exceptions.TryAgainError):
                self.one_key.update(indexes)
            else:
                self.refresh = True
        else:  # SLOT_MOVED, BROKEN
            self.refresh = True
        self.todo.update(dict.fromkeys(indexes, route))
        return True


def _is_missing_function(exc: BaseException) -> bool:
    return (
        isinstance(exc, redis.exceptions.ResponseError) and "function not found" in str(exc).lower()
    )


class FunctionTransport:
    """Calls of the limiter library on one Redis or a Redis Cluster. `slot_key(user_id)` names
    the key a call declares for the user (the home of its logs: its group), to route by and to
    group requests by when a migration refused them; `order_key` sorts each call's requests so
    that those sharing a key come together (stable: one user's requests keep their order);
    `library`: this release's unless told (a test loads another release's beside it)."""

    def __init__(
        self,
        client: Any,
        *,
        slot_key: Callable[[int], str],
        order_key: Callable[[int], int] | None = None,
        slot_group: Callable[[int], int] | None = None,
        library: FunctionLibrary = LIMITER_LIBRARY,
    ) -> None:
        """`slot_group(user_id)`: a number the same for users whose keys share a slot (the
        limiter's: id >> 8, the buckets' hash tag), so that a slot is hashed once per group
        and remembered, not once per request and call."""
        self.client = client
        self.slot_key = slot_key
        self.order_key = order_key
        self.slot_group = slot_group
        self.library = library
        self._slots: dict[int, int] = {}  # slot group -> slot (a key's slot never changes)
        self._loaded: set[str] = set()
        # Nodes an ASK named that the slot map does not (a node joining the cluster serves no
        # slot until its first migration ends), kept with their connections for the next ASK.
        self._unmapped: dict[str, ClusterNode] = {}

    @property
    def is_cluster(self) -> bool:
        return isinstance(self.client, RedisCluster)

    def _batches(
        self, user_ids: Sequence[int], indexes: list[int], one_key: set[int]
    ) -> list[list[int]]:
        """Split one node's requests into the groups that one FCALL may decide together: those
        of one slot, or of one key for the requests in `one_key`."""
        if self.order_key is not None:
            order = self.order_key
            indexes = sorted(indexes, key=lambda i: order(user_ids[i]))
        if not self.is_cluster:
            return [indexes[i : i + USERS_PER_CALL] for i in range(0, len(indexes), USERS_PER_CALL)]
        groups: dict[int | str, list[int]] = {}
        for i in indexes:
            user_id = user_ids[i]
            group = self.slot_key(user_id) if i in one_key else self._slot(user_id)
            groups.setdefault(group, []).append(i)
        return [
            group[k : k + USERS_PER_CALL]
            for group in groups.values()
            for k in range(0, len(group), USERS_PER_CALL)
        ]

    def _nodes(
        self, user_ids: Sequence[int], pending: dict[int, Route]
    ) -> dict[tuple[str, bool], tuple[Any, list[int]]]:
        """Pending requests grouped by the node they go to, the one serving their slot or the
        one an ASK named: (node name, after ASKING) -> (conn, request indexes)."""
        if not self.is_cluster:
            return {("single", False): (self.client, list(pending))}
        client: RedisCluster = self.client
        groups: dict[tuple[str, bool], tuple[Any, list[int]]] = {}
        for i, asked in pending.items():
            node: ClusterNode = asked or client.nodes_manager.get_node_from_slot(
                self._slot(user_ids[i])
            )
            entry = groups.get((node.name, asked is not None))
            if entry is None:
                conn = client.get_redis_connection(node)
                entry = groups[(node.name, asked is not None)] = (conn, [])
            entry[1].append(i)
        return groups

    def _slot(self, user_id: int) -> int:
        """The cluster slot of the user's keys (hashed once per slot group)."""
        if self.slot_group is None:
            return int(self.client.keyslot(self.slot_key(user_id)))
        group = self.slot_group(user_id)
        slot = self._slots.get(group)
        if slot is None:
            if len(self._slots) > 1_000_000:
                self._slots.clear()  # bounded: a few MB, then hashed afresh
            slot = self._slots[group] = int(self.client.keyslot(self.slot_key(user_id)))
        return slot

    def ask_node(self, host: str, port: int) -> ClusterNode:
        """The node an ASK names: the map's, or one of its own if the map does not name it."""
        node: ClusterNode | None = self.client.get_node(host=host, port=port)
        if node is None:
            node = self._unmapped.setdefault(
                get_node_name(host, port), ClusterNode(host, port, PRIMARY)
            )
        return node

    def _send_and_read(
        self,
        conn: Any,
        calls: Iterable[Call],
        on_reply: Callable[[Call, Any], None],
        *,
        reload: bool,
        asking: bool,
    ) -> None:
        """Write each call to the socket as soon as it is built, then read the replies in order;
        with `asking`, each call right after an ASKING, in the same write (ASKING lets the next
        command only, on its connection, reach a slot the node is importing).

        This is a hand-made pipeline: Redis starts on the first call while Python still builds
        the next ones, and Python parses each reply while Redis runs the calls after it, so the
        two overlap instead of taking turns. Error replies are handed over as exceptions; a
        broken connection raises and is dropped from the pool.
        """
        pool = conn.connection_pool
        connection = pool.get_connection()
        library = self.library
        sent: list[Call] = []
        try:
            for call in calls:
                # Right before the call, in the same write: Redis runs a client's pipelined
                # commands back to back, so another client's flush rarely lands in between.
                packed = [library.load_command] if reload else []
                if asking:
                    packed.append(ASKING_COMMAND)
                packed.append(pack_command(("FCALL", library.function(call.function), *call.args)))
                connection.send_packed_command(packed, check_health=False)
                sent.append(call)
            for call in sent:
                for _ in range(reload + asking):
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
        self,
        conn: Any,
        calls: Iterable[Call],
        on_reply: Callable[[Call, Any], None],
        name: str,
        *,
        asking: bool = False,
    ) -> None:
        """Run a node's calls (each after ASKING with `asking`); a missing library (FUNCTION
        FLUSH, a restart, a failover to a node without it) makes a call run nothing, so those
        calls are resent with the library."""
        missing: list[Call] = []

        def sort(call: Call, reply: Any) -> None:
            if _is_missing_function(reply):
                missing.append(call)
            else:
                on_reply(call, reply)

        if name not in self._loaded:
            # Once per node and process; afterwards only a missing-function reply reloads it.
            # A primary that a failover demoted refuses the load with READONLY: that raises
            # before the node counts as loaded, and `run` routes the calls again (REROUTE). A
            # load declares no key: a node an ASK named takes it without ASKING.
            self.library.load(conn)
            self._loaded.add(name)
        self._send_and_read(conn, calls, sort, reload=False, asking=asking)
        for _ in range(LOAD_ATTEMPTS):
            if not missing:
                return
            logger.info("Limiter functions missing on %s: loading them again", name)
            todo, missing[:] = list(missing), []
            self._send_and_read(conn, todo, sort, reload=True, asking=asking)
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

        Requests whose node is down get `fail`. In a cluster, a refused call ran nothing (every
        call declares keys of one slot, and Redis checks them all before running any), so it is
        sent again, at most ATTEMPTS times in all, and never counts a send twice (see REROUTE
        and `Retries.add`):
        - its slot moved (MOVED, or READONLY from a primary that a failover demoted to replica)
          or its node went away: to the slot's node on a map read afresh (once for all of a
          round's refused calls);
        - ASK (its slot is being migrated and the keys it declares have moved): to the node the
          ASK names, each call right after ASKING, the map untouched; the library is loaded
          there first if this process has not yet;
        - TRYAGAIN (it declared keys on both sides of a migration) or CLUSTERDOWN: after
          BUSY_PAUSE, to the slot's node (on a map read afresh after CLUSTERDOWN).
        After ASK or TRYAGAIN its requests go one declared key per call: a slot mid-migration
        answers every key (on one node or, after ASK and ASKING, the other) in three rounds at
        most. On a single node READONLY is `fail`, as any other error.
        """
        pending: dict[int, Route] = dict.fromkeys(range(len(user_ids)))
        one_key: set[int] = set()
        for attempt in range(ATTEMPTS):
            if not pending:
                return
            last = attempt == ATTEMPTS - 1 or not self.is_cluster
            retries = Retries(self)
            try:
                groups = self._nodes(user_ids, pending)
            except REDIS_DOWN as exc:
                logger.warning("Redis unavailable for the limiter: %s", exc)
                fail(list(pending))
                return
            for (name, asking), (conn, indexes) in groups.items():
                answered: set[int] = set()

                def on_reply(
                    call: Call,
                    reply: Any,
                    name: str = name,
                    answered: set[int] = answered,
                    last: bool = last,
                    retries: Retries = retries,
                ) -> None:
                    answered.update(call.indexes)
                    if not isinstance(reply, Exception):
                        collect(call, reply)
                    elif last or not retries.add(call.indexes, reply):
                        logger.warning("Limiter call failed on %s: %s", name, reply)
                        fail(call.indexes)

                try:
                    self._run_node(
                        conn,
                        build(self._batches(user_ids, indexes, one_key)),
                        on_reply,
                        name,
                        asking=asking,
                    )
                except REDIS_DOWN as exc:
                    unanswered = [i for i in indexes if i not in answered]
                    if last or not retries.add(unanswered, exc):
                        logger.warning("Redis unavailable for the limiter on %s: %s", name, exc)
                        fail(unanswered)
            if retries.pause:
                time.sleep(BUSY_PAUSE)
            if retries.refresh:
                self._refresh()
            one_key |= retries.one_key
            pending = retries.todo
        if pending:
            fail(list(pending))

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
