"""The API as an integrator sees it: a Python client generated from the schema the live server
serves (openapi-python-client, as a campaign team would run it), driving the main calls."""

import gzip
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from tests.support import broker

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
OPERATIONS = {
    "build_get", "build_start", "cap_set", "caps_list", "gate_check", "gate_release",
    "quiet_hours_change", "quiet_hours_create", "quiet_hours_delete", "quiet_hours_get",
    "quiet_hours_list",
    "rule_change", "rule_create", "rule_delete", "rule_get", "rules_list",
    "segment_change", "segment_create", "segment_delete", "segment_get", "segment_lookup",
    "segment_lookup_many", "segments_list", "send_job_create", "send_job_get",
    "snapshot_activate", "snapshots_list", "user_list_replace", "user_lists_get", "user_quota",
}  # fmt: skip


@pytest.fixture
def client_package(live_server, tmp_path, monkeypatch):
    """The generated package, importable as `gk_client`."""
    schema = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30).json()
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    (tmp_path / "config.yaml").write_text("post_hooks: []\npackage_name_override: gk_client\n")
    command = [
        str(Path(sys.executable).parent / "openapi-python-client"), "generate",
        "--path", str(tmp_path / "schema.json"), "--config", str(tmp_path / "config.yaml"),
        "--output-path", str(tmp_path / "client"),
    ]  # fmt: skip
    generated = subprocess.run(command, capture_output=True, text=True)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    monkeypatch.syspath_prepend(str(tmp_path / "client"))
    for name in [m for m in sys.modules if m == "gk_client" or m.startswith("gk_client.")]:
        del sys.modules[name]
    package = importlib.import_module("gk_client")
    modules = {
        path.stem for path in (tmp_path / "client" / "gk_client" / "api" / "v1").glob("*.py")
    }
    assert modules >= OPERATIONS, OPERATIONS - modules  # every call, the upload included
    return package


def test_a_generated_client_drives_the_main_calls(live_server, snapshot, client_package):
    from gk_client import AuthenticatedClient
    from gk_client.api.v1 import (
        build_start,
        cap_set,
        gate_check,
        gate_release,
        segment_change,
        segment_create,
        segment_lookup_many,
        segments_list,
        send_job_create,
        send_job_get,
        user_list_replace,
        user_lists_get,
        user_quota,
    )
    from gk_client.models import (
        CapBody,
        ChannelEnum,
        GateCheckBody,
        GateReleaseBody,
        GateRequest,
        LookupBody,
        RecipientBody,
        SegmentChangeBody,
        SegmentCreateBody,
        SendJobBody,
        SendJobStatusEnum,
        TemplateEnum,
    )
    from gk_client.types import File

    admin = User.objects.create_superuser("integrator", "i@example.com", "pw")
    token = Token.objects.create(user=admin).key
    client = AuthenticatedClient(base_url=live_server.url, token=token, prefix="Token")

    created = segment_create.sync(
        client=client, body=SegmentCreateBody(slug="new", name="Newcomers", priority=30)
    )
    assert created.slug == "new" and created.is_default is False
    changed = segment_change.sync("new", client=client, body=SegmentChangeBody(name="New ones"))
    assert changed.name == "New ones"
    assert [s.slug for s in segments_list.sync(client=client)] == ["vip", "new", "default"]
    stored = user_list_replace.sync(
        "new", client=client, body=File(payload=gzip.compress(b"user_id\n5\n6\n"))
    )
    assert (stored.status.value, stored.users) == ("ready", 2)
    assert [entry.users for entry in user_lists_get.sync("new", client=client).results] == [2]
    broker.clear("builds")
    started = build_start.sync(client=client)
    assert started.status.value == "queued"

    cap = cap_set.sync("vip", "email", client=client, body=CapBody(daily=1, weekly=None))
    assert (cap.daily, cap.weekly) == (1, None)
    looked = segment_lookup_many.sync(client=client, body=LookupBody(user_ids=[1, "2", 9]))
    assert [r.segment for r in looked.results] == ["vip", "vip", "default"]

    requests_ = [GateRequest(user_id=1, message_id="a"), GateRequest(user_id=1, message_id="b")]
    decided = gate_check.sync(
        client=client, body=GateCheckBody(channel=ChannelEnum.EMAIL, requests=requests_)
    )
    assert [d.reason.value for d in decided.results] == ["allowed", "daily_cap"]
    assert decided.results[0].counts.daily == 1 and decided.results[1].limits.daily == 1
    released = gate_release.sync(
        client=client, body=GateReleaseBody(channel=ChannelEnum.EMAIL, requests=requests_[:1])
    )
    assert [r.released for r in released.results] == [True]
    quota = user_quota.sync(1, client=client)
    assert quota.segment == "vip" and quota.scopes["email"].daily.used == 0

    job = send_job_create.sync(
        client=client,
        body=SendJobBody(
            channel=ChannelEnum.EMAIL,
            campaign="spring",
            template=TemplateEnum.WELCOME,
            recipients=[RecipientBody(user_id=7, address="seven@example.com")],
        ),
    )
    assert job.status == SendJobStatusEnum.QUEUED and job.pending == 1
    followed = send_job_get.sync(job.id, client=client)
    assert followed.total == 1
    refused = segment_create.sync_detailed(
        client=client, body=SegmentCreateBody(slug="new", name="Again", priority=31)
    )
    assert refused.status_code == 409 and refused.parsed.field == "slug"


