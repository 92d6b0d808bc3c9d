"""Erasing people: how long an erasure of `--erase` people out of `--users` takes, both passes,
place by place (limits/privacy/erasure.py), against everything a deployment of that size holds
of them.

make bench BENCH_ARGS="erase" [-- --users 10000000 --erase 100000]

Runs on the benchmarks' own PostgreSQL database (bench/postgres.py) and Redis database. Every
user has a decision in the ledger (drained into day partitions) and its send in their cap log
(put back from the ledger by rebuild_logs), and is a recipient of one finished send job (its
chunks of 1,000); one in a hundred is on the suppression list.
"""

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis
from django.utils import timezone

from bench.ledger import _fill_batch, _reset_tables
from bench.postgres import REDIS_URL, on_bench_database
from limits.ledger.drain import ledger_drain
from limits.ledger.rebuild import logs_rebuild
from limits.models.people import Suppression, SuppressionChange
from limits.models.privacy import ErasedPerson, Erasure
from limits.people.suppression import erased_add, erased_keys, suppress
from limits.privacy.erasure import RETRY_IN, erasure_run, users_packed
from limits.privacy.personal import Erased, place_register, places
from worker.models import SendChunk, SendJob

CHUNK = 1000


def _timed(erase: Callable[[list[int]], Erased], spent: dict[str, float], key: str) -> Any:
    def run(user_ids: list[int]) -> Erased:
        started = time.perf_counter()
        try:
            return erase(user_ids)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - started

    return run


def _fill(client: redis.Redis, users: int) -> None:
    started = time.perf_counter()
    _reset_tables()
    for table in (Erasure, ErasedPerson, Suppression, SuppressionChange, SendJob):
        table.objects.all().delete()
    step = 200_000
    for start in range(0, users, step):
        _fill_batch(client, start, min(step, users - start), users, 1)
        while ledger_drain(client=client).entries:
            pass
    ledger = time.perf_counter() - started
    client.flushdb()
    report = logs_rebuild()
    logs = time.perf_counter() - started - ledger
    job = SendJob.objects.create(
        channel="email", campaign="blast", template="welcome", status=SendJob.Status.DONE,
        total=users, sent=users,
    )  # fmt: skip
    for first in range(0, users, 100 * CHUNK):
        SendChunk.objects.bulk_create(
            SendChunk(
                job=job,
                status=SendChunk.Status.DONE,
                size=min(CHUNK, users - c),
                recipients=[
                    {"user_id": u, "address": f"u{u}@example.com", "message_id": f"blast:{u}"}
                    for u in range(c, min(c + CHUNK, users))
                ],
            )
            for c in range(first, min(first + 100 * CHUNK, users), CHUNK)
        )
    chunks = time.perf_counter() - started - ledger - logs
    suppress(channel="email", user_ids=range(0, users, 100), reason="unsubscribed", source="bench")
    print(
        f"filled: {users:,} users' decisions in the ledger in {ledger:.0f} s, their logs in "
        f"Redis ({report.sends:,} sends) in {logs:.0f} s, a job's {users:,} recipients in "
        f"{chunks:.0f} s",
        flush=True,
    )


def main(argv: list[str]) -> None:
    if on_bench_database("erase", argv):
        return
    parser = argparse.ArgumentParser(prog="bench erase")
    parser.add_argument("--users", type=int, default=10_000_000)
    parser.add_argument("--erase", type=int, default=100_000)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(REDIS_URL)
    sample = list(range(1_000_000))
    started = time.perf_counter()
    erased_keys(sample)
    hashing = (time.perf_counter() - started) / len(sample) * 1e6
    print(
        f"the gate while anyone is erased: {hashing:.2f} us a request more to hash its id "
        f"(keyed BLAKE2b; the lookup among the erased adds about 0.1 us)"
    )
    client.flushdb()
    _fill(client, args.users)
    spent: dict[str, float] = {}
    for place in places():
        if place.erase is not None:
            place_register(dataclasses.replace(place, erase=_timed(place.erase, spent, place.key)))
    rng = np.random.default_rng(11)
    ids = np.sort(rng.choice(args.users, args.erase, replace=False)).tolist()
    erased_add(ids)  # as erasure_start does, without queueing a task
    erasure = Erasure.objects.create(via="bench", count=len(ids), users=users_packed(ids))
    started = time.perf_counter()
    first = erasure_run(erasure.pk)
    one = time.perf_counter() - started
    started = time.perf_counter()
    done = erasure_run(erasure.pk, now=timezone.now() + RETRY_IN)
    two = time.perf_counter() - started
    assert first is not None and done is not None and done.status == Erasure.Status.DONE
    by_place = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in spent.items())
    print(
        f"erase: {args.erase:,} people of {args.users:,} in {one + two:.1f} s (first pass "
        f"{one:.1f} s, second {two:.1f} s; target 300 s); removed: "
        f"{', '.join(f'{k} {n:,}' for k, n in done.removed.items())}; by place, both passes: "
        f"{by_place}"
    )
    client.flushdb()
