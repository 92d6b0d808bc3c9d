"""Real answers against the schema the live server serves: every JSON body a call gets back is
validated, as a client that validates answers would, against the response the served document
declares for that path, method and status (OpenAPI 3.0.3 semantics: `nullable` adds null to the
`type` beside it and to nothing else). The bodies these tests send for a 2xx are validated
against the declared request bodies too."""

import gzip
import re
from typing import Any

import pytest
import requests
from openapi_schema_validator import (
    OAS30ReadValidator,
    OAS30WriteValidator,
    oas30_format_checker,
)

from limits.ledger.drain import ledger_drain_all
from segments.models import Build
from segments.store import snapshot_key, store_from_settings
from tests.support.api import call, check_body
from tests.support.mailboxes import default_groups, waiting_chunk
from tests.support.stores import delete_object
from worker.delivery.mailbox_settings import mailbox_pause
from worker.models import MailboxProvider

pytestmark = pytest.mark.django_db(transaction=True)

JSON = "application/json"
PROMO = {
    "name": "1 promo a day",
    "segment": "vip",
    "channel": "email",
    "match": "tag",
    "tag": "promo",
    "window": {"kind": "calendar", "unit": "day"},
    "limit": 3,
    "reserve": {"below_priority": 7, "slots": 1},
}


