"""Quiet hours over HTTP: created, read, changed and deleted through the services (one rule for
a valid entry, every change in the history), each bad field named, and the gate following
every change."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from limits.engine.quiet import user_offset
from limits.models.policy import QuietHours, SettingChange
from tests.support.api import call

pytestmark = pytest.mark.django_db(transaction=True)

NIGHT = {"segment": "vip", "channel": "email", "start": "21:00", "end": "08:00"}


def history(entry_id: int | None = None) -> list[tuple[str, str, str | None]]:
    changes = SettingChange.objects.filter(kind="quiet_hours").order_by("id")
    if entry_id is not None:
        changes = changes.filter(object_id=entry_id)
    return list(changes.values_list("action", "via", "by__username"))


def test_a_marketer_creates_reads_changes_and_deletes_quiet_hours_and_each_step_is_recorded(
    api, snapshot
):
    m = api("marketer")
    created = call(m, "POST", "/api/v1/quiet-hours/", json={**NIGHT, "spread_minutes": 30})
    assert created.status_code == 201, created.text
    entry = created.json()
    assert {k: entry[k] for k in NIGHT} == NIGHT
    assert (entry["spread_minutes"], entry["enabled"]) == (30, True)
    assert entry["description"] == (
        "VIP users: no marketing emails from 21:00 to 08:00 (the next morning), in their own "
        "time zone; sends held until then go out over 30 minutes"
    )
    assert entry["created_at"] and entry["changed_at"]
    stored = QuietHours.objects.get(pk=entry["id"])
    assert (f"{stored.start:%H:%M}", f"{stored.end:%H:%M}", stored.created_by.username) == (
        "21:00",
        "08:00",
        "marketer",
    )

    listed = call(api("viewer"), "GET", "/api/v1/quiet-hours/").json()
    assert listed == [entry]
    path = f"/api/v1/quiet-hours/{entry['id']}/"
    assert call(m, "GET", path).json() == entry

    changed = call(m, "PATCH", path, json={"end": "07:30", "channel": "all", "segment": None})
    assert changed.status_code == 200, changed.text
    assert {k: changed.json()[k] for k in ("segment", "channel", "start", "end")} == {
        "segment": None,
        "channel": "all",
        "start": "21:00",  # untouched fields stay
        "end": "07:30",
    }
    assert changed.json()["spread_minutes"] == 30
    assert changed.json()["description"] == (
        "Every user: no marketing messages from 21:00 to 07:30 (the next morning), in their own "
        "time zone; sends held until then go out over 30 minutes"
    )
    # A change that changes nothing is not recorded.
    assert call(m, "PATCH", path, json={"end": "07:30"}).status_code == 200

    assert call(m, "DELETE", path).status_code == 204
    assert call(m, "GET", path).status_code == 404
    assert call(m, "DELETE", path).status_code == 404
    assert not QuietHours.objects.exists()
    assert history() == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("deleted", "api", "marketer"),
    ]
    first, change, deleted = SettingChange.objects.filter(kind="quiet_hours").order_by("id")
    assert first.before is None and (first.after or {})["start"] == "21:00"
    before, after = change.before or {}, change.after or {}
    assert (before["end"], after["end"], before["segment"], after["segment"]) == (
        "08:00",
        "07:30",
        "vip",
        None,
    )
    assert (deleted.object_id, deleted.after, (deleted.before or {})["channel"]) == (
        (deleted.before or {})["id"],
        None,
        "all",
    )


def test_only_channel_start_and_end_are_required(api, snapshot):
    body = {"channel": "push", "start": "13:00", "end": "14:30"}
    entry = call(api("marketer"), "POST", "/api/v1/quiet-hours/", json=body).json()
    assert (entry["segment"], entry["spread_minutes"], entry["enabled"]) == (None, 0, True)
    assert entry["description"] == (
        "Every user: no marketing push messages from 13:00 to 14:30, in their own time zone; "
        "sends held until then go out at once"
    )


GOOD = {**NIGHT, "spread_minutes": 0, "enabled": True}
# Quiet from 08:00 to 21:00: the day outside them is 11 hours (660 minutes).
DAYTIME = {**GOOD, "start": "08:00", "end": "21:00"}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**GOOD, "segment": "nope"}, "segment", "No segment 'nope'. Known: "),
        ({**GOOD, "segment": "no pe"}, "segment", "slug"),
        ({**GOOD, "segment": ""}, "segment", "Must not be empty"),
        ({**GOOD, "segment": 5}, "segment", "Must be a string or null, not an integer"),
        ({**GOOD, "channel": "fax"}, "channel", "Unknown channel 'fax'. Choose one of: email"),
        ({**GOOD, "channel": None}, "channel", "Must be a string, not null"),
        ({k: v for k, v in GOOD.items() if k != "channel"}, "channel", "required"),
        ({k: v for k, v in GOOD.items() if k != "start"}, "start", "required"),
        ({k: v for k, v in GOOD.items() if k != "end"}, "end", "required"),
        ({**GOOD, "start": "25:00"}, "start", "'25:00' is not a time of day. A time of day as"),
        ({**GOOD, "start": "9:00"}, "start", "is not a time of day"),
        ({**GOOD, "start": "21:00\n"}, "start", "is not a time of day"),
        ({**GOOD, "start": "21:00:00"}, "start", "is not a time of day"),
        ({**GOOD, "start": "\u0662\u0661:\u0660\u0660"}, "start", "is not a time of day"),
        ({**GOOD, "end": "24:00"}, "end", "'24:00' is not a time of day"),
        ({**GOOD, "end": "08:60"}, "end", "is not a time of day"),
        ({**GOOD, "end": "x" * 5000}, "end", "'xxxxxxxxxxxxxxxxx...' is not a time of day"),
        ({**GOOD, "start": 2100}, "start", "Must be a string, not an integer"),
        ({**GOOD, "start": "21:00\u0000"}, "start", "NUL"),
        ({**GOOD, "end": "21:00"}, "end", "The end must differ from the start"),
        ({**GOOD, "spread_minutes": -1}, "spread_minutes", "From 0 to 720 minutes"),
        ({**GOOD, "spread_minutes": 721}, "spread_minutes", "From 0 to 720 minutes"),
        ({**GOOD, "spread_minutes": 2**70}, "spread_minutes", "From 0 to 720 minutes"),
        ({**GOOD, "spread_minutes": "30"}, "spread_minutes", "Must be an integer, not a string"),
        ({**GOOD, "spread_minutes": 30.5}, "spread_minutes", "Must be an integer"),
        ({**GOOD, "spread_minutes": True}, "spread_minutes", "Must be an integer"),
        (
            {**DAYTIME, "spread_minutes": 660},
            "spread_minutes",
            "the day outside them is 11 hours long. Use less than 660.",
        ),
        ({**GOOD, "enabled": "yes"}, "enabled", "Must be true or false, not a string"),
        ({**GOOD, "dry_run": True}, "dry_run", "Unknown field. Known fields: segment, channel"),
        ({**GOOD, "id": 7}, "id", "Unknown field"),
        ([GOOD], "non_field_errors", "The body must be a JSON object"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_field_and_nothing_is_stored(
    api, snapshot, body, field, words
):
    refused = call(api("marketer"), "POST", "/api/v1/quiet-hours/", json=body)
    assert refused.status_code == 400, refused.text
    assert field in refused.json(), refused.json()
    assert words in " ".join(refused.json()[field]), refused.json()
    assert (
        not QuietHours.objects.exists()
        and not SettingChange.objects.filter(kind="quiet_hours").exists()
    )


def test_every_field_in_error_is_named_at_once(api, snapshot):
    body = {"segment": "nope", "channel": "fax", "start": "25:00", "end": "8", "spread_minutes": 0}
    refused = call(api("marketer"), "POST", "/api/v1/quiet-hours/", json=body)
    assert refused.status_code == 400
    assert sorted(refused.json()) == ["channel", "end", "segment", "start"]


def test_a_spread_just_short_of_the_day_outside_is_taken(api, snapshot):
    created = call(
        api("marketer"), "POST", "/api/v1/quiet-hours/", json={**DAYTIME, "spread_minutes": 659}
    )
    assert created.status_code == 201, created.text
    assert created.json()["description"].endswith("go out over 10 hours 59 minutes")


def test_a_change_is_checked_against_the_whole_entry_and_a_refused_one_changes_nothing(
    api, snapshot
):
    m = api("marketer")
    entry = call(m, "POST", "/api/v1/quiet-hours/", json=DAYTIME).json()
    path = f"/api/v1/quiet-hours/{entry['id']}/"
    # Each is fine in itself, and wrong for this entry.
    for changes, field, words in (
        ({"start": "21:00"}, "end", "must differ from the start"),
        ({"spread_minutes": 700}, "spread_minutes", "Use less than 660"),
        ({"segment": "gone"}, "segment", "No segment 'gone'"),
        ({"end": "8:00"}, "end", "is not a time of day"),
        ({"spread_minutes": 30, "enabled": None}, "enabled", "Must be true or false, not null"),
        ({"window": "night"}, "window", "Unknown field"),
    ):
        refused = call(m, "PATCH", path, json=changes)
        assert refused.status_code == 400, (changes, refused.text)
        assert words in " ".join(refused.json()[field]), refused.json()
    assert call(m, "GET", path).json() == entry
    assert history(entry["id"]) == [("created", "api", "marketer")]
    # Moved together, the start and the spread fit again.
    moved = call(m, "PATCH", path, json={"start": "22:00", "end": "06:00", "spread_minutes": 700})
    assert moved.status_code == 200, moved.text
    assert (moved.json()["start"], moved.json()["end"]) == ("22:00", "06:00")
    for missing in (
        "/api/v1/quiet-hours/999999/",
        f"/api/v1/quiet-hours/{2**63}/",
        "/api/v1/quiet-hours/0/",
    ):
        assert call(m, "PATCH", missing, json={"enabled": False}).status_code == 404
        assert call(m, "GET", missing).status_code == 404
        assert call(m, "DELETE", missing).status_code == 404


def test_who_may_read_and_who_may_change_quiet_hours(api, snapshot):
    entry = call(api("marketer"), "POST", "/api/v1/quiet-hours/", json=NIGHT).json()
    path = f"/api/v1/quiet-hours/{entry['id']}/"
    assert call(api("anonymous"), "GET", "/api/v1/quiet-hours/").status_code == 401
    assert call(api("nobody"), "GET", "/api/v1/quiet-hours/").status_code == 403
    for reader in ("viewer", "gate"):
        s = api(reader)
        assert call(s, "GET", "/api/v1/quiet-hours/").json() == [entry]
        assert call(s, "GET", path).status_code == 200
        assert call(s, "POST", "/api/v1/quiet-hours/", json=NIGHT).status_code == 403
        refused = call(s, "PATCH", path, json={"enabled": False})
        assert refused.status_code == 403
        assert "limits.change_quiethours" in refused.json()["detail"]
        assert call(s, "DELETE", path).status_code == 403
    assert call(api("marketer"), "GET", path).json() == entry  # nothing changed
    assert history() == [("created", "api", "marketer")]


def test_the_gate_holds_sends_in_quiet_hours_made_over_rest_and_lets_them_go_when_disabled(
    api, snapshot
):
    # Quiet from an hour ago until an hour from now, in UTC (the request's zone).
    now = datetime.now(UTC)
    start, end = now - timedelta(hours=1), now + timedelta(hours=1)
    body = {
        "segment": None,
        "channel": "all",
        "start": f"{start:%H:%M}",
        "end": f"{end:%H:%M}",
        "spread_minutes": 10,
    }
    m, gate = api("marketer"), api("gate")
    entry = call(m, "POST", "/api/v1/quiet-hours/", json=body).json()
    check = {
        "channel": "email",
        "campaign": "night",
        "requests": [{"user_id": 1, "message_id": "night:1", "time_zone": "UTC"}],
    }
    asked = time.time()
    (held,) = call(gate, "POST", "/api/v1/gate/check/", json=check).json()["results"]
    assert (held["allowed"], held["reason"], held["rule"]) == (False, "quiet_hours", None)
    # The end of the window (a whole minute) plus user 1's own place in the 10 minutes.
    ends = end.replace(second=0, microsecond=0).timestamp() + user_offset(1, 600)
    assert ends - asked - 5 <= held["retry_after"] <= ends - asked + 1
    # Transactional sends are never held.
    receipt = {**check, "category": "transactional"}
    (exempt,) = call(gate, "POST", "/api/v1/gate/check/", json=receipt).json()["results"]
    assert exempt["reason"] == "exempt"

    path = f"/api/v1/quiet-hours/{entry['id']}/"
    assert call(m, "PATCH", path, json={"enabled": False}).status_code == 200
    (sent,) = call(gate, "POST", "/api/v1/gate/check/", json=check).json()["results"]
    assert (sent["allowed"], sent["reason"]) == (True, "allowed")
