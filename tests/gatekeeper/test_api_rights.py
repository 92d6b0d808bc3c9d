"""Every endpoint against every right: anonymous callers get 401; the permissions docs/api.md
names for an endpoint are enough, and each of them is needed (a user holding every other
permission there is still gets 403)."""

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from segments.models import Build, Segment
from tests.support.api import call, make_user, token_session

pytestmark = pytest.mark.django_db(transaction=True)

GATE_BODY = {"channel": "email", "requests": [{"user_id": 1, "message_id": "rights"}]}
RULE = {
    "name": "1 a day",
    "segment": None,
    "channel": "all",
    "window": {"kind": "rolling", "seconds": 86_400},
    "limit": 1,
}
QUIET = {"channel": "email", "start": "21:00", "end": "08:00"}
# (method, path, body, the permissions it needs). Bodies are chosen so that a caller with the
# right gets an answer without side effects beyond the test (a 400, a 404, a 409).
ENDPOINTS = [
    ("GET", "/api/v1/segments/", None, {"segments.view_segment"}),
    ("POST", "/api/v1/segments/", {}, {"segments.add_segment"}),
    ("GET", "/api/v1/segments/vip/", None, {"segments.view_segment"}),
    ("PATCH", "/api/v1/segments/vip/", {"priority": "x"}, {"segments.change_segment"}),
    (
        "DELETE",
        "/api/v1/segments/nope/",
        None,
        {
            "segments.delete_segment",
            "segments.delete_userlist",
            "limits.delete_cap",
            "limits.delete_rule",
            "limits.delete_quiethours",
        },
    ),
    (
        "PUT",
        "/api/v1/segments/nope/users/",
        b"1\n",
        {"segments.change_segment", "segments.add_userlist", "segments.delete_userlist"},
    ),
    (
        "GET",
        "/api/v1/segments/vip/users/",
        None,
        {"segments.view_segment", "segments.view_userlist"},
    ),
    ("GET", "/api/v1/segments/lookup/?user_id=1", None, {"segments.view_segment"}),
    ("POST", "/api/v1/segments/lookup/", {"user_ids": [1]}, {"segments.view_segment"}),
    ("GET", "/api/v1/limits/", None, {"limits.view_cap"}),
    ("PUT", "/api/v1/limits/vip/email/", {}, {"limits.add_cap", "limits.change_cap"}),
    ("GET", "/api/v1/rules/", None, {"limits.view_rule"}),
    ("POST", "/api/v1/rules/", {}, {"limits.add_rule"}),
    ("GET", "/api/v1/rules/999999/", None, {"limits.view_rule"}),
    ("PATCH", "/api/v1/rules/999999/", {"limit": 1}, {"limits.change_rule"}),
    ("DELETE", "/api/v1/rules/999999/", None, {"limits.delete_rule"}),
    ("GET", "/api/v1/quiet-hours/", None, {"limits.view_quiethours"}),
    ("POST", "/api/v1/quiet-hours/", {}, {"limits.add_quiethours"}),
    ("GET", "/api/v1/quiet-hours/999999/", None, {"limits.view_quiethours"}),
    ("PATCH", "/api/v1/quiet-hours/999999/", {"enabled": False}, {"limits.change_quiethours"}),
    ("DELETE", "/api/v1/quiet-hours/999999/", None, {"limits.delete_quiethours"}),
    ("GET", "/api/v1/topics/", None, {"limits.view_topic"}),
    ("POST", "/api/v1/topics/", {}, {"limits.add_topic"}),
    ("GET", "/api/v1/topics/nope/", None, {"limits.view_topic"}),
    ("PATCH", "/api/v1/topics/nope/", {"name": "N"}, {"limits.change_topic"}),
    ("DELETE", "/api/v1/topics/nope/", None, {"limits.delete_topic"}),
    ("GET", "/api/v1/suppressions/", None, {"limits.view_suppression"}),
    ("POST", "/api/v1/suppressions/", {}, {"limits.add_suppression"}),
    ("POST", "/api/v1/suppressions/remove/", {}, {"limits.delete_suppression"}),
    ("GET", "/api/v1/suppressions/email/1/", None, {"limits.view_suppression"}),
    ("DELETE", "/api/v1/suppressions/email/999999/", None, {"limits.delete_suppression"}),
    ("PUT", "/api/v1/suppressions/email/import/", b"x\n", {"limits.add_suppression"}),
    ("PUT", "/api/v1/preferences/import/", b"x\n", {"limits.change_preference"}),
    ("GET", "/api/v1/holdout/", None, {"limits.view_holdout"}),
    ("PUT", "/api/v1/holdout/", {"share": 5}, {"limits.change_holdout"}),
    ("POST", "/api/v1/gate/check/", {**GATE_BODY, "dry_run": True}, {"limits.use_gate"}),
    ("POST", "/api/v1/gate/release/", GATE_BODY, {"limits.use_gate"}),
    ("GET", "/api/v1/users/1/quota/", None, {"limits.view_cap"}),
    ("GET", "/api/v1/users/1/history/", None, {"limits.view_cap"}),
    ("POST", "/api/v1/users/erase/", {"user_ids": [424242]}, {"limits.erase_users"}),
    ("GET", "/api/v1/erasures/1/", None, {"limits.view_erasure"}),
    ("GET", "/api/v1/stream/", None, {"limits.read_stream"}),
    ("GET", "/api/v1/webhooks/", None, {"limits.view_webhookendpoint"}),
    ("POST", "/api/v1/webhooks/", {"url": 1}, {"limits.add_webhookendpoint"}),
    ("GET", "/api/v1/webhooks/999999/", None, {"limits.view_webhookendpoint"}),
    ("PATCH", "/api/v1/webhooks/999999/", {"url": 1}, {"limits.change_webhookendpoint"}),
    ("DELETE", "/api/v1/webhooks/999999/", None, {"limits.delete_webhookendpoint"}),
    (
        "GET",
        "/api/v1/users/1/export/",
        None,
        {
            "limits.view_cap",
            "limits.view_suppression",
            "limits.view_preference",
            "worker.view_sendjob",
        },
    ),
    ("GET", "/api/v1/users/1/preferences/", None, {"limits.view_preference"}),
    ("PUT", "/api/v1/users/1/preferences/", {"colour": 1}, {"limits.change_preference"}),
    ("PATCH", "/api/v1/users/1/preferences/", {"colour": 1}, {"limits.change_preference"}),
    ("GET", "/api/v1/snapshots/", None, {"segments.view_build"}),
    ("POST", "/api/v1/snapshots/", None, {"segments.publish_snapshot"}),
    ("POST", "/api/v1/snapshots/nope/activate/", None, {"segments.publish_snapshot"}),
    ("GET", "/api/v1/builds/1/", None, {"segments.view_build"}),
    ("GET", "/api/v1/reports/decisions/", None, {"segments.view_segment"}),
    ("POST", "/api/v1/sends/", {}, {"limits.use_gate"}),
    ("GET", "/api/v1/sends/1/", None, {"worker.view_sendjob"}),
    ("DELETE", "/api/v1/sends/999999/waiting/", None, {"worker.cancel_sendjob"}),
    ("GET", "/api/v1/rounds/", None, {"worker.view_sendjob"}),
    ("POST", "/api/v1/rounds/", {}, {"limits.use_gate"}),
    ("GET", "/api/v1/rounds/999999/", None, {"worker.view_sendjob"}),
    ("PATCH", "/api/v1/rounds/999999/", {"name": "x"}, {"limits.use_gate"}),
    ("POST", "/api/v1/rounds/999999/cancel/", {"jobs": "wait"}, {"limits.use_gate"}),
    ("GET", "/api/v1/mailbox-providers/", None, {"worker.view_mailboxprovider"}),
    ("POST", "/api/v1/mailbox-providers/", {}, {"worker.add_mailboxprovider"}),
    ("GET", "/api/v1/mailbox-providers/nope/", None, {"worker.view_mailboxprovider"}),
    (
        "PATCH",
        "/api/v1/mailbox-providers/nope/",
        {"name": "N"},
        {"worker.change_mailboxprovider"},
    ),
    ("DELETE", "/api/v1/mailbox-providers/nope/", None, {"worker.delete_mailboxprovider"}),
    ("POST", "/api/v1/mailbox-providers/nope/resume/", None, {"worker.change_mailboxprovider"}),
    ("GET", "/api/v1/warmups/", None, {"worker.view_warmupplan"}),
    ("POST", "/api/v1/warmups/", {}, {"worker.add_warmupplan"}),
    ("GET", "/api/v1/warmups/999999/", None, {"worker.view_warmupplan"}),
    ("PATCH", "/api/v1/warmups/999999/", {"time_zone": "UTC"}, {"worker.change_warmupplan"}),
    ("DELETE", "/api/v1/warmups/999999/", None, {"worker.delete_warmupplan"}),
]


