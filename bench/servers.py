"""Real redis-server processes for tests and benchmarks: single nodes and clusters (3 masters,
replicas if asked) on loopback; and a PostgreSQL server of a benchmark's own."""

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from limits.engine.log import GROUP_LISTPACK_VALUE

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    # A cluster node also listens on port + 10000 (its bus): both must be free and < 65536.
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


class RedisServer:
    """One redis-server process that keeps nothing on disk (unless a cluster node)."""

    def __init__(self, directory: Path, *, port: int | None = None, cluster: bool = False) -> None:
        self.cluster = cluster
        self.port = port or (free_cluster_port() if cluster else free_port())
        self.directory = directory / str(self.port)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--logfile", str(self.directory / "redis.log"),
            "--hash-max-listpack-value", str(GROUP_LISTPACK_VALUE),  # as deployed
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-node-timeout", "2000"]
            # A replica's first sync starts at once, not after the 5 s Redis waits for others;
            # a primary stops at once, not after waiting up to 10 s for a lagging replica.
            args += ["--repl-diskless-sync-delay", "0", "--shutdown-timeout", "0"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def kill(self) -> None:
        """SIGKILL: nothing saved, nothing flushed, as in a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


# Slot ranges and the port of the primary serving each, as one node sees them.
SlotOwners = dict[tuple[int, int], int]


def poll(what: str, ready: Callable[[], bool], *, timeout: float = 20) -> None:
    """Ask `ready()` until it says yes; a test waits for a cluster's state, never for a time."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class RedisClusterProcesses:
    """Masters (three by default), each with `replicas` replicas, slots split evenly by
    `redis-cli --cluster create`."""

    def __init__(self, directory: Path, *, masters: int = 3, replicas: int = 0) -> None:
        self.directory = directory
        self.replicas = replicas
        self.nodes = [RedisServer(directory, cluster=True) for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> "RedisClusterProcesses":
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        replicas = ["--cluster-replicas", str(self.replicas)]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addresses, *replicas, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_settled()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def owners(self) -> SlotOwners:
        """The slot map as the first running node sees it."""
        with _client(next(node for node in self.nodes if node.process is not None)) as client:
            return _owners(client)

    def primary_and_replica(self) -> tuple[RedisServer, RedisServer]:
        """The primary of slot 0 and its (first) replica."""
        owners = self.owners()
        primary = self.node(owners[min(owners)])
        with _client(primary) as client:
            replica = client.info("replication")["slave0"]
        return primary, self.node(int(replica["port"]))

    def wait_replicated(self, primary: RedisServer, replica: RedisServer) -> None:
        """Until `replica` has applied everything written to `primary` so far."""
        with _client(primary) as client:
            written = int(client.info("replication")["master_repl_offset"])

        def applied() -> bool:
            with _client(replica) as client:
                found = client.info("replication")
            return found["master_link_status"] == "up" and found["slave_repl_offset"] >= written

        poll(f"replica {replica.port} in sync with {primary.port}", applied)

    def take_over(self, replica: RedisServer) -> SlotOwners:
        """Promote `replica` without asking its primary (CLUSTER FAILOVER TAKEOVER: no election,
        no waiting for a node timeout) and wait until every running node agrees. Returns the
        slot map after it."""
        owners = self.owners()
        with _client(replica) as client:
            demoted = int(client.info("replication")["master_port"])
            client.execute_command("CLUSTER FAILOVER", "TAKEOVER")
        after = {slots: replica.port if port == demoted else port for slots, port in owners.items()}
        self.wait_settled(after)
        return after

    def wait_settled(self, owners: SlotOwners | None = None) -> None:
        """Until every running node says the cluster is ok and sees the same slot map (`owners`
        when given), each primary of that map says it is one, and every other running node is
        a replica whose link to its primary is up."""

        def settled() -> bool:
            try:
                expected = owners or self.owners()
                for node in self.nodes:
                    if node.process is None:
                        continue
                    with _client(node) as client:
                        if client.cluster("info")["cluster_state"] != "ok":
                            return False
                        if _owners(client) != expected:
                            return False
                        replication = client.info("replication")
                    if node.port in expected.values():
                        if replication["role"] != "master":
                            return False
                    elif replication.get("master_link_status") != "up":
                        return False
                return True
            except redis.RedisError:
                return False  # a node still starting or changing its role

        poll("the cluster settled", settled)

    def join(self) -> RedisServer:
        """Start an empty primary (no slots, no keys), introduce it to the cluster and wait until
        every running node knows it and is linked to it, and it knows who serves each slot: a new
        shard before any resharding."""
        node = RedisServer(self.directory, cluster=True).start()
        self.nodes.append(node)
        with _client(node) as client:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        running = [n for n in self.nodes if n.process is not None]

        def known() -> bool:
            for each in running:
                with _client(each) as client:
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False  # the new node, until it has learnt who serves each slot
                    links = client.cluster("nodes")  # address -> its flags, its link, ...
                if len(links) != len(running):
                    return False
                for link in links.values():
                    if "handshake" in link["flags"] or not link["connected"]:
                        return False
            return True

        poll(f"node {node.port} joined", known)
        return node

    def node_id(self, node: RedisServer) -> str:
        with _client(node) as client:
            return str(client.execute_command("CLUSTER MYID").decode())

    def begin_migration(self, slot: int, source: RedisServer, target: RedisServer) -> None:
        """Open the migration of `slot` from `source` to `target`, as resharding does first
        (IMPORTING on the target, then MIGRATING on the source); no key is moved yet."""
        with _client(target) as client:
            client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", self.node_id(source))
        with _client(source) as client:
            client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", self.node_id(target))

    def migrate(self, source: RedisServer, target: RedisServer, keys: list[str]) -> None:
        """Move `keys` (of a slot being migrated) from `source` to `target`, as resharding does."""
        with _client(source) as client:
            client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)

    def move_slot(self, slot: int, port: int) -> None:
        """Make the primary on `port` serve `slot` with every key of it, whatever migration of the
        slot is open (finishing one, or moving the slot back after one): each other primary's
        keys of the slot are migrated to it, then every primary is told its new owner and closes
        the migration. Waits until every running node sees `port` serving the slot."""
        target = self.node(port)
        primaries = [node for node in self.nodes if node.process is not None and _is_primary(node)]
        ids = {node.port: self.node_id(node) for node in primaries}
        with _client(target) as client:
            # Closed first: a slot it still migrates elsewhere would send the keys coming back
            # on with ASK.
            client.execute_command("CLUSTER SETSLOT", slot, "STABLE")
        for holder in primaries:
            if holder is target:
                continue
            with _client(holder) as client:
                if not client.execute_command("CLUSTER COUNTKEYSINSLOT", slot):
                    continue
                # An open slot lets MIGRATE run on the node that holds the keys: MIGRATING on its
                # owner, IMPORTING on any other (keys a migration had moved there).
                if _owner(client, slot) == holder.port:
                    client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[port])
                else:
                    client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[port])
            with _client(target) as client:
                if _owner(client, slot) != port:
                    client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[holder.port])
            with _client(holder) as client:
                while keys := client.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                    client.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
        # The new owner first (it takes a new config epoch, which the others then follow).
        for node in [target, *(node for node in primaries if node is not target)]:
            with _client(node) as client:
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[port])
        for node in primaries:
            with _client(node) as client:
                client.execute_command("CLUSTER SETSLOT", slot, "STABLE")

        def served() -> bool:
            for node in self.nodes:
                if node.process is None:
                    continue
                with _client(node) as client:
                    if _owner(client, slot) != port:
                        return False
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False
            return True

        poll(f"slot {slot} served by {port}", served)


