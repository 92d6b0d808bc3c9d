"""Real redis-server processes for tests: single nodes and a 3-master cluster on loopback."""

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

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
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-node-timeout", "2000"]
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


class RedisClusterProcesses:
    """Three masters, no replicas, slots split evenly by `redis-cli --cluster create`."""

    def __init__(self, directory: Path, *, masters: int = 3) -> None:
        self.nodes = [RedisServer(directory, cluster=True) for _ in range(masters)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> "RedisClusterProcesses":
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        for node in self.nodes:
            client = redis.Redis(port=node.port)
            while client.cluster("info").get("cluster_state") != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError("the test cluster did not come up")
                time.sleep(0.1)
            client.close()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