def send(session, method, path, body):
    if isinstance(body, bytes):
        return call(session, method, path, data=body)
    return call(session, method, path, json=body)


def every_permission() -> set[str]:
    return {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.select_related("content_type")
    }


# The endpoints are shared among a few parts of the test, which the test processes run side by
# side (each builds a user per right, of every permission but one).
PARTS = 3


@pytest.mark.parametrize("part", range(PARTS), ids=[f"part{n + 1}of{PARTS}" for n in range(PARTS)])
def test_every_endpoint_needs_exactly_its_documented_rights(part, live_server, snapshot):
    # A build in progress makes "start a build" answer 409 instead of queueing one.
    Build.objects.create(status=Build.Status.RUNNING, heartbeat_at=timezone.now())
    assert Segment.objects.filter(slug="vip").exists()
    everything = every_permission()
    for n, (method, path, body, needed) in list(enumerate(ENDPOINTS))[part::PARTS]:
        anonymous = send(token_session(live_server.url, None), method, path, body)
        exact = make_user(f"exact{n}", *needed)
        allowed = send(token_session(live_server.url, exact), method, path, body)
        assert anonymous.status_code == 401, (method, path)
        assert allowed.status_code not in (401, 403), (method, path, allowed.text)
        for missing in sorted(needed):
            almost = make_user(f"all-but-{missing}-{n}", *(everything - {missing}))
            refused = send(token_session(live_server.url, almost), method, path, body)
            assert refused.status_code == 403, (method, path, missing, refused.status_code)
            assert missing in refused.json()["detail"]  # the refusal names what is missing


