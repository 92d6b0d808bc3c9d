"""The monitoring kit in deploy/: the Prometheus alert rules are valid and pass their unit tests
(promtool), the Grafana dashboard is a dashboard with a Prometheus datasource variable whose
queries parse, and every metric a panel or an alert names is one /metrics really exposes (and
every one it exposes has a panel)."""

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gatekeeper-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "gatekeeper-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gatekeeper.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian's `prometheus` package; `make test` installs it "
    "with scripts/system_deps.py)",
)
# Series Prometheus makes itself rather than scrapes.
PROMETHEUS_OWN = {"up"}
# Series /metrics writes that no panel needs to show: a counter's start (prometheus_client
# writes one per counter; the day's decisions start at midnight UTC).
NO_PANEL = {"gatekeeper_decisions_created"}
METRIC = re.compile(r"\b(gatekeeper_[a-z0-9_]+|up)\b(?!\s*\()")


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def panels() -> list[dict[str, Any]]:
    """Every panel that queries (rows' own panels included), not the rows."""
    found: list[dict[str, Any]] = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def panel_queries() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def metrics_named(query: str) -> set[str]:
    """The metrics a PromQL query names (label values in quotes left out)."""
    return set(METRIC.findall(re.sub(r'"[^"]*"', '""', query)))


@needs_promtool
def test_the_alert_rules_are_valid() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout


@needs_promtool
def test_the_alert_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for rule in alerts():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']} never fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']} always fires"
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_dashboard_is_one_with_a_prometheus_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "Gatekeeper" and dashboard["uid"] and dashboard["schemaVersion"]
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    uses = {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"] == uses, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == uses and target["expr"] and target["refId"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]


@needs_promtool
def test_every_panel_query_parses(tmp_path: Path) -> None:
    # promtool parses each query as a recording rule's; Grafana's own variable as a range.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{k}", "expr": q.replace("$__rate_interval", "5m")}
                    for k, q in enumerate(panel_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.django_db
def test_panels_and_alerts_name_only_metrics_metrics_exposes(redis_client, settings) -> None:
    settings.GATEKEEPER_METRICS_TOKEN = "operator"
    response = Client().get("/metrics", headers={"Authorization": "Bearer operator"})
    assert response.status_code == 200
    families: dict[str, set[str]] = {}  # each family's series names, as the scrape types them
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", response.content.decode(), re.M):
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        families[name] = {name + suffix for suffix in suffixes}
    exposed = set().union(*families.values())
    assert "gatekeeper_ledger_drain_lag_seconds" in exposed  # the scrape is the real one
    shown: set[str] = set()
    for query in panel_queries():
        named = metrics_named(query)
        assert named, query
        assert named <= exposed | PROMETHEUS_OWN, f"{query}: {named - exposed}"
        shown |= named
    for rule in alerts():
        named = metrics_named(rule["expr"])
        assert named and named <= exposed | PROMETHEUS_OWN, f"{rule['alert']}: {named - exposed}"
    # And the other way: every family /metrics writes has a panel.
    unshown = [name for name, series in families.items() if not series & shown]
    assert set(unshown) <= NO_PANEL, unshown
