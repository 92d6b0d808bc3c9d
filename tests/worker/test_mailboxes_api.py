"""Deliverability's settings over REST: mailbox providers listed, made, read with the email
waiting for their brake, changed, deleted, and a paused one resumed (its waiting email handed
out at once); warm-up plans made (the default ramp when no volumes are given), read with
today's day, volume, sent and waiting per group, changed and deleted. Each write is in the
settings' history; bad input is a 400 naming the field, with nothing stored and no history;
a viewer reads and writes nothing."""

from datetime import date, timedelta
from typing import Any

import pytest
from django.utils import timezone

from limits.models.policy import SettingChange
from tests.support.api import call
from tests.support.mailboxes import default_groups, waiting_chunk
from worker.delivery.mailbox_settings import mailbox_pause, mailbox_shown, warmup_shown
from worker.delivery.warmup import DEFAULT_RAMP, Plan, warmup_take
from worker.models import MailboxProvider, SendChunk, WarmupPlan

pytestmark = pytest.mark.django_db(transaction=True)

GROUPS = "/api/v1/mailbox-providers/"
PLANS = "/api/v1/warmups/"
PROTON = {
    "slug": "proton",
    "name": "Proton",
    "domains": ["proton.me", "protonmail.*"],
    "mx_hosts": ["protonmail.ch"],
    "rates": [{"dispatcher": "smtp", "per_second": 5, "per_hour": 10_000}],
}
WHY = {
    "complaints": 12,
    "delivered": 3_400,
    "complaint_rate": 0.0035,
    "bounces": 3,
    "bounce_rate": 0.0009,
    "words": "complaints 0.35 % of 3,400 delivered",
}


@pytest.fixture
def groups(transactional_db) -> list[str]:
    return default_groups()


def stored() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Everything the endpoints write: the groups, the plans and the history's length."""
    return (
        [mailbox_shown(row) for row in MailboxProvider.objects.order_by("slug")],
        [warmup_shown(row) for row in WarmupPlan.objects.order_by("domain")],
        SettingChange.objects.count(),
    )


def history(kind: str) -> list[tuple[str, str, str]]:
    return [
        (c.action, c.via, c.by.username if c.by else "")
        for c in SettingChange.objects.filter(kind=kind).order_by("at", "pk")
    ]


def test_groups_are_listed_made_read_changed_and_deleted_each_change_recorded(api, groups):
    marketer = api("marketer")
    listed = call(marketer, "GET", GROUPS)
    assert listed.status_code == 200, listed.text
    assert [g["slug"] for g in listed.json()] == groups
    gmail = next(g for g in listed.json() if g["slug"] == "gmail")
    assert gmail["domains"] == ["gmail.com", "googlemail.com"]
    assert (gmail["paused"], gmail["paused_why"], gmail["waiting"], gmail["rates"]) == (
        False,
        None,
        0,
        [],
    )

    made = call(marketer, "POST", GROUPS, json=PROTON)
    assert made.status_code == 201, made.text
    assert made.json()["rates"] == [
        {"dispatcher": "smtp", "per_second": 5, "per_minute": None, "per_hour": 10_000}
    ]
    assert made.json()["domains"] == ["proton.me", "protonmail.*"]
    one = call(marketer, "GET", f"{GROUPS}proton/")
    assert one.status_code == 200 and one.json() == made.json()

    rates = [{"per_minute": 600}, {"dispatcher": "amazon_ses", "per_second": 2.5}]
    changed = call(marketer, "PATCH", f"{GROUPS}proton/", json={"rates": rates, "name": "Proton"})
    assert changed.status_code == 200, changed.text
    assert changed.json()["rates"] == [
        {"dispatcher": "*", "per_second": None, "per_minute": 600, "per_hour": None},
        {"dispatcher": "amazon_ses", "per_second": 2.5, "per_minute": None, "per_hour": None},
    ]
    assert MailboxProvider.objects.get(slug="proton").rates == changed.json()["rates"]
    words = SettingChange.objects.filter(kind="mailbox_provider", action="changed").get().words
    assert words == (
        "rates: 600 a minute through every dispatcher; 2.5 a second through amazon_ses"
    )

    assert call(marketer, "DELETE", f"{GROUPS}proton/").status_code == 204
    assert not MailboxProvider.objects.filter(slug="proton").exists()
    assert call(marketer, "GET", f"{GROUPS}proton/").status_code == 404
    assert history("mailbox_provider") == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("deleted", "api", "marketer"),
    ]


