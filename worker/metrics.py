"""Prometheus metrics at /metrics (docs/monitoring.md lists them, the alerts on them and what to
do when one fires).

The web process answers, whichever of its workers is asked, with figures every process shares:
counters in Redis that every web and worker process adds to (the decisions per day,
worker/stats.py; the gate's call seconds, worker/latency.py; the worker's step timings,
worker/timings.py; the providers' answers, worker/delivery/answers.py), Redis's own state (the
ledger's stream, the processes' reports) and the database's (send jobs and their chunks). Only
the snapshot this process holds is its own. So no multiprocess registry is needed, and the gate
does no more than time its calls: every other figure is read when Prometheus asks.

Each source is read on its own, and one that fails leaves only its own figures out (the
family's HELP and TYPE stay): Redis and the database are asked first with a cheap ping
(`gatekeeper_redis_up`, `gatekeeper_database_up`), and what lives in one that did not answer is
not asked for, so that a scrape during an outage does not wait out every read's timeout.
"""

import datetime as dt
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gatekeeper.lib.probes import operator_allowed
from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.engine.limiter import get_limiter
from limits.ledger.drain import drain_backlog
from segments.index import index_status
from worker import latency, stats, timings
from worker.delivery import answers
from worker.delivery.brakes import BOUNCED, COMPLAINED, SENT, brake_figures
from worker.delivery.deliverability import mail_waiting
from worker.models import MailboxProvider
from worker.processes import processes_list
from worker.selectors import CHUNK_STATES, chunks_backlog, jobs_by_status, jobs_idle


def _redis_up() -> bool:
    try:
        return get_limiter().ping()  # the gate's own path: a Redis Function call
    except REDIS_DOWN:
        return False


def _database_up() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        return False


def _up(name: str, text: str, up: bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=1.0 if up else 0.0)


class GatekeeperCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        redis_up, database_up = _redis_up(), _database_up()
        yield _up("gatekeeper_redis_up", "1 when Redis answers the gate's function call.", redis_up)
        yield _up("gatekeeper_database_up", "1 when the database answers SELECT 1.", database_up)
        yield from self.decisions(redis_up)
        yield from self.gate_seconds(redis_up)
        yield from self.snapshot(redis_up)
        yield from self.ledger(redis_up)
        yield from self.sends(database_up)
        yield from self.providers(redis_up)
        yield from self.mailbox_providers(redis_up, database_up)
        yield from self.worker_seconds(redis_up)

    def decisions(self, redis_up: bool) -> Iterator[Metric]:
        today = dt.datetime.now(dt.UTC).date()
        by_day = GaugeMetricFamily(
            "gatekeeper_decisions_today",
            "Gate decisions since midnight UTC, by segment, channel and reason.",
            labels=["segment", "channel", "reason"],
        )
        # The same day's counters as a counter: it starts again at 0 at midnight UTC, which
        # Prometheus takes as a reset (rate() and increase() count across it).
        total = CounterMetricFamily(
            "gatekeeper_decisions",
            "Gate decisions by channel and reason (counted per UTC day: resets at midnight).",
            labels=["channel", "reason"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        if redis_up:
            try:
                counts = stats.stats_for_day(today)
            except (*REDIS_DOWN, ValueError):
                counts = {}
        summed: dict[tuple[str, str], int] = defaultdict(int)
        for (segment, channel, reason), count in sorted(counts.items()):
            by_day.add_metric([segment, channel, reason], count)
            summed[(channel, reason)] += count
        midnight = dt.datetime.combine(today, dt.time(), tzinfo=dt.UTC).timestamp()
        for (channel, reason), count in sorted(summed.items()):
            total.add_metric([channel, reason], count, created=midnight)
        yield by_day
        yield total

    def gate_seconds(self, redis_up: bool) -> Iterator[Metric]:
        seconds = HistogramMetricFamily(
            "gatekeeper_gate_seconds",
            "Seconds per gate call (dry runs not counted), by channel and batch size.",
            labels=["channel", "batch"],
        )
        if redis_up:
            try:
                found = latency.histograms()
            except (*REDIS_DOWN, ValueError):
                found = {}
            for (channel, batch), (buckets, total) in sorted(found.items()):
                seconds.add_metric([channel, batch], buckets, total)
        yield seconds

    def snapshot(self, redis_up: bool) -> Iterator[Metric]:
        status = index_status()
        loaded = GaugeMetricFamily(
            "gatekeeper_snapshot_loaded",
            "1 when this process holds a segment snapshot, by version.",
            labels=["version", "source"],
        )
        loaded.add_metric(
            [status["version"] or "", status["source"] or ""], 1.0 if status["loaded"] else 0.0
        )
        yield loaded
        age = GaugeMetricFamily(
            "gatekeeper_snapshot_age_seconds",
            "Seconds since the snapshot this process holds was published.",
        )
        try:
            published = dt.datetime.fromisoformat(status["published_at"] or "")
            age.add_metric([], max(0.0, time.time() - published.timestamp()))
        except ValueError:  # none held, or a manifest without its time
            pass
        yield age
        # The store as this process's follower last read it (every
        # GATEKEEPER_SNAPSHOT_POLL_SECONDS): no request to the store of its own, so a scrape
        # never waits on S3.
        version = status["store_version"]
        live = GaugeMetricFamily(
            "gatekeeper_snapshot_live",
            "1 for the version the snapshot store names live, as this process last read it.",
            labels=["version"],
        )
        if version:
            live.add_metric([version], 1.0)
        store_up = GaugeMetricFamily(
            "gatekeeper_snapshot_store_up",
            "1 when the snapshot store answered this process's last read of its live version.",
        )
        if status["store_answered"] is not None:
            store_up.add_metric([], 1.0 if status["store_answered"] else 0.0)
        yield live
        yield store_up
        processes = GaugeMetricFamily(
            "gatekeeper_processes",
            "Processes that gate (web workers, worker children) that reported lately, by role "
            "and the snapshot version they hold.",
            labels=["role", "version"],
        )
        behind = GaugeMetricFamily(
            "gatekeeper_processes_behind",
            "Of them, those holding another version than the store's live one.",
        )
        seen: list[dict[str, Any]] | None = None
        if redis_up:
            try:
                seen = processes_list()
            except REDIS_DOWN:
                seen = None
        if seen is not None:
            grouped: dict[tuple[str, str], int] = defaultdict(int)
            for entry in seen:
                grouped[(str(entry.get("role") or ""), str(entry.get("version") or ""))] += 1
            for (role, held), count in sorted(grouped.items()):
                processes.add_metric([role, held], count)
            if version:
                behind.add_metric([], sum(1 for e in seen if e.get("version") != version))
        yield processes
        yield behind

    def ledger(self, redis_up: bool) -> Iterator[Metric]:
        entries = GaugeMetricFamily(
            "gatekeeper_ledger_stream_entries",
            "Entries of the ledger's Redis stream not drained into the database yet.",
        )
        lag = GaugeMetricFamily(
            "gatekeeper_ledger_drain_lag_seconds",
            "Seconds the oldest undrained entry of the ledger's stream has waited (0: none).",
        )
        bound = GaugeMetricFamily(
            "gatekeeper_ledger_stream_max",
            "GATEKEEPER_LEDGER_BUFFER_MAX: beyond about this many entries the oldest are "
            "trimmed unwritten.",
            value=float(settings.GATEKEEPER_LEDGER_BUFFER_MAX),
        )
        if redis_up:
            try:
                backlog = drain_backlog()
                entries.add_metric([], backlog.entries)
                lag.add_metric([], backlog.lag_seconds)
            except (*REDIS_DOWN, ValueError):
                pass
        yield entries
        yield lag
        yield bound

    def sends(self, database_up: bool) -> Iterator[Metric]:
        chunks = GaugeMetricFamily(
            "gatekeeper_send_chunks",
            "Send chunks not settled, by kind and state (due, running, waiting, paused).",
            labels=["kind", "state"],
        )
        sends = GaugeMetricFamily(
            "gatekeeper_sends_pending",
            "Recipients in those chunks, by kind and state (kind=deferred: the waiting sends).",
            labels=["kind", "state"],
        )
        lag = GaugeMetricFamily(
            "gatekeeper_send_chunk_lag_seconds",
            "Seconds the oldest due chunk of each kind has been due without a run (0: none).",
            labels=["kind"],
        )
        jobs = GaugeMetricFamily(
            "gatekeeper_send_jobs", "Send jobs not ended, by status.", labels=["status"]
        )
        idle = GaugeMetricFamily(
            "gatekeeper_send_job_idle_seconds",
            "Per queued or running job with chunks to run now: seconds since a chunk of it "
            "settled or a run of it renewed its lease.",
            labels=["job_id", "channel", "campaign"],
        )
        if database_up:
            try:
                backlog = chunks_backlog()
                counted = jobs_by_status()
                idle_jobs = jobs_idle()
            except DatabaseError:
                pass
            else:
                for kind, states in backlog.items():
                    for state in CHUNK_STATES:
                        chunks.add_metric([kind, state], states[state]["chunks"])
                        sends.add_metric([kind, state], states[state]["sends"])
                    lag.add_metric([kind], states["due"]["lag_seconds"])
                for status, count in counted.items():
                    jobs.add_metric([status], count)
                for job in idle_jobs:
                    labels = [str(job["job"]), job["channel"], job["campaign"]]
                    idle.add_metric(labels, job["idle_seconds"])
        yield chunks
        yield sends
        yield lag
        yield jobs
        yield idle

    def providers(self, redis_up: bool) -> Iterator[Metric]:
        answered = CounterMetricFamily(
            "gatekeeper_provider_answers",
            "Sends handed to each provider, by its answer: sent, transient, permanent, "
            "ambiguous, throttled (every call counts: a send sent again counts again).",
            labels=["provider", "answer"],
        )
        if redis_up:
            try:
                found = answers.answers_read()
            except (*REDIS_DOWN, ValueError):
                found = {}
            # Every answer of a provider that answered at all, 0 included, so that a ratio of
            # failures to calls is 0 rather than missing.
            for provider in sorted({provider for provider, _ in found}):
                for answer in answers.ANSWERS:
                    answered.add_metric([provider, answer], found.get((provider, answer), 0))
        yield answered

    def mailbox_providers(self, redis_up: bool, database_up: bool) -> Iterator[Metric]:
        paused = GaugeMetricFamily(
            "gatekeeper_mailbox_provider_paused",
            "1 while a mailbox provider's brake holds its email (a person resumes it).",
            labels=["group"],
        )
        waiting = GaugeMetricFamily(
            "gatekeeper_mailbox_provider_waiting",
            "Email waiting for a mailbox provider: `brake` (paused) or `warmup` (beyond the "
            "day's warm-up volume).",
            labels=["group", "hold"],
        )
        figures = GaugeMetricFamily(
            "gatekeeper_mailbox_provider_24h",
            "A mailbox provider's email over the last 24 hours (since it was resumed): sent, "
            "complained, bounced (hard).",
            labels=["group", "figure"],
        )
        groups: list[str] = []
        if database_up:
            try:
                states = list(MailboxProvider.objects.values_list("slug", "paused_at"))
                held = mail_waiting()
            except DatabaseError:
                states, held = [], {}
            for slug, paused_at in states:
                groups.append(slug)
                paused.add_metric([slug], 1.0 if paused_at is not None else 0.0)
            for (group, hold), count in sorted(held.items()):
                waiting.add_metric([group, hold], count)
        if redis_up:
            for group in groups:
                try:
                    found = brake_figures(group)
                except (*REDIS_DOWN, ValueError):
                    continue
                for figure, value in (
                    (SENT, found.sent),
                    (COMPLAINED, found.complaints),
                    (BOUNCED, found.bounces),
                ):
                    figures.add_metric([group, figure], value)
        yield paused
        yield waiting
        yield figures

    def worker_seconds(self, redis_up: bool) -> Iterator[Metric]:
        seconds = CounterMetricFamily(
            "gatekeeper_worker_seconds",
            "Seconds the workers spent per step of a send (wall clock, every process).",
            labels=["step"],
        )
        if redis_up:
            try:
                spent = timings.timings_read()
            except (*REDIS_DOWN, ValueError):
                spent = {}
            for step, value in spent.items():
                seconds.add_metric([step], value)
        yield seconds


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not operator_allowed(request):
        response = HttpResponse(
            "Metrics are for the operator: call from GATEKEEPER_METRICS_NETWORKS or send "
            "Authorization: Bearer <GATEKEEPER_METRICS_TOKEN>.\n",
            status=403,
            content_type="text/plain",
        )
        return response
    # This process's own counts not written yet, so that they are in what it reads.
    stats.flush()
    timings.flush()
    latency.flush()
    answers.flush()
    registry = CollectorRegistry()
    registry.register(GatekeeperCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
