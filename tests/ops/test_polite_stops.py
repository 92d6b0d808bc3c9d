"""Stopping a process politely, under load, as real processes.

A send worker told to stop (SIGTERM to its main process) in the middle of a chunk of a
100,000-recipient job: it hands that chunk back at once, the other worker finishes the job,
nobody gets two sends, none is ambiguous (worker/stopping.py; docs/worker.md, "Stopping a
worker").

A gunicorn master told to stop (SIGTERM) while 200 requests are in flight, gate checks and a
campaign file upload: every request it had accepted gets its whole answer, the upload made its
job completely, and what comes after is refused at connect (docs/deploy.md, "Stopping a process
politely")."""

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
import requests

from tests.support.celery_workers import start_celery_worker, stop_celery_worker, worker_env
from tests.support.dispatch_log import (
    FILE_DISPATCHER,
    FileDispatcher,
    dispatched,
    file_dispatch_env,
)
from tests.support.stops import (
    InFlight,
    LogWatch,
    chunk_free_or_taken,
    chunk_of_users,
    gunicorn_serving,
    multipart,
)
from tests.support.worker_processes import TEST_BROKER_URL, job_counts, job_done, wait_for
from worker.models import SendChunk
from worker.services import send_job_create

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RECIPIENTS = 100_000
CHUNK = 5_000  # the default GATEKEEPER_SEND_CHUNK_SIZE: 20 chunks
# Ten minutes: a chunk not handed back would keep the job waiting past the test's deadline.
LEASE = 600
# Sends a second, shared by both workers (the provider's rate is kept in Redis): a chunk's five
# dispatcher batches of 1,000 take about 2.5 s, so the stop lands between two of them.
RATE = 4_000


