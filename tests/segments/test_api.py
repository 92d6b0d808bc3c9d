"""Segments, their lists and snapshots over HTTP."""

import gzip
import time

import pytest

from limits.policy.selectors import policy_cache
from segments.index import refresh
from tests.support.api import call, zones_a_day_apart
from tests.support.clocks import instant
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)


def test_segments_crud_and_the_default_is_protected(api, snapshot):
    m = api("marketer")
    created = call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "New", "priority": 30}
    )
    assert created.status_code == 201
    again = call(
        m, "POST", "/api/v1/segments/", json={"slug": "new", "name": "Again", "priority": 31}
    )
    # A slug or priority taken by another segment conflicts with it: 409, naming the field.
    assert again.status_code == 409 and again.json()["field"] == "slug"
    taken = call(m, "PATCH", "/api/v1/segments/new/", json={"priority": 10})  # vip's
    assert taken.status_code == 409 and taken.json()["field"] == "priority"
    bad_priority = call(m, "PATCH", "/api/v1/segments/new/", json={"priority": "high"})
    assert bad_priority.status_code == 400 and "priority" in bad_priority.json()
    assert (
        call(m, "PATCH", "/api/v1/segments/new/", json={"name": "Newcomers"}).json()["name"]
        == "Newcomers"
    )
    assert call(m, "DELETE", "/api/v1/segments/new/").status_code == 204
    refused = call(m, "DELETE", "/api/v1/segments/default/")
    assert refused.status_code == 409 and "cannot be deleted" in refused.json()["detail"]


def test_a_pipeline_replaces_a_list_and_publishes_it(api, snapshot, settings):
    m = api("marketer")
    bad = call(m, "PUT", "/api/v1/segments/vip/users/", data=b"1\n2\nthree\n")
    assert bad.status_code == 400 and bad.json()["line"] == 3
    good = call(m, "PUT", "/api/v1/segments/vip/users/", data=gzip.compress(b"user_id\n5\n6\n6\n"))
    stored = good.json()
    assert (stored["status"], stored["users"], stored["lines"]) == ("ready", 2, 4)
    assert (stored["header_lines"], stored["repeated_ids"], stored["blank_lines"]) == (1, 1, 0)
    assert stored["uploaded_by"] == "marketer"  # the token's user, as the admin shows it
    settings.CELERY_TASK_ALWAYS_EAGER = True
    from gatekeeper.celery import app

    app.conf.task_always_eager = True
    try:
        started = call(m, "POST", "/api/v1/snapshots/")
    finally:
        app.conf.task_always_eager = False
    assert started.status_code == 202
    build = call(m, "GET", started.json()["url"].split(m.base_url)[1]).json()
    assert build["status"] == "succeeded" and build["progress"] == 100

    refresh()
    assert call(m, "GET", "/api/v1/segments/lookup/?user_id=5").json()["segment"] == "vip"
    versions = call(m, "GET", "/api/v1/snapshots/").json()
    assert versions["live_version"] == build["version"]
    back = call(m, "POST", f"/api/v1/snapshots/{snapshot}/activate/")
    assert back.json() == {"live_version": snapshot}
    assert call(m, "POST", "/api/v1/snapshots/nope/activate/").status_code == 404


def test_a_segments_time_zone_is_set_checked_and_decides_its_users_calendar_days(api, snapshot):
    m = api("marketer")
    created = call(
        m,
        "POST",
        "/api/v1/segments/",
        json={"slug": "tokyo", "name": "Tokyo", "priority": 40, "time_zone": "Asia/Tokyo"},
    )
    assert created.status_code == 201 and created.json()["time_zone"] == "Asia/Tokyo"
    plain = call(m, "POST", "/api/v1/segments/", json={"slug": "p", "name": "P", "priority": 41})
    assert plain.json()["time_zone"] == ""  # GATEKEEPER_DEFAULT_TIME_ZONE
    for body in ({"time_zone": "Asia/Tokio"}, {"time_zone": "/etc/localtime"}):
        refused = call(m, "PATCH", "/api/v1/segments/tokyo/", json=body)
        assert refused.status_code == 400
        assert refused.json()["time_zone"][0].startswith("Unknown time zone")
    refused = call(
        m,
        "POST",
        "/api/v1/segments/",
        json={"slug": "x", "name": "X", "priority": 42, "time_zone": "UTC+1"},
    )
    assert refused.status_code == 400 and "time_zone" in refused.json()
    assert call(m, "GET", "/api/v1/segments/tokyo/").json()["time_zone"] == "Asia/Tokyo"
    for cleared in ("", None):
        assert call(m, "PATCH", "/api/v1/segments/tokyo/", json={"time_zone": "Asia/Tokyo"})
        answer = call(m, "PATCH", "/api/v1/segments/tokyo/", json={"time_zone": cleared}).json()
        assert answer["time_zone"] == ""


def test_the_segments_zone_is_its_users_zone_when_a_send_names_none(api, snapshot):
    m = api("marketer")
    call(
        m,
        "POST",
        "/api/v1/rules/",
        json={
            "name": "1 push a day",
            "segment": "default",
            "channel": "push",
            "window": {"kind": "calendar", "unit": "day"},
            "limit": 1,
        },
    )
    earlier, later, recorded_at = zones_a_day_apart(time.time())
    (sent,) = gate_check(channel="push", requests=[(7, "earlier")], now=instant(recorded_at))
    assert sent.allowed
    body = {"channel": "push", "dry_run": True, "requests": [{"user_id": 7, "message_id": "x"}]}
    decisions = []
    for zone in (earlier, later):
        call(m, "PATCH", "/api/v1/segments/default/", json={"time_zone": zone})
        policy_cache().invalidate()  # as the cache's few seconds would, in every process
        decided = call(api("gate"), "POST", "/api/v1/gate/check/", json=body).json()
        decisions.append(decided["results"][0]["reason"])
    assert decisions == [
        "daily_cap",
        "allowed",
    ]  # today's send in one zone, yesterday's in the other