def test_a_generated_client_manages_rules_and_reads_their_decisions(
    live_server, snapshot, client_package
):
    from gk_client import AuthenticatedClient
    from gk_client.api.v1 import (
        gate_check,
        rule_change,
        rule_create,
        rule_delete,
        rule_get,
        rules_list,
        user_quota,
    )
    from gk_client.models import (
        CalendarWindow,
        CalendarWindowKindEnum,
        ChannelEnum,
        GateCheckBody,
        GateRequest,
        MatchEnum,
        Reserve,
        RollingWindow,
        RollingWindowKindEnum,
        RuleChangeBody,
        RuleCreateBody,
        ScopeEnum,
        UnitEnum,
    )

    admin = User.objects.create_superuser("integrator", "i@example.com", "pw")
    token = Token.objects.create(user=admin).key
    client = AuthenticatedClient(base_url=live_server.url, token=token, prefix="Token")

    created = rule_create.sync(
        client=client,
        body=RuleCreateBody(
            name="1 promo a day",
            segment=None,
            channel=ScopeEnum.PUSH,
            match=MatchEnum.TAG,
            tag="promo",
            window=CalendarWindow(kind=CalendarWindowKindEnum.CALENDAR, unit=UnitEnum.DAY),
            limit=2,
            reserve=Reserve(below_priority=7, slots=1),
        ),
    )
    assert isinstance(created.window, CalendarWindow) and created.reserve.slots == 1
    assert created.findings == [] and created.classic is False
    classic = [rule for rule in rules_list.sync(client=client) if rule.classic]
    assert {rule.window.seconds for rule in classic} == {86_400, 604_800}

    requests_ = [
        GateRequest(user_id=7, message_id="a", time_zone="Asia/Tokyo"),
        GateRequest(user_id=7, message_id="b", time_zone="Asia/Tokyo"),
    ]
    decided = gate_check.sync(
        client=client,
        body=GateCheckBody(
            channel=ChannelEnum.PUSH, tags=["promo"], priority=3, requests=requests_
        ),
    )
    allowed, refused = decided.results
    assert (allowed.reason.value, allowed.rule, allowed.reserved) == ("allowed", None, None)
    assert (refused.reason.value, refused.reserved) == ("daily_cap", 1)
    assert (refused.rule.id, refused.rule.name, refused.rule.used) == (
        created.id,
        "1 promo a day",
        1,
    )
    assert refused.rule.window.unit == UnitEnum.DAY

    quota = user_quota.sync(7, client=client, time_zone="Asia/Tokyo", window="1h")
    assert quota.time_zone == "Asia/Tokyo" and quota.sent["push"] == 1
    figures = next(rule for rule in quota.rules if rule.id == created.id)
    assert (figures.used, figures.remaining) == (1, 1)

    changed = rule_change.sync(
        created.id,
        client=client,
        body=RuleChangeBody(
            window=RollingWindow(kind=RollingWindowKindEnum.ROLLING, seconds=14_400), reserve=None
        ),
    )
    assert changed.window.seconds == 14_400 and changed.reserve is None
    refused_change = rule_change.sync_detailed(
        created.id, client=client, body=RuleChangeBody(limit=-1)
    )
    assert (
        refused_change.status_code == 400 and "limit" in refused_change.parsed.additional_properties
    )
    assert rule_delete.sync_detailed(created.id, client=client).status_code == 204
    assert rule_get.sync_detailed(created.id, client=client).status_code == 404
    conflict = rule_delete.sync_detailed(classic[0].id, client=client)
    assert conflict.status_code == 409 and "PUT /api/v1/limits/" in conflict.parsed.detail