def test_a_worker_stopped_mid_chunk_hands_it_back_and_the_other_finishes_the_job(
    published, redis_client, settings, tmp_path
):
    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    published(vip=(10, [1], {}))
    settings.GATEKEEPER_DISPATCHERS = {"push": FILE_DISPATCHER}
    settings.GATEKEEPER_SEND_CHUNK_SIZE = CHUNK
    logs = {name: tmp_path / f"dispatched-{name}.txt" for name in ("stopped", "other")}

    def worker(name: str):
        env = worker_env(
            TEST_BROKER_URL,
            GATEKEEPER_CHUNK_LEASE_SECONDS=str(LEASE),
            **file_dispatch_env(logs[name], RATE),
        )
        return start_celery_worker("sends", env, log=tmp_path / f"worker-{name}.log")

    stopped, other = worker("stopped"), worker("other")
    try:
        started = time.monotonic()
        job = send_job_create(
            channel="push",
            campaign="stop",
            template="welcome",
            recipients=[{"user_id": u, "address": f"token-{u}"} for u in range(1, RECIPIENTS + 1)],
        )
        assert job.chunks.count() == RECIPIENTS // CHUNK
        created = time.monotonic()
        # The stop comes once the worker to be stopped is in the middle of a chunk: it sent a
        # batch or more of it, and not all of it.
        watch = LogWatch(logs["stopped"])
        wait_for(
            lambda: watch.count() >= CHUNK and 0 < watch.count() % CHUNK < CHUNK - 1000,
            seconds=90,
            what="the worker to be in the middle of its second chunk or a later one",
        )
        os.kill(stopped.pid, signal.SIGTERM)  # its main process only
        signalled = time.monotonic()
        before = watch.count()
        chunk = chunk_of_users(job, watch.last_user())
        runs = SendChunk.objects.get(pk=chunk).runs
        back = wait_for(
            lambda: chunk_free_or_taken(chunk, runs),
            seconds=30,
            what="the chunk given back",
            every=0.02,
        )
        stopped.wait(timeout=30)
        exited = time.monotonic()
        assert stopped.returncode == 0
        # Handed back at once: within the dispatcher batch in flight, not a lease.
        assert back - signalled < 10 and exited - signalled < 30

        # What the stopped worker sent of that chunk: whole dispatcher batches, not all of it.
        sent_by_stopped = dispatched(logs["stopped"])
        users = {r["user_id"] for r in SendChunk.objects.get(pk=chunk).recipients}
        of_chunk = {u for u, _ in sent_by_stopped if u in users}
        assert 0 < len(of_chunk) < CHUNK and len(of_chunk) % FileDispatcher.batch_size == 0
        rest = users - of_chunk

        other_watch = LogWatch(logs["other"])
        taken = wait_for(
            lambda: bool(rest & other_watch.users()),
            seconds=LEASE / 4,
            what="the other worker to take up the chunk handed back",
            every=0.02,
        )
        wait_for(lambda: job_done(job), seconds=LEASE / 4, what="the other worker to finish")
        done = time.monotonic()
    finally:
        stop_celery_worker(other)
        stop_celery_worker(stopped)

    # Each recipient handed to a dispatcher once, by one worker or the other.
    by_stopped, by_other = dispatched(logs["stopped"]), dispatched(logs["other"])
    both = by_stopped + by_other
    assert max(both.values()) == 1, [key for key, n in both.items() if n > 1][:10]
    assert set(both) == {(u, f"stop:{u}") for u in range(1, RECIPIENTS + 1)}
    assert rest <= {u for u, _ in by_other}
    # The stopped worker sent whole chunks and the whole batches of the one it handed back.
    assert (sum(by_stopped.values()) - len(of_chunk)) % CHUNK == 0
    assert (
        f"chunk {chunk} handed back: the worker stops"
        in (tmp_path / "worker-stopped.log").read_text()
    )

    counts = job_counts(job)
    assert counts == {**dict.fromkeys(counts, 0), "sent": RECIPIENTS}, counts
    assert job.ambiguous == 0
    print(
        f"\n{RECIPIENTS:,} recipients, {job.chunks.count()} chunks, rate {RATE}/s: job made in "
        f"{created - started:.1f} s; stopped worker sent {sum(by_stopped.values()):,} "
        f"({before:,} at SIGTERM, {len(of_chunk):,} of chunk {chunk}); "
        f"chunk given back {back - signalled:.2f} s after SIGTERM, worker exited after "
        f"{exited - signalled:.2f} s; the other took the chunk up "
        f"{taken - signalled:.1f} s after SIGTERM (lease {LEASE} s); job done "
        f"{done - signalled:.1f} s after SIGTERM, {done - started:.1f} s in all"
    )


GATE_CHECKS = 199  # with the upload, 200 requests in flight
HELD = 100  # of them, held at their last byte until the stop was signalled
UPLOAD_RECIPIENTS = 100_000