def test_a_viewer_reads_the_groups_and_plans_and_changes_nothing(api, groups):
    viewer = api("viewer")
    plan = call(api("marketer"), "POST", PLANS, json={"domain": "mail.example.com"})
    assert plan.status_code == 201, plan.text
    mailbox_pause(MailboxProvider.objects.get(slug="yahoo"), WHY)
    before = stored()
    assert call(viewer, "GET", GROUPS).status_code == 200
    assert call(viewer, "GET", f"{GROUPS}gmail/").status_code == 200
    assert call(viewer, "GET", PLANS).status_code == 200
    assert call(viewer, "GET", f"{PLANS}{plan.json()['id']}/").status_code == 200
    for method, path, body in (
        ("POST", GROUPS, PROTON),
        ("PATCH", f"{GROUPS}gmail/", {"name": "G"}),
        ("DELETE", f"{GROUPS}gmail/", None),
        ("POST", f"{GROUPS}yahoo/resume/", None),
        ("POST", PLANS, {"domain": "news.example.com"}),
        ("PATCH", f"{PLANS}{plan.json()['id']}/", {"time_zone": "Europe/Paris"}),
        ("DELETE", f"{PLANS}{plan.json()['id']}/", None),
    ):
        refused = call(viewer, method, path, json=body)
        assert refused.status_code == 403, (method, path, refused.text)
    assert stored() == before
    assert call(api("anonymous"), "GET", GROUPS).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "body", "field", "words"),
    [
        (
            "POST",
            GROUPS,
            {**PROTON, "rates": [{"dispatcher": "smtp", "per_second": -1}]},
            "rates[0].per_second",
            "more than 0",
        ),
        ("POST", GROUPS, {**PROTON, "rates": [{"dispatcher": "smtp"}]}, "rates", "give per_"),
        (
            "POST",
            GROUPS,
            {**PROTON, "rates": [{"per_second": 1}, {"dispatcher": "*", "per_hour": 5}]},
            "rates",
            "has a rate already",
        ),
        ("POST", GROUPS, {**PROTON, "domains": ["gmail.com"]}, "domains", "in the group 'gmail'"),
        ("POST", GROUPS, {**PROTON, "domains": ["Proton.me"]}, "domains", "Write it in lowercase"),
        ("POST", GROUPS, {**PROTON, "domains": ["proton.me", "proton.me"]}, "domains", "twice"),
        ("POST", GROUPS, {**PROTON, "slug": "gmail"}, "slug", "already"),
        ("POST", GROUPS, {**PROTON, "slug": "Proton"}, "slug", "Lowercase"),
        ("POST", GROUPS, {**PROTON, "name": "   "}, "name", "1 to 100"),
        ("PATCH", f"{GROUPS}other/", {"domains": ["example.org"]}, "domains", "names none"),
        ("PATCH", f"{GROUPS}gmail/", {"slug": "google"}, "slug", "Unknown field"),
        (
            "PATCH",
            f"{GROUPS}gmail/",
            {"rates": [{"dispatcher": "SMTP!", "per_second": 1}]},
            "rates[0].dispatcher",
            "provider's name",
        ),
        ("DELETE", f"{GROUPS}other/", None, "slug", "cannot be deleted"),
        (
            "POST",
            PLANS,
            {"domain": "mail.example.com", "volumes": {"gmial": [5]}},
            "volumes",
            "'gmial' is no mailbox provider",
        ),
        (
            "POST",
            PLANS,
            {"domain": "mail.example.com", "volumes": {"gmail": [50, 0, 100]}},
            "volumes",
            "gmail, day 2: 0; each day sends at least 1",
        ),
        ("POST", PLANS, {"domain": "mail example.com"}, "domain", "has a space in it"),
        (
            "POST",
            PLANS,
            {"domain": "mail.example.com", "time_zone": "Mars/Olympus"},
            "time_zone",
            "Mars/Olympus",
        ),
        ("POST", PLANS, {"domain": "mail.example.com", "starts_on": "2026-02-30"}, "starts_on", ""),
        ("POST", PLANS, {"domain": "news.example.com"}, "domain", "has a warm-up plan already"),
        ("PATCH", "plan", {"volumes": {"gmail": [10], "nowhere": [5]}}, "volumes", "'nowhere'"),
        ("PATCH", "plan", {"time_zone": "Europe/Nowhere"}, "time_zone", "Europe/Nowhere"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_stored(
    api, groups, method, path, body, field, words
):
    marketer = api("marketer")
    plan = call(marketer, "POST", PLANS, json={"domain": "news.example.com"})
    assert plan.status_code == 201, plan.text
    if path == "plan":
        path = f"{PLANS}{plan.json()['id']}/"
    before = stored()
    answer = call(marketer, method, path, json=body)
    assert answer.status_code == 400, answer.text
    assert field in answer.json(), answer.json()
    assert words in " ".join(answer.json()[field])
    assert stored() == before


def test_resuming_a_paused_group_hands_out_its_waiting_email_at_once(api, groups):
    marketer = api("marketer")
    yahoo = MailboxProvider.objects.get(slug="yahoo")
    mailbox_pause(yahoo, WHY)
    first = waiting_chunk("brake:yahoo", 3)
    second = waiting_chunk("brake:yahoo", 2)
    other = waiting_chunk("brake:gmail", 4)
    shown = call(marketer, "GET", f"{GROUPS}yahoo/")
    assert shown.status_code == 200, shown.text
    assert (shown.json()["paused"], shown.json()["waiting"]) == (True, 5)
    assert shown.json()["paused_why"] == WHY
    listed = {g["slug"]: g["waiting"] for g in call(marketer, "GET", GROUPS).json()}
    assert listed == {"apple": 0, "gmail": 4, "microsoft": 0, "other": 0, "yahoo": 5}

    asked = timezone.now()
    resumed = call(marketer, "POST", f"{GROUPS}yahoo/resume/")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["paused"], resumed.json()["paused_why"]) == (False, None)
    assert resumed.json()["resumed_at"] is not None
    for chunk in (first, second):
        chunk.refresh_from_db()
        assert chunk.not_before is not None
        assert asked <= chunk.not_before <= timezone.now()  # due now, not in an hour
        assert (chunk.status, chunk.queued_at) == (SendChunk.Status.QUEUED, None)
    other.refresh_from_db()
    assert other.not_before is not None
    assert other.not_before > timezone.now() + timedelta(minutes=50)  # gmail's still waits
    assert history("mailbox_provider") == [("paused", "brake", ""), ("resumed", "api", "marketer")]

    again = call(marketer, "POST", f"{GROUPS}yahoo/resume/")
    assert again.status_code == 409, again.text
    assert again.json()["field"] == "paused" and "not paused" in again.json()["detail"]
    assert call(marketer, "POST", f"{GROUPS}nope/resume/").status_code == 404
    assert len(history("mailbox_provider")) == 2


def test_a_plan_gets_the_default_ramp_and_shows_its_day_sent_and_waiting(api, groups):
    marketer = api("marketer")
    made = call(marketer, "POST", PLANS, json={"domain": "mail.example.com"})
    assert made.status_code == 201, made.text
    plan = made.json()
    assert plan["volumes"] == {g: list(DEFAULT_RAMP) for g in groups if g != "other"}
    assert (plan["time_zone"], plan["over"], plan["ended"]) == ("UTC", False, {})
    today = timezone.now().date()
    assert plan["starts_on"] == today.isoformat()
    assert plan["today"]["day"] == 1 and plan["today"]["date"] == today.isoformat()
    assert plan["today"]["groups"]["gmail"] == {"volume": 50, "sent": 0, "waiting": 0}
    assert "other" not in plan["today"]["groups"]

    row = WarmupPlan.objects.get()
    taken = Plan(row.pk, row.domain, row.time_zone, row.starts_on, row.volumes, {})
    warmup_take(taken, today, {"gmail": (70, 50), "yahoo": (3, 50)})
    waiting_chunk("warmup:mail.example.com:gmail", 6)
    waiting_chunk("warmup:other.example.com:gmail", 9)  # another domain's plan
    path = f"{PLANS}{plan['id']}/"
    one = call(marketer, "GET", path).json()
    assert one["today"]["groups"]["gmail"] == {"volume": 50, "sent": 50, "waiting": 6}
    assert one["today"]["groups"]["yahoo"] == {"volume": 50, "sent": 3, "waiting": 0}

    later = (today + timedelta(days=3)).isoformat()
    changed = call(
        marketer,
        "PATCH",
        path,
        json={"starts_on": later, "time_zone": "Africa/Abidjan", "volumes": {"gmail": [10, 20]}},
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["volumes"] == {"gmail": [10, 20]}
    # Before its first day (Abidjan's days are UTC's: today's count stands).
    assert changed.json()["today"]["day"] is None
    assert changed.json()["today"]["groups"] == {
        "gmail": {"volume": None, "sent": 50, "waiting": 6}
    }
    assert WarmupPlan.objects.get().starts_on == date.fromisoformat(later)
    assert [p["domain"] for p in call(marketer, "GET", PLANS).json()] == ["mail.example.com"]

    assert call(marketer, "DELETE", path).status_code == 204
    assert not WarmupPlan.objects.exists()
    assert call(marketer, "GET", path).status_code == 404
    assert call(marketer, "GET", f"{PLANS}99999999999999999999/").status_code == 404
    assert history("warmup") == [
        ("created", "api", "marketer"),
        ("changed", "api", "marketer"),
        ("deleted", "api", "marketer"),
    ]


def test_a_group_a_plan_names_stays_until_the_plan_stops_naming_it(api, groups):
    marketer = api("marketer")
    made = call(
        marketer, "POST", PLANS, json={"domain": "mail.example.com", "volumes": {"apple": [5]}}
    )
    assert made.status_code == 201, made.text
    refused = call(marketer, "DELETE", f"{GROUPS}apple/")
    assert refused.status_code == 400
    assert "mail.example.com names 'apple'" in refused.json()["slug"][0]
    assert MailboxProvider.objects.filter(slug="apple").exists()
