"""/metrics: the operator's figures, each from its real source (Redis, the database, the
snapshot this process holds), scraped as Prometheus scrapes them, and a scrape that still
answers when a source does not."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import free_port
from gatekeeper.lib.instants import instant_ms
from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine.limiter import reset_limiter
from limits.ledger.drain import drain_backlog, ledger_drain_all
from limits.ledger.stream import stream_key
from segments.index import get_index, index_status
from tests.support.sends import make_job, run_all
from worker.gate import gate_check
from worker.models import SendChunk, SendJob
from worker.processes import process_report
from worker.services import send_job_create

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "operator-token"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape() -> Samples:
    """Every sample /metrics answers, by name and labels; fetched with the operator's token
    from an address no network setting lets in."""
    response = Client(REMOTE_ADDR="203.0.113.9").get(
        "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 200, response.content
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def named(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


@pytest.fixture(autouse=True)
def _operator(settings) -> None:
    settings.GATEKEEPER_METRICS_TOKEN = TOKEN
    settings.GATEKEEPER_METRICS_NETWORKS = []


@pytest.fixture
def vip(published) -> str:
    return published(
        vip=(10, [1, 2, 3, 4], {"email": (None, None), "push": (None, None)}),
        blocked=(20, [9], {"email": (0, 0)}),  # a cap of 0: `blocked`
    )


def test_the_reachability_of_redis_and_the_database(vip):
    samples = scrape()
    assert value(samples, "gatekeeper_redis_up") == 1
    assert value(samples, "gatekeeper_database_up") == 1


def test_decisions_are_a_counter_per_channel_and_reason_that_starts_at_midnight(vip):
    gate_check(channel="email", requests=[(1, "a"), (2, "b"), (9, "c")])
    gate_check(channel="email", requests=[(3, "d")])
    gate_check(channel="push", requests=[(1, "e")])
    gate_check(channel="email", requests=[(4, "f")], dry_run=True)  # never counted
    samples = scrape()
    # Summed over segments (vip's 3 and the default's none), as the day's gauge has them.
    assert value(samples, "gatekeeper_decisions_total", channel="email", reason="allowed") == 3
    assert value(samples, "gatekeeper_decisions_total", channel="email", reason="blocked") == 1
    assert value(samples, "gatekeeper_decisions_total", channel="push", reason="allowed") == 1
    assert len(named(samples, "gatekeeper_decisions_total")) == 3
    day = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    created = value(samples, "gatekeeper_decisions_created", channel="push", reason="allowed")
    assert created == day.timestamp()
    day_gauge = "gatekeeper_decisions_today"
    assert value(samples, day_gauge, segment="vip", channel="email", reason="allowed") == 3


def test_gate_calls_are_timed_by_channel_and_batch_size(vip):
    for i in range(3):
        gate_check(channel="email", requests=[(1, f"one-{i}")])
    gate_check(channel="email", requests=[(u, f"many-{u}") for u in range(1, 151)])
    gate_check(channel="push", requests=[(1, "x")], dry_run=True)  # not timed
    samples = scrape()
    one = {"channel": "email", "batch": "1"}
    assert value(samples, "gatekeeper_gate_seconds_count", **one) == 3
    assert value(samples, "gatekeeper_gate_seconds_bucket", le="+Inf", **one) == 3
    assert 0 < value(samples, "gatekeeper_gate_seconds_sum", **one) < 3 * 10
    many = {"channel": "email", "batch": "101-1000"}
    assert value(samples, "gatekeeper_gate_seconds_count", **many) == 1
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for labels, v in named(samples, "gatekeeper_gate_seconds_bucket").items()
        if dict(labels)["batch"] == "1"
    )
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == 3  # cumulative, +Inf last
    assert not any(
        dict(labels)["channel"] == "push"
        for labels in named(samples, "gatekeeper_gate_seconds_count")
    )


def test_the_ledger_stream_and_the_drain_lag(vip, redis_client):
    # An entry appended two minutes ago and never drained (a gate of another version wrote it).
    appended_ms = int((time.time() - 120) * 1000)
    redis_client.xadd(stream_key(), {"d": b"not a ledger entry"}, id=f"{appended_ms}-0")
    gate_check(channel="email", requests=[(1, "a"), (2, "b")])  # one entry per gate call
    samples = scrape()
    assert value(samples, "gatekeeper_ledger_stream_entries") == 2
    assert 120 <= value(samples, "gatekeeper_ledger_drain_lag_seconds") < 150
    assert value(samples, "gatekeeper_ledger_stream_max") == 100_000
    ledger_drain_all()
    samples = scrape()
    assert value(samples, "gatekeeper_ledger_stream_entries") == 0
    assert value(samples, "gatekeeper_ledger_drain_lag_seconds") == 0


@pytest.mark.postgres
def test_the_drain_lag_is_read_against_the_clock_given(redis_client):
    appended = datetime(2026, 6, 1, 9, tzinfo=UTC)
    redis_client.xadd(stream_key(), {"d": b"x"}, id=f"{instant_ms(appended)}-0")
    backlog = drain_backlog(now=appended + timedelta(seconds=90, milliseconds=500))
    assert (backlog.entries, backlog.lag_seconds) == (1, 90.5)
    assert drain_backlog(now=appended - timedelta(seconds=1)).lag_seconds == 0  # never negative
    with pytest.raises(TypeError):
        drain_backlog(now=appended.timestamp())  # type: ignore[arg-type]


def test_chunks_by_kind_and_state_with_the_oldest_due_ones_lag(vip):
    now = timezone.now()
    job = make_job(1, 2, 3)  # one chunk of 3, queued, not handed out
    (chunk,) = SendChunk.objects.filter(job=job)
    SendChunk.objects.filter(pk=chunk.pk).update(queued_at=now - timedelta(seconds=300))
    waiting = make_job(4, campaign="later")
    waiting.chunks.update(kind=SendChunk.Kind.DEFERRED, not_before=now + timedelta(hours=1))
    samples = scrape()
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="due") == 1
    assert value(samples, "gatekeeper_sends_pending", kind="send", state="due") == 3
    assert 300 <= value(samples, "gatekeeper_send_chunk_lag_seconds", kind="send") < 330
    assert value(samples, "gatekeeper_send_chunks", kind="deferred", state="waiting") == 1
    assert value(samples, "gatekeeper_sends_pending", kind="deferred", state="waiting") == 1
    assert value(samples, "gatekeeper_send_chunk_lag_seconds", kind="deferred") == 0
    assert value(samples, "gatekeeper_send_jobs", status="queued") == 2
    # A run holds the first chunk: running, not due, and no lag.
    SendChunk.objects.filter(pk=chunk.pk).update(lease_until=now + timedelta(seconds=60))
    samples = scrape()
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="running") == 1
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="due") == 0
    assert value(samples, "gatekeeper_send_chunk_lag_seconds", kind="send") == 0
    # Its lease ran out and the job is paused: paused, not due.
    SendChunk.objects.filter(pk=chunk.pk).update(lease_until=now - timedelta(seconds=1))
    SendJob.objects.filter(pk=job.pk).update(paused_at=now, status=SendJob.Status.PAUSED)
    samples = scrape()
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="paused") == 1
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="due") == 0
    assert value(samples, "gatekeeper_send_jobs", status="paused") == 1


@pytest.mark.postgres
def test_a_job_idle_since_its_last_progress_and_one_that_only_waits_is_not(vip, settings):
    now = timezone.now()
    settings.GATEKEEPER_CHUNK_LEASE_SECONDS = 60
    stalled = make_job(1, 2, campaign="stalled")
    SendJob.objects.filter(pk=stalled.pk).update(
        status=SendJob.Status.RUNNING, updated_at=now - timedelta(seconds=600)
    )
    waits = make_job(3, campaign="waits")
    waits.chunks.update(kind=SendChunk.Kind.DEFERRED, not_before=now + timedelta(hours=1))
    SendJob.objects.filter(pk=waits.pk).update(updated_at=now - timedelta(hours=2))
    samples = scrape()
    idle = named(samples, "gatekeeper_send_job_idle_seconds")
    labels = frozenset(
        {"job_id": str(stalled.pk), "channel": "email", "campaign": "stalled"}.items()
    )
    assert list(idle) == [labels]
    assert 600 <= idle[labels] < 630
    # A run took one of its chunks 10 s ago (its lease runs a full lease from then).
    stalled.chunks.update(lease_until=timezone.now() + timedelta(seconds=50))
    assert 10 <= named(scrape(), "gatekeeper_send_job_idle_seconds")[labels] < 40


def test_provider_answers_are_counted_per_provider_and_answer(published, relay):
    published(vip=(10, [1, 2, 3], {"push": (None, None)}))
    # Too many (sent again a second later, then taken), a server error, a refusal.
    relay.statuses = [429, 500, 400]
    job = send_job_create(
        channel="push",
        campaign="c",
        template="welcome",
        recipients=[{"user_id": u, "address": f"token-{u}"} for u in (1, 2, 3)],
        queue=False,
    )
    run_all(job)
    samples = scrape()
    answers = {
        dict(labels)["answer"]: v
        for labels, v in named(samples, "gatekeeper_provider_answers_total").items()
        if dict(labels)["provider"] == "webhook"
    }
    assert answers == {"sent": 1, "throttled": 1, "transient": 1, "permanent": 1, "ambiguous": 0}


def test_the_snapshot_held_the_stores_live_one_and_the_processes_behind_it(vip):
    samples = scrape()  # this process has not loaded it yet
    assert value(samples, "gatekeeper_snapshot_loaded", version="", source="") == 0
    assert not named(samples, "gatekeeper_snapshot_age_seconds")
    get_index()  # as every web and worker process does when it starts
    samples = scrape()
    assert value(samples, "gatekeeper_snapshot_loaded", version=vip, source="store") == 1
    assert 0 <= value(samples, "gatekeeper_snapshot_age_seconds") < 60
    assert value(samples, "gatekeeper_snapshot_live", version=vip) == 1
    assert value(samples, "gatekeeper_snapshot_store_up") == 1
    process_report(role="web", status={**index_status(), "version": "20200101T000000Z-b0000001-1"})
    samples = scrape()
    assert (
        value(samples, "gatekeeper_processes", role="web", version="20200101T000000Z-b0000001-1")
        == 1
    )
    assert value(samples, "gatekeeper_processes_behind") == 1
    process_report(role="web", status=index_status())
    samples = scrape()
    assert value(samples, "gatekeeper_processes", role="web", version=vip) == 1
    assert value(samples, "gatekeeper_processes_behind") == 0


def test_a_scrape_answers_when_redis_does_not(vip, settings):
    make_job(1)
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    reset_redis_clients()
    reset_limiter()
    try:
        started = time.monotonic()
        samples = scrape()
        assert time.monotonic() - started < 10
    finally:
        reset_redis_clients()
        reset_limiter()
    assert value(samples, "gatekeeper_redis_up") == 0
    assert value(samples, "gatekeeper_database_up") == 1
    assert not named(samples, "gatekeeper_decisions_total")
    assert not named(samples, "gatekeeper_ledger_stream_entries")
    # What the database holds is still there.
    assert value(samples, "gatekeeper_send_chunks", kind="send", state="due") == 1


@pytest.mark.postgres
def test_a_scrape_answers_when_the_database_does_not(vip):
    gate_check(channel="email", requests=[(1, "a")])
    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = "/nonexistent/gatekeeper/metrics.sqlite3"
    else:
        connection.settings_dict["HOST"], connection.settings_dict["PORT"] = (
            "127.0.0.1",
            free_port(),
        )
    try:
        samples = scrape()
    finally:
        connection.close()
        connection.settings_dict.update(saved)
    assert value(samples, "gatekeeper_database_up") == 0
    assert value(samples, "gatekeeper_redis_up") == 1
    assert not named(samples, "gatekeeper_send_chunks")
    assert value(samples, "gatekeeper_decisions_total", channel="email", reason="allowed") == 1