def test_a_web_process_stopped_with_200_requests_in_flight_answers_every_one(
    published, redis_client, tmp_path
):
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
    from tests.support.api import make_user
    from worker.models import SendJob
    from worker.preparing import send_job_prepare_run

    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    published(vip=(10, [1], {}))
    user: User = make_user("gate", *CAMPAIGN_SYSTEM)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    gate = {**headers, "Content-Type": "application/json"}
    csv = "user_id,address\n" + "".join(f"{u},token-{u}\n" for u in range(1, UPLOAD_RECIPIENTS + 1))
    fields = {"channel": "push", "campaign": "upload", "template": "welcome"}
    upload_body, upload_type = multipart(fields, "recipients_file", "big.csv", csv.encode())
    log = tmp_path / "gunicorn.log"
    env = worker_env(TEST_BROKER_URL, WEB_CONCURRENCY="2", WEB_THREADS="4", GUNICORN_ACCESSLOG="")
    with gunicorn_serving(env, log) as (server, base):
        address = ("127.0.0.1", int(base.rsplit(":", 1)[1]))
        release = threading.Event()

        def check(k: int, held: int) -> InFlight:
            body = {
                "channel": "push",
                "campaign": "stops",
                "requests": [{"user_id": u, "message_id": f"c{k}-{u}"} for u in range(1, 101)],
            }
            return InFlight(
                address, "/api/v1/gate/check/", json.dumps(body).encode(), gate,
                held=held, release=release,
            )  # fmt: skip

        # The upload stops half-way through its body; HELD checks at their last byte; the
        # others are sent whole (some answered before the stop, some queued behind the rest).
        upload = InFlight(
            address, "/api/v1/sends/", upload_body, {**headers, "Content-Type": upload_type},
            held=len(upload_body) // 2, release=release,
        )  # fmt: skip
        checks = [check(k, 1 if k < HELD else 0) for k in range(GATE_CHECKS)]
        requests_ = [upload, *checks]
        for request in requests_:
            request.start()
        for request in requests_:
            assert request.sent.wait(60), "a request could not be sent"
        answered_before = sum(r.answer.status is not None for r in requests_)
        os.kill(server.pid, signal.SIGTERM)  # the master only, as systemd's KillMode=mixed
        signalled = time.monotonic()
        # Both workers are stopping (gatekeeper/gunicorn_conf.py logs it) before the held
        # requests are let go: they are answered by stopping workers.
        wait_for(
            lambda: log_count(log, "no longer listening") == 2,
            seconds=10,
            what="the stop",
            every=0.02,
        )
        release.set()

        # Connections made after the stop: each is refused at connect or answered whole.
        probes: list[InFlight] = []

        def refused() -> bool:
            probe = check(1000 + len(probes), 0)
            probes.append(probe)
            probe.start()
            probe.join(120)
            return probe.answer.error == "refused"

        refused_at = wait_for(refused, seconds=60, what="a connection refused", every=0.05)
        # From then on, every connection is refused at once.
        burst = [check(2000 + k, 0) for k in range(20)]
        for probe in burst:
            probe.start()
        for probe in burst:
            probe.join(30)
        assert [p.answer.error for p in burst] == ["refused"] * len(burst)
        for request in requests_:
            request.join(120)
        server.wait(timeout=60)
        exited = time.monotonic()
    assert server.returncode == 0, log.read_text()[-3000:]

    failed = [(i, r.answer.error) for i, r in enumerate(requests_) if r.answer.error]
    assert not failed, (len(failed), failed[:3], [i for i, _ in failed], log.read_text()[-3000:])
    for request in checks:
        assert request.answer.status == 200, request.answer.body[:300]
        assert len(json.loads(request.answer.body)["results"]) == 100
    bad_probes = [p.answer for p in probes if p.answer.error not in (None, "refused")]
    assert not bad_probes, bad_probes
    assert all(p.answer.status == 200 for p in probes if p.answer.error is None)

    # The upload made its job, its file whole: every recipient stored once read.
    assert upload.answer.status == 202, upload.answer.body[:500]
    job_id = json.loads(upload.answer.body)["id"]
    send_job_prepare_run(job_id=job_id)
    job = SendJob.objects.get(pk=job_id)
    assert job.total == UPLOAD_RECIPIENTS
    assert sum(job.chunks.values_list("size", flat=True)) == UPLOAD_RECIPIENTS
    last = max(r.answer.answered_at or 0 for r in requests_)
    taken = re.findall(r"took (\d+) waiting connections", log.read_text())
    print(
        f"\n{len(requests_)} requests ({answered_before} answered before SIGTERM): the last "
        f"answered {last - signalled:.2f} s after SIGTERM, the upload's "
        f"{(upload.answer.answered_at or 0) - signalled:.2f} s; {len(probes)} connections "
        f"made after SIGTERM, {sum(p.answer.error == 'refused' for p in probes)} refused, the "
        f"first refused {refused_at - signalled:.2f} s after it; gunicorn exited "
        f"{exited - signalled:.2f} s after SIGTERM; connections taken from the queue on "
        f"stopping, per worker: {taken}"
    )


