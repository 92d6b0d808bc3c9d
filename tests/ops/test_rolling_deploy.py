"""A rolling upgrade, tested whole: the previous release (from git) runs as web, send worker,
upkeep worker and beat; a 100,000-recipient push job runs, paced by its provider's rate, some
of its sends deferred by a cap to a release that falls while both releases run, and the ledger's
event stream posted to an endpoint. This release's `migrate` runs, then its four processes start
beside the old ones, and the old ones are stopped one kind at a time with SIGTERM, mid-job
(worker, upkeep, beat, web), while REST calls go to both web processes and every answer is
checked against the schema each serves. Then: every send handed to the provider once (0 lost,
0 doubled), the job's counts adding up, the ledger holding each decision once, the endpoint
given every event of the stream once. The timings are printed (`-s`)."""

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
import redis
import requests
import schemathesis
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from gatekeeper.lib.redis_client import reset_redis_clients
from limits.ledger.drain import ledger_drain_all
from limits.ledger.table import decisions
from limits.policy.rules import RuleFields
from limits.policy.selectors import policy_cache
from limits.policy.services import RULES
from limits.stream.events import START, stream_read
from limits.stream.webhooks import WebhookFields, webhook_create
from tests.support.celery_workers import ROOT, release_tree_or_skip, worker_env
from tests.support.dispatch_log import (
    FILE_DISPATCHER,
    dispatched,
    file_dispatch_env,
)
from tests.support.releases import (
    Release,
    Running,
    migration_leaves,
    migrations_since,
    not_expanding,
    ready,
)
from tests.support.worker_processes import TEST_BROKER_URL, job_counts, job_done, wait_for
from worker.models import SendChunk, SendJob

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# The release before this one. Each release moves it to the one before itself, so that this
# test always runs the upgrade an operator makes to reach it.
PREVIOUS_RELEASE = "993af90fc5c47c4220917023866245a668834328"

RECIPIENTS = 100_000
USERS = range(1, RECIPIENTS + 1)
# Capped at one push a minute each, and sent one through the old web's gate as this release
# starts: their push in the job, placed at AT, is deferred to a minute after that, during
# the overlap (the old web is stopped only once they went).
VIP = range(1, 201)
AT = 10_000
# The provider's rate, sends a second: the job lasts about 100 s, over the whole overlap.
RATE = 1_000
# The old processes are stopped, one kind at a time, once the job has sent this many.
# The old processes are stopped in this order, each once this many more were sent.
STOPS = ("worker", "upkeep", "beat", "web")
STEP = 2_500
START_NEW_AT = 2_000


@pytest.fixture
def previous_tree(tmp_path_factory):
    return release_tree_or_skip(PREVIOUS_RELEASE, tmp_path_factory)


@dataclass
class Traffic:
    """REST calls to every web process in the pool, each answer checked against the schema
    its server serves (and the other release's): 5xx, a broken answer, a refused connection
    are all failures."""

    job_id: int
    token: str
    schemas: dict[str, Any]  # release -> the loaded schema
    pool: list[Running] = field(default_factory=list)
    answered: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # gate checks answered: message ids
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    made: Iterator[int] = field(default_factory=itertools.count)  # one count for every thread

    def calls(self, k: int) -> tuple[str, str, dict[str, Any] | None, str]:
        user = 3_000_000 + k
        choice = k % 4
        if choice == 0:
            body = {"channel": "email", "requests": [{"user_id": user, "message_id": f"rest-{k}"}]}
            return "POST", "/api/v1/gate/check/", body, "/gate/check/"
        if choice == 1:
            return "GET", f"/api/v1/sends/{self.job_id}/", None, "/sends/{job_id}/"
        if choice == 2:
            return "GET", f"/api/v1/users/{user - 2}/quota/", None, "/users/{user_id}/quota/"
        return "GET", "/api/v1/segments/", None, "/segments/"

    def run(self) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.token}"
        while not self.stop.is_set():
            with self.lock:
                k = next(self.made)
                web = self.pool[k % len(self.pool)]
            method, path, body, operation = self.calls(k)
            try:
                answer = session.request(method, web.url + path, json=body, timeout=30)
            except requests.RequestException as exc:
                self.failures.append(f"{web.name} {method} {path}: {exc!r}")
                continue
            self.answered[web.release] += 1
            if answer.status_code >= 500 or answer.status_code not in (200,):
                self.failures.append(f"{web.name} {method} {path}: {answer.status_code}")
                continue
            for release, schema in self.schemas.items():
                try:
                    schema["/api/v1" + operation][method].validate_response(answer)
                except Exception as exc:  # schemathesis' FailureGroup
                    self.failures.append(
                        f"{web.name} {method} {path}: not {release}'s schema: {exc}"[:600]
                    )
            data = answer.json()
            if operation == "/gate/check/":
                self.checked.extend(r["message_id"] for r in data["results"])
            elif operation == "/sends/{job_id}/":
                counts = [data[o] for o in (*SendJob.OUTCOMES, "pending")]
                if sum(counts) != data["total"]:
                    self.failures.append(f"{web.name}: the job's counts {data} do not add up")

    def remove(self, web: Running) -> None:
        """Out of the pool, as a load balancer takes a host out before it stops."""
        with self.lock:
            self.pool.remove(web)