def _client(node: RedisServer) -> redis.Redis:
    return redis.Redis(port=node.port, socket_timeout=2, socket_connect_timeout=2)


def _owners(client: redis.Redis) -> SlotOwners:
    slots = client.execute_command("CLUSTER SLOTS")
    return {(int(entry[0]), int(entry[1])): int(entry[2][1]) for entry in slots}


def _owner(client: redis.Redis, slot: int) -> int | None:
    """The port of the primary serving `slot`, as the node of `client` sees it."""
    for (start, end), port in _owners(client).items():
        if start <= slot <= end:
            return port
    return None


def _is_primary(node: RedisServer) -> bool:
    with _client(node) as client:
        return bool(client.info("replication")["role"] == "master")


PG_CTL = shutil.which("pg_ctl") or "pg_ctl"
INITDB = shutil.which("initdb") or "initdb"


class PostgresServer:
    """A PostgreSQL server of its own (initdb into `directory`, a free loopback port), which a
    benchmark may restart or stop without touching the machine's. PostgreSQL refuses to run as
    root: run by root, it runs as the `postgres` user (`directory`'s parents must let it in)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "postgres"
        self.port = free_port()

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*owner, *args], check=True, stdout=subprocess.DEVNULL)

    def start(self) -> "PostgresServer":
        if not (self.directory / "PG_VERSION").exists():
            self.directory.mkdir(parents=True)
            if os.geteuid() == 0:
                shutil.chown(self.directory, "postgres", "postgres")
            self._run(INITDB, "-D", str(self.directory), "-A", "trust", "-U", "postgres",
                      "--no-sync", "-E", "UTF8")  # fmt: skip
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            f"-c unix_socket_directories={self.directory}"
        )
        self._run(PG_CTL, "-D", str(self.directory), "-l", str(self.directory / "log"), "-w",
                  "-o", options, "start")  # fmt: skip
        return self

    def restart(self) -> None:
        """A fast restart: every connection dropped, the server back once it takes new ones."""
        self._run(PG_CTL, "-D", str(self.directory), "-m", "fast", "-w", "restart")

    def stop(self) -> None:
        if (self.directory / "postmaster.pid").exists():
            self._run(PG_CTL, "-D", str(self.directory), "-m", "immediate", "-w", "stop")