def test_the_groups_and_the_campaign_system_account_have_the_rights_their_work_needs(api, snapshot):
    viewer, gate, marketer = api("viewer"), api("gate"), api("marketer")
    for path in (
        "/api/v1/segments/",
        "/api/v1/limits/",
        "/api/v1/rules/",
        "/api/v1/quiet-hours/",
        "/api/v1/snapshots/",
    ):
        assert call(viewer, "GET", path).status_code == 200
    assert call(viewer, "POST", "/api/v1/rules/", json=RULE).status_code == 403
    assert call(viewer, "POST", "/api/v1/quiet-hours/", json=QUIET).status_code == 403
    assert call(viewer, "POST", "/api/v1/gate/check/", json=GATE_BODY).status_code == 403
    assert call(viewer, "PUT", "/api/v1/limits/vip/email/", json={}).status_code == 403
    assert call(gate, "POST", "/api/v1/gate/check/", json=GATE_BODY).status_code == 200
    assert call(gate, "GET", "/api/v1/users/1/quota/").status_code == 200
    # A refusal names its rule: the campaign system may read the rules, not change them.
    assert call(gate, "GET", "/api/v1/rules/").status_code == 200
    assert call(gate, "POST", "/api/v1/rules/", json=RULE).status_code == 403
    # A refusal for quiet hours: it may read them too, not change them.
    assert call(gate, "GET", "/api/v1/quiet-hours/").status_code == 200
    assert call(gate, "POST", "/api/v1/quiet-hours/", json=QUIET).status_code == 403
    assert call(gate, "POST", "/api/v1/segments/", json={}).status_code == 403
    assert call(gate, "POST", "/api/v1/snapshots/").status_code == 403
    # A marketer edits and publishes, as in the admin, but does not call the gate.
    cap = {"daily": 1, "weekly": None}
    assert call(marketer, "PUT", "/api/v1/limits/vip/email/", json=cap).status_code == 200
    rule = call(marketer, "POST", "/api/v1/rules/", json=RULE)
    assert rule.status_code == 201
    path = f"/api/v1/rules/{rule.json()['id']}/"
    assert call(marketer, "PATCH", path, json={"limit": 2}).status_code == 200
    assert call(marketer, "DELETE", path).status_code == 204
    quiet = call(marketer, "POST", "/api/v1/quiet-hours/", json=QUIET)
    assert quiet.status_code == 201
    path = f"/api/v1/quiet-hours/{quiet.json()['id']}/"
    assert call(marketer, "PATCH", path, json={"spread_minutes": 30}).status_code == 200
    assert call(marketer, "DELETE", path).status_code == 204
    assert call(marketer, "POST", "/api/v1/gate/check/", json=GATE_BODY).status_code == 403
    # Deliverability: a viewer reads the mailbox providers and warm-up plans, a marketer keeps
    # them (and resumes a braked group), the campaign system's account does neither.
    assert call(viewer, "GET", "/api/v1/mailbox-providers/").status_code == 200
    assert call(viewer, "GET", "/api/v1/warmups/").status_code == 200
    plan = {"domain": "mail.example.com", "volumes": {}}
    assert call(viewer, "POST", "/api/v1/warmups/", json=plan).status_code == 403
    assert call(marketer, "POST", "/api/v1/warmups/", json=plan).status_code == 400
    assert call(gate, "GET", "/api/v1/mailbox-providers/").status_code == 403
