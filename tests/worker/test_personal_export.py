"""A person's export over HTTP: data put in every place by the real parts (the gate, the ledger
drained, the suppression list, preferences, a quota reset, a scheduled send job with staged
recipients, a dead address, an SMS number, a study), read back whole for that person and none
of it for another; the preferences part put back as it came out; every user id column is some
place's."""

from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps

from limits.privacy.personal import places
from tests.support.api import call
from tests.support.personal import person_everywhere
from worker.gate import gate_check

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.now(UTC)


def export(session, user_id):
    response = call(session, "GET", f"/api/v1/users/{user_id}/export/")
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.postgres
def test_every_place_of_a_person_comes_out_and_nothing_of_anyone_else(api, snapshot):
    job = person_everywhere(api("gate"), 1, others=(2, 11), now=NOW)

    viewer = api("viewer")
    mine = export(viewer, 1)
    assert set(mine) == {"format", "user_id", "exported_at"} | {p.key for p in places()}
    assert (mine["format"], mine["user_id"], mine["segment"]["slug"]) == (1, 1, "vip")
    assert [(d["message_id"], d["reason"], d["outcome"]) for d in mine["decisions"]] == [
        ("promo:1", "allowed", "sent"),
        ("welcome:1", "allowed", None),
    ]
    # The reset forgot the log: nothing in Redis before it, the reset's record keeps the usage.
    assert mine["send_log"] == []
    assert [(r["reason"], r["usage"]["email"]["daily"]) for r in mine["quota_resets"]] == [
        ("support ticket 12", 1)
    ]
    assert [(r["channel"], r["reason"], r["note"]) for r in mine["suppression"]] == [
        ("sms", "complained", "asked")
    ]
    assert [(c["channel"], c["action"]) for c in mine["suppression_journal"]] == [
        ("push", "removed"),
        ("push", "added"),
        ("sms", "added"),
    ]
    assert mine["preferences"]["channels"] == {"push": False}
    assert mine["preference_journal"][0]["source"] == "api"
    assert mine["studies"] == [{"experiment": None, "arm": 1, "entered": "2026-11-20"}]
    assert mine["send_jobs"] == [
        {
            "job": job.pk,
            "campaign": "launch",
            "channel": "email",
            "job_status": "scheduled",
            "pending": True,
            "waiting_until": None,
            "address": "one@example.com",
            "message_id": "launch:1",
            "context": {"name": "Ana"},
            "time_zone": None,
        }
    ]
    assert [(d["address"], d["reason"]) for d in mine["dead_addresses"]] == [
        ("old@example.com", "550 gone")
    ]
    assert [n["number"] for n in mine["sms_numbers"]] == ["+15550100"]
    assert mine["reservations"] == []

    # After a send: its entry in the cap log, as hashes.
    gate_check(channel="email", requests=[(1, "again:1")], campaign="autumn", now=NOW)
    (entry,) = export(viewer, 1)["send_log"]
    assert (entry["channel"], entry["counted"], entry["campaign_hash"] is not None) == (
        "email",
        True,
        True,
    )

    theirs = export(viewer, 2)
    text = str(theirs)
    assert "one@example.com" not in text and "Ana" not in text and "+15550100" not in text
    assert [j["address"] for j in theirs["send_jobs"]] == ["u2@example.com"]
    assert theirs["preferences"] is None and theirs["studies"] == []
    # Ids that share digits with another's (1 and 11) are told apart.
    assert [j["address"] for j in export(viewer, 11)["send_jobs"]] == ["u11@example.com"]


@pytest.mark.postgres
def test_preferences_put_back_as_they_came_out_read_the_same(api, snapshot):
    s = api("gate")
    prefs = {
        "channels": {"email": True, "push": False},
        "paused_until": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
        "frequency": [{"channel": "push", "window": {"kind": "rolling", "seconds": 86400}, "limit": 1}],
    }  # fmt: skip
    assert call(s, "PUT", "/api/v1/users/5/preferences/", json=prefs).status_code == 200
    first = export(api("viewer"), 5)["preferences"]
    assert call(s, "PUT", "/api/v1/users/6/preferences/", json=first).status_code == 200
    assert export(api("viewer"), 6)["preferences"] == first


def test_an_export_is_refused_clearly(api, snapshot, settings):
    assert call(api("viewer"), "GET", "/api/v1/users/x1/export/").status_code == 400
    assert call(api("nobody"), "GET", "/api/v1/users/1/export/").status_code == 403
    assert call(api("anonymous"), "GET", "/api/v1/users/1/export/").status_code in (401, 403)
    nobody = export(api("viewer"), 424242)
    assert nobody["decisions"] == [] and nobody["send_jobs"] == []
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    down = call(api("viewer"), "GET", "/api/v1/users/1/export/")
    assert down.status_code == 503 and "Redis" in down.json()["detail"]


def test_every_user_id_column_is_some_places_and_the_schema_names_each_place(api):
    covered = {table for place in places() for table in place.tables}
    holding = {
        model
        for model in apps.get_models()
        if model._meta.app_label in ("segments", "limits", "worker")
        and any(f.name == "user_id" for f in model._meta.get_fields())
    }
    assert holding <= covered, sorted(m.__name__ for m in holding - covered)
    schema = call(api("anonymous"), "GET", "/api/schema/?format=json").json()
    answer = schema["paths"]["/api/v1/users/{user_id}/export/"]["get"]["responses"]["200"]
    ref = answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    properties = schema["components"]["schemas"][ref]["properties"]
    assert set(properties) == {"format", "user_id", "exported_at"} | {p.key for p in places()}
    assert all(properties[p.key].get("description") for p in places())
