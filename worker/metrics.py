"""Prometheus metrics at /metrics.

Decision counts come from the Redis day counters (worker/stats.py), which every web and worker
process adds to, so any process answers with the same figures; no multiprocess registry needed.
"""

import datetime as dt
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatekeeper.lib.probes import operator_allowed
from segments.index import index_status
from worker import stats, timings


class GatekeeperCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        decisions = GaugeMetricFamily(
            "gatekeeper_decisions_today",
            "Gate decisions since midnight UTC, by segment, channel and reason.",
            labels=["segment", "channel", "reason"],
        )
        try:
            today = stats.stats_for_day(dt.datetime.now(dt.UTC).date())
        except Exception:
            today = {}
        for (segment, channel, reason), count in sorted(today.items()):
            decisions.add_metric([segment, channel, reason], count)
        yield decisions
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
        seconds = CounterMetricFamily(
            "gatekeeper_worker_seconds",
            "Seconds the workers spent per step of a send (wall clock, every process).",
            labels=["step"],
        )
        try:
            spent = timings.timings_read()
        except Exception:
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
    stats.flush()
    timings.flush()
    registry = CollectorRegistry()
    registry.register(GatekeeperCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
