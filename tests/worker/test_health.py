"""/healthz, /readyz and /metrics."""

import pytest

from tests.support.api import call, check_body

pytestmark = pytest.mark.django_db(transaction=True)


def test_health_and_readiness(api, snapshot):
    s = api("anonymous")
    assert call(s, "GET", "/healthz").json() == {"status": "ok"}
    ready = call(s, "GET", "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["snapshot"]["version"] == snapshot


def test_not_ready_without_a_snapshot(api):
    response = call(api("anonymous"), "GET", "/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["snapshot"]["ok"] is False


def test_metrics_report_todays_decisions_from_redis(api, snapshot):
    call(api("gate"), "POST", "/api/v1/gate/check/", json=check_body([(1, "a"), (7, "b")]))
    text = call(api("anonymous"), "GET", "/metrics").text
    assert 'gatekeeper_decisions_today{channel="email",reason="allowed",segment="vip"} 1.0' in text
    assert f'gatekeeper_snapshot_loaded{{source="store",version="{snapshot}"}} 1.0' in text
    # Seconds per step of a send: the gate call above is timed only by workers' runs.
    assert 'gatekeeper_worker_seconds_total{step="gate"}' in text
