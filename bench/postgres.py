"""Benchmarks that need PostgreSQL run on a database of their own, made and migrated when
missing: `gk_bench` on the machine's server unless `GATEKEEPER_BENCH_DATABASE_URL` names another.
The benchmark process is set up on the caller's database, so such a benchmark runs itself again,
in a child process pointed at the bench database and at Redis database 14."""

import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get(
    "GATEKEEPER_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gk_bench"
)
REDIS_URL = os.environ.get("GATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
CHILD = "GATEKEEPER_BENCH_CHILD"


def database_made(url: str, *, fresh: bool = False) -> None:
    """The database of `url` on its server, made when missing; `fresh`: emptied (dropped and
    made again)."""
    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _database(url: str) -> None:
    """The bench database, made and migrated when missing."""
    database_made(url)
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": REDIS_URL}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )


def on_bench_database(suite: str, argv: list[str]) -> bool:
    """False inside the child (go on and measure); otherwise runs the child and returns True."""
    if os.environ.get(CHILD) == "1":
        return False
    _database(BENCH_DB)
    env = {
        **os.environ,
        CHILD: "1",
        "DATABASE_URL": BENCH_DB,
        "REDIS_URL": REDIS_URL,
        "LOG_LEVEL": "WARNING",
    }
    subprocess.run(
        [sys.executable, "-m", "bench", suite, "--", *argv], cwd=ROOT, env=env, check=True
    )
    return True