class Answers:
    """Calls the API and checks each answer (and each JSON body sent) against the served
    schema; `seen` keeps every (method, path, status) checked."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.seen: set[tuple[str, str, int]] = set()
        self._templates = [
            (re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"), path)
            for path in document["paths"]
        ]

    def template(self, path: str) -> str:
        bare = path.split("?")[0]
        found = [template for pattern, template in self._templates if pattern.match(bare)]
        assert found, f"{bare} is in no path of the schema"
        # The most literal one: `suppressions/{channel}/import/`, not `.../{user_id}/`.
        return min(found, key=lambda template: template.count("{"))

    def _errors(self, validator_class: Any, schema: dict[str, Any], value: Any) -> list[str]:
        # The declared schema with the document's components beside it, so that its
        # `#/components/schemas/...` references resolve.
        validator = validator_class(
            {**schema, "components": self.document["components"]},
            format_checker=oas30_format_checker,
        )
        return sorted(
            f"{'/'.join(str(p) for p in error.absolute_path) or '(body)'}: {error.message}"
            for error in validator.iter_errors(value)
        )

    def __call__(
        self, session: requests.Session, method: str, path: str, expect: int, **kwargs: Any
    ) -> Any:
        template = self.template(path)
        operation = self.document["paths"][template][method.lower()]
        if "json" in kwargs and expect < 400:  # (bodies meant to be refused are not checked)
            declared = operation["requestBody"]["content"]["application/json"]["schema"]
            sent = self._errors(OAS30WriteValidator, declared, kwargs["json"])
            assert not sent, f"{method} {template}: the body sent is not the declared one: {sent}"
        response = call(session, method, path, **kwargs)
        assert response.status_code == expect, (method, path, response.status_code, response.text)
        self.seen.add((method, template, response.status_code))
        answer = operation["responses"].get(str(response.status_code))
        assert answer is not None, f"{method} {template}: {response.status_code} is undocumented"
        if response.status_code == 204:
            assert not response.content
            return None
        assert response.headers["Content-Type"].startswith("application/json"), response.headers
        body = response.json()
        schema = answer["content"]["application/json"]["schema"]
        errors = self._errors(OAS30ReadValidator, schema, body)
        assert not errors, (
            f"{method} {path} ({response.status_code}) does not match the schema: {errors}"
        )
        return body


@pytest.fixture
def answers(live_server) -> Answers:
    document = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30).json()
    assert document["openapi"] == "3.0.3"
    return Answers(document)


def test_gate_decisions_with_and_without_their_rule(api, snapshot, answers):
    g = api("gate")
    # vip: 2 email a day. The third is refused by the classic daily cap's rule: `rule` is an
    # object; the first two are allowed: `rule` is null.
    decided = answers(
        g, "POST", "/api/v1/gate/check/", 200, json=check_body([(1, "a"), (1, "b"), (1, "c")])
    )["results"]
    assert [d["rule"] is None for d in decided] == [True, True, False]
    assert decided[2]["reason"] == "daily_cap" and decided[2]["rule"]["limit"] == 2
    released = answers(
        g,
        "POST",
        "/api/v1/gate/release/",
        200,
        json={"channel": "email", "requests": [{"user_id": 1, "message_id": "a"}]},
    )
    assert released["results"][0]["released"] is True
    answers(g, "POST", "/api/v1/gate/check/", 400, json={"channel": "email", "requests": []})
    bad = call(g, "POST", "/api/v1/gate/check/", data=b"{", headers={"Content-Type": "x/y"})
    assert bad.status_code == 415  # not JSON: no body of the schema's to check


def test_rules_with_and_without_a_reserve_and_the_quota_that_shows_them(api, snapshot, answers):
    m, v = api("marketer"), api("viewer")
    kept = answers(m, "POST", "/api/v1/rules/", 201, json=PROMO)
    assert kept["reserve"] == {"below_priority": 7, "slots": 1}
    plain = answers(m, "POST", "/api/v1/rules/", 201, json={**PROMO, "reserve": None, "tag": "x"})
    assert plain["reserve"] is None
    rules = answers(v, "GET", "/api/v1/rules/", 200)
    assert {r["id"]: r["reserve"] is None for r in rules if not r["classic"]} == {
        kept["id"]: False,
        plain["id"]: True,
    }
    answers(v, "GET", f"/api/v1/rules/{kept['id']}/", 200)
    answers(m, "PATCH", f"/api/v1/rules/{plain['id']}/", 200, json={"reserve": None, "limit": 4})
    answers(m, "PATCH", f"/api/v1/rules/{plain['id']}/", 400, json={"window": {"kind": "x"}})
    classic = next(r for r in rules if r["classic"])
    answers(m, "PATCH", f"/api/v1/rules/{classic['id']}/", 409, json={"limit": 9})
    answers(m, "GET", "/api/v1/rules/999999/", 404)

    quota = answers(v, "GET", "/api/v1/users/1/quota/?window=2h&campaign=spring", 200)
    shown = {r["id"]: r["reserve"] for r in quota["rules"]}
    assert shown[kept["id"]] == {"below_priority": 7, "slots": 1}
    assert shown[classic["id"]] is None
    answers(v, "GET", "/api/v1/users/1/quota/?window=1s", 400)

    answers(m, "DELETE", f"/api/v1/rules/{plain['id']}/", 204)
    answers(v, "GET", "/api/v1/limits/", 200)
    answers(m, "PUT", "/api/v1/limits/vip/push/", 200, json={"daily": 4, "weekly": None})
    answers(m, "PUT", "/api/v1/limits/gold/push/", 404, json={"daily": 4, "weekly": None})


@pytest.mark.postgres
def test_a_users_history_with_and_without_the_deciding_rule(api, snapshot, answers):
    g = api("gate")
    answers(g, "POST", "/api/v1/gate/check/", 200, json=check_body([(2, "a"), (2, "b"), (2, "c")]))
    ledger_drain_all()
    page = answers(api("viewer"), "GET", "/api/v1/users/2/history/?limit=2", 200)
    assert [d["rule"] is None for d in page["results"]] == [False, True]
    assert page["next"] is not None
    answers(api("viewer"), "GET", page["next"].removeprefix(g.base_url), 200)
    answers(api("viewer"), "GET", "/api/v1/users/2/history/?limit=0", 400)


def test_segments_lists_lookups_builds_and_snapshots(api, snapshot, answers, settings):
    m, v = api("marketer"), api("viewer")
    answers(v, "GET", "/api/v1/segments/", 200)
    created = answers(
        m, "POST", "/api/v1/segments/", 201, json={"slug": "gold", "name": "Gold", "priority": 5}
    )
    assert created["slug"] == "gold"
    answers(m, "POST", "/api/v1/segments/", 409, json={"slug": "gold", "name": "G", "priority": 6})
    answers(m, "POST", "/api/v1/segments/", 400, json={"slug": "x", "name": 0, "priority": 6})
    answers(v, "GET", "/api/v1/segments/gold/", 200)
    answers(m, "PATCH", "/api/v1/segments/gold/", 200, json={"time_zone": "Europe/Berlin"})
    answers(v, "GET", "/api/v1/segments/nope/", 404)
    answers(m, "PUT", "/api/v1/segments/gold/users/", 200, data=gzip.compress(b"7\n8\n"))
    answers(m, "PUT", "/api/v1/segments/gold/users/", 400, data=b"7\nseven\n")
    answers(v, "GET", "/api/v1/segments/gold/users/", 200)
    answers(v, "GET", "/api/v1/segments/lookup/?user_id=1", 200)
    answers(v, "GET", "/api/v1/segments/lookup/?user_id=x", 400)
    answers(v, "POST", "/api/v1/segments/lookup/", 200, json={"user_ids": [1, "2", 3]})
    answers(m, "DELETE", "/api/v1/segments/default/", 409)

    versions = answers(v, "GET", "/api/v1/snapshots/", 200)
    assert versions["live_version"] == snapshot
    built = Build.objects.get(version=snapshot)
    finished = answers(v, "GET", f"/api/v1/builds/{built.pk}/", 200)
    assert finished["stats"]["vip"]["cardinality"] == 2
    answers(v, "GET", "/api/v1/builds/999999/", 404)
    from tests.support import broker

    broker.clear("builds")
    started = answers(m, "POST", "/api/v1/snapshots/", 202)
    answers(v, "GET", started["url"].removeprefix(m.base_url), 200)  # queued: no stats yet
    answers(m, "POST", "/api/v1/snapshots/", 409)
    Build.objects.filter(pk=started["id"]).delete()
    answers(m, "POST", f"/api/v1/snapshots/{snapshot}/activate/", 200)
    answers(m, "POST", "/api/v1/snapshots/nope/activate/", 404)
    delete_object(store_from_settings(), snapshot_key(snapshot, "vip.roaring"))
    incomplete = answers(m, "POST", f"/api/v1/snapshots/{snapshot}/activate/", 400)
    assert "is incomplete" in incomplete["detail"]
    answers(m, "DELETE", "/api/v1/segments/gold/", 204)


def test_send_jobs(api, snapshot, answers):
    from tests.support import broker

    broker.clear("sends")
    g = api("gate")
    body = {
        "channel": "email",
        "campaign": "spring",
        "template": "welcome",
        "tags": ["promo"],
        "on_capped": "defer",
        "recipients": [
            {"user_id": 1, "address": "a@example.com"},
            {"user_id": 7, "address": "b@example.com", "context": {"name": "B"}},
        ],
    }
    job = answers(g, "POST", "/api/v1/sends/", 202, json=body)
    answers(g, "POST", "/api/v1/sends/", 400, json={**body, "recipients": [{"user_id": 1}]})
    path = f"/api/v1/sends/{job['id']}/"
    answers(g, "GET", path, 200)
    answers(g, "POST", path + "pause/", 200)
    answers(g, "POST", path + "resume/", 200)
    answers(g, "DELETE", path + "waiting/", 200)
    answers(g, "POST", path + "cancel/", 200)
    answers(g, "POST", path + "pause/", 409)
    answers(g, "GET", "/api/v1/sends/999999/", 404)


def test_rounds(api, snapshot, answers):
    from datetime import timedelta

    from django.utils import timezone

    g = api("gate")
    closes = (timezone.now() + timedelta(hours=2)).isoformat()
    made = answers(
        g,
        "POST",
        "/api/v1/rounds/",
        201,
        json={"name": "Friday", "channel": "all", "closes_at": closes},
    )
    path = f"/api/v1/rounds/{made['id']}/"
    body = {
        "channel": "email",
        "campaign": "friday",
        "template": "welcome",
        "round": made["id"],
        "recipients": [
            {"user_id": 1, "address": "a@example.com", "value": 2},
            {"user_id": 7, "address": "b@example.com", "value": 0.5},
        ],
    }
    job = answers(g, "POST", "/api/v1/sends/", 202, json=body)
    answers(g, "PATCH", f"/api/v1/sends/{job['id']}/", 200, json={"value": 3})
    answers(g, "POST", f"/api/v1/sends/{job['id']}/start/", 409)
    answers(g, "GET", "/api/v1/rounds/", 200)
    answers(g, "GET", path, 200)
    answers(g, "PATCH", path, 200, json={"name": "Friday deals"})
    answers(g, "PATCH", path, 400, json={"send_at": "2000-01-01T00:00:00Z"})
    answers(g, "POST", path + "cancel/", 200, json={"jobs": "wait"})
    answers(g, "POST", path + "cancel/", 409, json={"jobs": "wait"})
    answers(g, "GET", "/api/v1/rounds/999999/", 404)


@pytest.mark.postgres
def test_suppressions_and_reports(api, snapshot, answers):
    g, m, v = api("gate"), api("marketer"), api("viewer")
    answers(g, "POST", "/api/v1/suppressions/", 200, json={"channel": "email", "user_ids": [1, 2]})
    answers(g, "POST", "/api/v1/suppressions/", 400, json={"channel": "fax", "user_ids": [1]})
    listed = answers(g, "GET", "/api/v1/suppressions/?limit=1", 200)
    assert listed["next"] is not None
    answers(g, "GET", listed["next"].removeprefix(g.base_url), 200)
    answers(g, "GET", "/api/v1/suppressions/email/1/", 200)
    answers(g, "GET", "/api/v1/suppressions/push/1/", 404)
    answers(g, "DELETE", "/api/v1/suppressions/email/1/", 204)
    answers(
        g, "POST", "/api/v1/suppressions/remove/", 200, json={"channel": "email", "user_ids": [2]}
    )
    answers(m, "PUT", "/api/v1/suppressions/email/import/?reason=bounced", 200, data=b"5\n6\n")
    answers(m, "PUT", "/api/v1/suppressions/email/import/", 400, data=b"5\nfive\n")

    # A refusal for the suppression list, drained into the ledger's counts.
    answers(g, "POST", "/api/v1/gate/check/", 200, json=check_body([(5, "s"), (1, "t")]))
    ledger_drain_all()
    report = answers(v, "GET", "/api/v1/reports/decisions/?group_by=reason", 200)
    assert {row["reason"] for row in report["results"]} == {"suppressed", "allowed"}
    answers(v, "GET", "/api/v1/reports/decisions/?group_by=colour", 400)


def test_quiet_hours_and_the_errors_of_every_kind(api, snapshot, answers):
    m = api("marketer")
    night = {"segment": "vip", "channel": "email", "start": "21:00", "end": "08:00"}
    entry = answers(m, "POST", "/api/v1/quiet-hours/", 201, json=night)
    path = f"/api/v1/quiet-hours/{entry['id']}/"
    answers(api("viewer"), "GET", "/api/v1/quiet-hours/", 200)
    answers(m, "GET", path, 200)
    answers(m, "PATCH", path, 200, json={"spread_minutes": 30})
    answers(m, "PATCH", path, 400, json={"start": "08:00"})
    answers(m, "DELETE", path, 204)
    answers(m, "GET", path, 404)
    # 401 without credentials, 403 without the right, 413 above the body limit.
    answers(api("anonymous"), "GET", "/api/v1/rules/", 401)
    answers(api("viewer"), "POST", "/api/v1/rules/", 403, json=PROMO)
    answers(
        m, "POST", "/api/v1/rules/", 413, data=b" " * (2**20 + 1), headers={"Content-Type": JSON}
    )


def test_topics(api, snapshot, answers):
    m = api("marketer")
    news = {"slug": "news", "name": "News", "channels": ["email"], "default": "unsubscribed"}
    answers(m, "POST", "/api/v1/topics/", 201, json=news)
    answers(m, "POST", "/api/v1/topics/", 409, json=news)
    answers(m, "POST", "/api/v1/topics/", 400, json={**news, "slug": "other", "default": "no"})
    answers(api("viewer"), "GET", "/api/v1/topics/", 200)
    answers(api("gate"), "GET", "/api/v1/topics/news/", 200)
    answers(m, "PATCH", "/api/v1/topics/news/", 200, json={"description": "Our news."})
    answers(m, "PATCH", "/api/v1/topics/news/", 400, json={"slug": "renamed"})
    answers(m, "DELETE", "/api/v1/topics/news/", 204)
    answers(m, "GET", "/api/v1/topics/news/", 404)


def test_preferences(api, snapshot, answers):
    m, gate = api("marketer"), api("gate")
    answers(m, "POST", "/api/v1/topics/", 201, json={"slug": "news", "name": "News"})
    path = "/api/v1/users/7/preferences/"
    answers(gate, "GET", path, 200)
    answers(gate, "PUT", path, 200, json={"topics": {"news": {"email": False}},
                                          "paused_until": "2099-01-01T00:00:00Z"})  # fmt: skip
    answers(gate, "PATCH", path, 200, json={"channels": {"sms": False}, "paused_until": None})
    answers(gate, "PATCH", path, 400, json={"topics": {"nope": {"email": False}}})
    answers(api("viewer"), "GET", path, 200)


def test_mailbox_providers_and_warmups(api, answers):
    default_groups()
    m, viewer = api("marketer"), api("viewer")
    group = {
        "slug": "proton",
        "name": "Proton",
        "domains": ["proton.me"],
        "rates": [{"dispatcher": "smtp", "per_second": 2.5}, {"per_hour": 1000}],
    }
    answers(m, "POST", "/api/v1/mailbox-providers/", 201, json=group)
    answers(m, "POST", "/api/v1/mailbox-providers/", 400, json={**group, "slug": "gmail"})
    mailbox_pause(MailboxProvider.objects.get(slug="yahoo"), {"complaints": 4, "words": "w"})
    waiting_chunk("brake:yahoo", 2)
    answers(viewer, "GET", "/api/v1/mailbox-providers/", 200)
    answers(viewer, "GET", "/api/v1/mailbox-providers/yahoo/", 200)
    answers(m, "PATCH", "/api/v1/mailbox-providers/proton/", 200, json={"rates": []})
    answers(m, "POST", "/api/v1/mailbox-providers/yahoo/resume/", 200)
    answers(m, "POST", "/api/v1/mailbox-providers/yahoo/resume/", 409)
    answers(m, "DELETE", "/api/v1/mailbox-providers/other/", 400)
    answers(m, "DELETE", "/api/v1/mailbox-providers/proton/", 204)
    answers(m, "GET", "/api/v1/mailbox-providers/proton/", 404)
    plan = answers(m, "POST", "/api/v1/warmups/", 201, json={"domain": "mail.example.com"})
    answers(m, "POST", "/api/v1/warmups/", 400, json={"domain": "mail.example.com"})
    waiting_chunk("warmup:mail.example.com:gmail", 3)
    answers(viewer, "GET", "/api/v1/warmups/", 200)
    path = f"/api/v1/warmups/{plan['id']}/"
    answers(viewer, "GET", path, 200)
    answers(m, "PATCH", path, 200, json={"starts_on": "2099-01-01", "time_zone": "Asia/Tokyo"})
    answers(m, "DELETE", path, 204)
    answers(m, "GET", path, 404)