def log_count(path, text: str) -> int:
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def test_a_web_worker_stopped_alone_leaves_the_others_listening(published, redis_client, tmp_path):
    """One worker fewer (SIGTTOU to the master; a reload's or a timeout's stop is the same to the
    worker): that worker stops, but the socket is the others' too and keeps listening."""
    published(vip=(10, [1], {}))
    log = tmp_path / "gunicorn.log"
    env = worker_env(TEST_BROKER_URL, WEB_CONCURRENCY="2", WEB_THREADS="4", GUNICORN_ACCESSLOG="")
    with gunicorn_serving(env, log) as (server, base):
        os.kill(server.pid, signal.SIGTTOU)
        wait_for(
            lambda: log_count(log, "Worker exiting") == 1,
            seconds=60,
            what="one worker out",
            every=0.02,
        )
        answers = [requests.get(f"{base}/healthz", timeout=15).status_code for _ in range(20)]
        assert answers == [200] * 20
        assert log_count(log, "no longer listening") == 0
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert server.returncode == 0


def test_an_upload_outlasting_the_graceful_timeout_is_cut_off_and_stores_nothing(
    published, redis_client, settings, tmp_path
):
    """An upload still coming in when the graceful timeout runs out (here 2 s, by
    GUNICORN_CMD_ARGS) is cut off with its worker: no job, no file kept; the other requests in
    flight were answered. (300,000 recipients: half the file is more than Django keeps in memory,
    so a temporary file was being written.)"""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from gatekeeper.lib.permissions import CAMPAIGN_SYSTEM
    from tests.support.api import make_user
    from worker.models import SendJob

    published(vip=(10, [1], {}))
    user: User = make_user("gate", *CAMPAIGN_SYSTEM)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    csv = "user_id,address\n" + "".join(f"{u},token-{u}\n" for u in range(1, 300_001))
    fields = {"channel": "push", "campaign": "cut", "template": "welcome"}
    upload_body, upload_type = multipart(fields, "recipients_file", "cut.csv", csv.encode())
    media = Path(settings.MEDIA_ROOT)
    kept_before = stored_files(media)
    temp = tmp_path / "tmp"  # the web process's temporary files (Django's uploads)
    temp.mkdir()
    log = tmp_path / "gunicorn.log"
    env = worker_env(
        TEST_BROKER_URL, GUNICORN_ACCESSLOG="", GUNICORN_CMD_ARGS="--graceful-timeout 2",
        TMPDIR=str(temp),
    )  # fmt: skip
    never = threading.Event()
    with gunicorn_serving(env, log) as (server, base):
        address = ("127.0.0.1", int(base.rsplit(":", 1)[1]))
        upload = InFlight(
            address, "/api/v1/sends/", upload_body, {**headers, "Content-Type": upload_type},
            held=len(upload_body) // 2, release=never,
        )  # fmt: skip
        check = {"channel": "push", "requests": [{"user_id": 1, "message_id": "m"}]}
        json_headers = {**headers, "Content-Type": "application/json"}
        body = json.dumps(check).encode()
        checks = [InFlight(address, "/api/v1/gate/check/", body, json_headers) for _ in range(10)]
        upload.start()
        assert upload.sent.wait(60)
        for request in checks:
            request.start()
        for request in checks:
            assert request.sent.wait(60)
        os.kill(server.pid, signal.SIGTERM)
        signalled = time.monotonic()
        server.wait(timeout=60)
        exited = time.monotonic()
        never.set()  # the rest of the upload, to a server that is gone
        upload.join(60)
        for request in checks:
            request.join(60)
    assert [r.answer.status for r in checks] == [200] * len(checks)
    assert upload.answer.status is None and (upload.answer.error or "").startswith("reset")
    assert 2 <= exited - signalled < 10
    assert not SendJob.objects.exists()
    assert stored_files(media) == kept_before
    # What the upload had brought so far, in Django's temporary file: the killed worker could not
    # remove it (under systemd, PrivateTmp= gives the unit a /tmp of its own, removed when it stops).
    assert all(p.name.endswith(".upload.csv") for p in temp.iterdir())
    print(
        f"\nupload cut off {exited - signalled:.2f} s after SIGTERM ({upload.answer.error}); "
        f"left in the web process's temporary directory: {sorted(p.name for p in temp.iterdir())}"
    )


def stored_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()