def schema_of(web: Running) -> Any:
    return schemathesis.openapi.from_url(f"{web.url}/api/schema/?format=json")


def test_a_rolling_upgrade_mid_job_loses_nothing_doubles_nothing_and_answers_every_call(
    published, previous_tree, own_redis, receiver, settings, tmp_path, capsys
):
    began = time.monotonic()
    timings: dict[str, float] = {}

    def mark(what: str) -> None:
        timings[what] = round(time.monotonic() - began, 1)

    # A Redis server of the test's own: two releases load their libraries of functions, the
    # server's; on the shared one they would answer any suite running beside this one.
    settings.REDIS_URL = own_redis.url
    reset_redis_clients()
    redis.Redis.from_url(TEST_BROKER_URL).flushdb()
    settings.GATEKEEPER_DISPATCHERS = {"push": FILE_DISPATCHER}
    log = tmp_path / "dispatched.txt"
    env = worker_env(
        TEST_BROKER_URL,
        REDIS_URL=own_redis.url,
        GATEKEEPER_SNAPSHOT_POLL_SECONDS="1",
        **file_dispatch_env(log, RATE),
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    old = Release("previous", previous_tree, env, logs)
    new = Release("this", ROOT, env, logs)

    # The database as the previous release left it: each app's migrations up to its last then.
    leaves = migration_leaves(PREVIOUS_RELEASE)
    for path in migrations_since(PREVIOUS_RELEASE):
        app = path.split("/")[-3]
        new.manage("migrate", app, leaves.get(app, "zero"), "--no-input")

    published(vip=(10, list(VIP), {}))
    RULES.create(
        fields=RuleFields(
            name="one push a minute", segment="vip", channel="push", match="any", tag="",
            window_kind="rolling", window_seconds=60, window_unit="", limit=1,
            reserve_below_priority=None, reserve_slots=None,
        ),
        via="command",
    )  # fmt: skip
    policy_cache().invalidate()
    user = User.objects.create_superuser("ops", password="pw")
    token = Token.objects.create(user=user).key
    ledger_drain_all()
    endpoint = webhook_create(fields=WebhookFields(url=receiver.url), start="0")
    receiver.secret = endpoint.secret

    try:
        old_web = old.web()
        for running in (old_web, old.worker("sends,builds", "worker"),
                        old.worker(settings.UPKEEP_QUEUE, "upkeep"), old.beat()):  # fmt: skip
            ready(running)
        mark("previous release ready")

        # The VIPs' one push a minute, taken through the old web's gate.
        body: dict[str, Any] = {
            "channel": "push",
            "requests": [{"user_id": u, "message_id": f"elsewhere:{u}"} for u in VIP],
        }
        answer = requests.post(
            f"{old_web.url}/api/v1/gate/check/", json=body, timeout=30,
            headers={"Authorization": f"Token {token}"},
        )  # fmt: skip
        assert answer.status_code == 200 and all(r["allowed"] for r in answer.json()["results"])
        mark("VIPs charged")
        # The job made by the previous release (its web takes the file, its worker reads it):
        # this release's code must not write to the schema before its own migrate.
        users = [u for u in USERS if u not in VIP]
        users[AT:AT] = VIP
        csv = "user_id,address\n" + "".join(f"{u},token-{u}\n" for u in users)
        made = requests.post(
            f"{old_web.url}/api/v1/sends/",
            data={"channel": "push", "campaign": "news", "template": "welcome",
                  "on_capped": "defer"},
            files={"recipients_file": ("news.csv", csv.encode(), "text/csv")},
            headers={"Authorization": f"Token {token}"}, timeout=120,
        )  # fmt: skip
        assert made.status_code == 202, made.text
        # Read without the fields this release adds (a job's round and value): its migrate has
        # not run yet. Refreshed, it reads what it was read with.
        job = SendJob.objects.defer("round", "value").get(pk=made.json()["id"])

        def read() -> bool:
            job.refresh_from_db()
            return job.status != SendJob.Status.PREPARING

        wait_for(read, seconds=120, what="the previous release's worker to read the file")
        assert job.total == RECIPIENTS
        mark("job created")

        traffic = Traffic(job.pk, token, {"previous": schema_of(old_web)}, pool=[old_web])
        threads = [threading.Thread(target=traffic.run, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()

        def sent_at_least(n: int) -> bool:
            job.refresh_from_db()
            return job.sent >= n or job.status == SendJob.Status.DONE

        wait_for(lambda: sent_at_least(START_NEW_AT), seconds=90, what="the job's first sends")
        mark(f"{job.sent} sent: migrate, this release starts")
        new.manage("migrate", "--no-input")
        new_web = new.web()
        started = [new_web, new.worker("sends,builds", "worker"),
                   new.worker(settings.UPKEEP_QUEUE, "upkeep"), new.beat()]  # fmt: skip
        for running in started:
            ready(running)
        traffic.schemas["this"] = schema_of(new_web)
        with traffic.lock:
            traffic.pool.append(new_web)
        mark("this release ready")
        overlap_from = timezone.now()
        assert job.pending > 0, "the job ended before the overlap"

        by_kind = {r.kind: r for r in old.running}
        for kind in STOPS:
            at = job.sent + STEP
            if kind != "web":
                wait_for(lambda at=at: sent_at_least(at), seconds=120, what=f"{at} sent")
            else:
                # Beat has queued the VIPs' deferred pushes (they run behind the chunks queued
                # before them).
                wait_for(
                    lambda: bool(deferred_chunks(job)) and all(deferred_chunks(job)),
                    seconds=120,
                    what="the VIPs' deferred pushes to be released",
                )
                traffic.remove(by_kind[kind])
            assert not job_done(job), f"the job ended before the old {kind} was stopped"
            by_kind[kind].stop()
            mark(f"{job.sent} sent: old {kind} stopped in {by_kind[kind].stopped_in:.1f} s")
        overlap_to = timezone.now()
        wait_for(lambda: job_done(job), seconds=180, what="the job to finish")
        mark("job done")
        traffic.stop.set()
        for thread in threads:
            thread.join(timeout=40)

        # The stream: everything the ledger took, posted to the endpoint by this release's
        # beat and workers.
        ledger_drain_all(seconds=60)
        events = stream_events()
        wait_for(
            lambda: {e["id"] for e in receiver.taken()} >= {e["id"] for e in events},
            seconds=120,
            what="the endpoint to be given every event",
        )
        mark("stream delivered")
    finally:
        traffic_stop = locals().get("traffic")
        if traffic_stop is not None:
            traffic_stop.stop.set()
        old.stop_all()
        new.stop_all()
        new.manage("migrate", "--no-input")  # whatever happened: the next test's schema

    # REST: every answer of both web processes valid under both schemas.
    assert not traffic.failures, traffic.failures[:20]
    assert traffic.answered["previous"] > 20 and traffic.answered["this"] > 20, traffic.answered

    # The job: each recipient once, counts adding up; the deferred ones went after their minute.
    counts = job_counts(job)
    assert sum(counts.values()) == job.total == RECIPIENTS, counts
    # Sent, or handed over while Redis did not answer in time to mark it so (REDIS_SOCKET_TIMEOUT
    # on a busy machine): ambiguous, and not sent again. Either way in the provider's log once.
    assert (job.sent + job.ambiguous, job.pending) == (RECIPIENTS, 0), counts
    # Reasons count decisions: the VIPs' second sends were refused by the cap before they went.
    assert job.reasons.get("allowed") == RECIPIENTS, job.reasons
    assert set(job.reasons) == {"allowed", "cap"} and job.reasons["cap"] >= len(VIP), job.reasons
    handed = dispatched(log)
    twice = [key for key, n in handed.items() if n > 1]
    assert not twice, f"sent twice: {twice[:10]}"
    expected = {(u, f"news:{u}") for u in USERS}
    assert set(handed) == expected, sorted(expected - set(handed))[:10]

    # The ledger: one allowed decision for each send; the VIPs' refused (deferred) once or more
    # before it, and allowed during the overlap; each REST gate check once.
    rows_by: dict[str, list[str]] = {}
    released: list[datetime] = []
    ledger = decisions().order_by("id").values_list("message", "reason", "at")
    for message, reason, at in ledger.iterator(20_000):
        rows_by.setdefault(message, []).append(reason)
        if reason == "allowed" and message.startswith("news:") and int(message[5:]) in VIP:
            released.append(at)
    allowed = Counter(m for m, reasons in rows_by.items() for r in reasons if r == "allowed")
    assert set(allowed.values()) == {1}
    deferred = {f"news:{u}": rows_by[f"news:{u}"] for u in VIP}
    assert len(released) == len(VIP)
    releases = [at for at in deferred_chunks(job) if at is not None]
    assert len(releases) == len(deferred_chunks(job))
    assert overlap_from <= min(releases) and max(releases) <= overlap_to, (
        overlap_from, releases, overlap_to,
    )  # fmt: skip
    assert all(rows_by[f"elsewhere:{u}"] == ["allowed"] for u in VIP)
    assert all(r[-1] == "allowed" and "allowed" not in r[:-1] and r[:-1] for r in deferred.values())
    assert job.reasons and sum(len(r) - 1 for r in deferred.values()) >= len(VIP)
    checked = Counter(traffic.checked)
    assert checked and all(len(rows_by.get(m, [])) == 1 for m in checked), [
        (m, rows_by.get(m)) for m in checked if len(rows_by.get(m, [])) != 1
    ][:10]

    # The stream: each of its events given to the endpoint once, by id.
    ids = Counter(e["id"] for e in receiver.taken())
    assert {e["id"] for e in events} == set(ids)
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:10]
    assert sum(e.get("type") == "decision" for e in events) == sum(map(len, rows_by.values()))

    with capsys.disabled():
        print(f"\nrolling upgrade: {json.dumps(timings)}")
        print(f"REST answers by release: {dict(traffic.answered)}; events {len(events)}")


def deferred_chunks(job: SendJob) -> list[datetime | None]:
    """When each of the job's deferred chunks was handed to the broker (None: still waiting)."""
    chunks = job.chunks.filter(kind=SendChunk.Kind.DEFERRED).order_by("pk")
    return list(chunks.values_list("queued_at", flat=True))


def stream_events() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = START
    while True:
        page = stream_read(after, limit=1000)
        found.extend(page.events)
        after = page.next
        if not page.more:
            return found


def test_the_migrations_since_the_previous_release_only_expand():
    """An old process keeps working on the new schema only if nothing it reads or writes went
    away: no removed or renamed field or model, no field made NOT NULL without a default."""
    found = [
        problem for path in migrations_since(PREVIOUS_RELEASE) for problem in not_expanding(path)
    ]
    assert not found, "\n".join(found)


def test_the_expansion_check_names_a_migration_that_removes_or_narrows(tmp_path, monkeypatch):
    from tests.support import releases

    app = tmp_path / "shop" / "migrations"
    app.mkdir(parents=True)
    (app / "0002_narrow.py").write_text(
        "from django.db import migrations, models\n"
        "class Migration(migrations.Migration):\n"
        "    operations = [\n"
        "        migrations.RemoveField(model_name='order', name='note'),\n"
        "        migrations.AlterField(model_name='order', name='total', field=models.IntegerField()),\n"
        "        migrations.AlterField(model_name='order', name='tax', field=models.IntegerField(null=True)),\n"
        "        migrations.AddField(model_name='order', name='fee', field=models.IntegerField(default=0)),\n"
        "        migrations.AddField(model_name='order', name='tip', field=models.IntegerField(default=0, db_default=0)),\n"
        "    ]\n"
    )
    monkeypatch.setattr(releases, "ROOT", tmp_path)
    found = not_expanding("shop/migrations/0002_narrow.py")
    assert len(found) == 3
    assert found[0].startswith("shop/migrations/0002_narrow.py: migrations.RemoveField(")
    assert "name='total'" in found[1]
    # Django's `default` is not the database's: an old process's INSERT leaves `fee` out.
    assert "name='fee'" in found[2]
