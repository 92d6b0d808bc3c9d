"""The marketer's pages (dashboard, cap grid, snapshots, user lookup, what-if) and the groups,
through Django's test client against real Redis and a real published snapshot."""

import io
import json
import re

import numpy as np
import pytest
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from limits.engine.log import stored_message_hash
from limits.ledger.drain import ledger_drain_all
from limits.models.policy import Cap, QuotaReset, Rule, SettingChange
from limits.policy.rules import RuleFields
from limits.policy.services import RULES
from segments.models import Build, Segment
from segments.publishing import build_run
from segments.selectors import snapshot_live_version
from segments.services import build_start
from tests.support import broker
from tests.support.files import inflating_gzip
from worker.gate import gate_check
from worker.processes import process_report

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(published, redis_client):
    return published(
        vip=(10, [1, 2, 3], {"email": (2, 5), "all": (3, 9)}),
        dormant=(20, [4, 5], {"email": (0, 0)}),
    )


def text(response) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


def test_the_groups_hold_exactly_their_rights(db):
    marketer = {p.codename for p in Group.objects.get(name="Marketer").permissions.all()}
    viewer = {p.codename for p in Group.objects.get(name="Viewer").permissions.all()}
    assert {"change_cap", "publish_snapshot", "reset_quota", "add_userlist"} <= marketer
    assert {"view_rule", "add_rule", "change_rule", "delete_rule"} <= marketer
    assert "view_rule" in viewer
    assert all(code.startswith("view_") for code in viewer) and viewer < marketer


def test_staff_without_a_group_see_nothing_they_cannot_use(client, staff):
    staff("sam")
    client.login(username="sam", password="a-long-test-password")
    index = text(client.get(reverse("admin:index")))
    assert "Marketing console" not in index and "Segments" not in index
    for name in ("dashboard", "user_lookup", "what_if", "snapshots"):
        assert client.get(reverse(f"admin:{name}")).status_code == 403


def test_a_viewer_reads_but_cannot_change(viewer_client, demo):
    vip = Segment.objects.get(slug="vip")
    grid = viewer_client.get(reverse("admin:cap_grid", args=[vip.pk]))
    assert grid.status_code == 200 and "disabled" in text(grid)
    posted = viewer_client.post(reverse("admin:cap_grid", args=[vip.pk]), {"email-daily": "9"})
    assert posted.status_code == 403 and Cap.objects.get(segment=vip, channel="email").daily == 2
    assert viewer_client.post(reverse("admin:snapshot_build")).status_code == 403
    assert viewer_client.get(reverse("admin:quota_reset", args=[1])).status_code == 403
    index = text(viewer_client.get(reverse("admin:index")))
    assert "Dashboard" in index and "What if" in index and "Cap rules" in index
    rules = text(viewer_client.get(reverse("admin:limits_rule_changelist")))
    assert "Vip users: at most 2 emails in any 24 hours" in rules
    assert viewer_client.get(reverse("admin:limits_rule_add")).status_code == 403
    own = make_rule("Everyone 3 a day")
    change = viewer_client.post(reverse("admin:limits_rule_change", args=[own.pk]), {"limit": "9"})
    assert change.status_code == 403 and Rule.objects.get(pk=own.pk).limit == 3


def test_the_cap_grid_reads_saves_and_records_every_change(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    url = reverse("admin:cap_grid", args=[vip.pk])
    page = text(marketer_client.get(url))
    assert "At most 2 emails in any 24 hours and 5 in any 7 days" in page
    assert "No cap on push messages" in page
    response = marketer_client.post(
        url,
        {"email-daily": "3", "email-weekly": "2", "push-daily": "0", "push-weekly": "", "all-daily": "3", "all-weekly": "9"},
        follow=True,
    )  # fmt: skip
    page = text(response)
    assert "Saved caps of Vip" in page
    assert "The weekly cap (2) is below the daily cap (3)" in page
    assert "No marketing push messages" in page
    email = Cap.objects.get(segment=vip, channel="email")
    assert (email.daily, email.weekly) == (3, 2)
    changes = {
        (
            (c.after or {})["channel"],
            (c.before or {}).get("daily"),
            (c.after or {})["daily"],
            c.by.username,
        )
        for c in SettingChange.objects.filter(kind="cap", via="admin")
    }
    assert changes == {("email", 2, 3, "mia"), ("push", None, 0, "mia")}
    assert "mia" in text(marketer_client.get(url))  # the history under the grid
    # The grid's caps are rules too, kept in step (and what the gate applies).
    classic = {
        (r.channel, r.window_seconds): r.limit for r in Rule.objects.filter(cap__segment=vip)
    }
    assert classic == {
        ("email", 86_400): 3, ("email", 604_800): 2, ("push", 86_400): 0,
        ("all", 86_400): 3, ("all", 604_800): 9,
    }  # fmt: skip
    assert gate_check(channel="push", requests=[(1, "p:1")], dry_run=True)[0].reason == "blocked"


def test_the_cap_grid_and_the_rule_form_offer_text_messages(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    url = reverse("admin:cap_grid", args=[vip.pk])
    page = text(marketer_client.get(url))
    assert 'name="sms-daily"' in page and "No cap on text messages" in page
    data = {
        "email-daily": "2",
        "email-weekly": "5",
        "sms-daily": "1",
        "all-daily": "3",
        "all-weekly": "9",
    }
    marketer_client.post(url, data)
    assert Cap.objects.get(segment=vip, channel="sms").daily == 1
    assert "At most 1 text message in any 24 hours" in text(marketer_client.get(url))
    assert gate_check(channel="sms", requests=[(1, "t:1"), (1, "t:2")])[1].reason == "daily_cap"

    form = marketer_client.get(reverse("admin:limits_rule_add")).content.decode()
    assert '<option value="sms">sms</option>' in form
    marketer_client.post(
        reverse("admin:limits_rule_add"),
        {
            "name": "Texts 4 h apart", "enabled": "on", "segment": "", "channel": "sms",
            "match": "any", "tag": "", "window_kind": "rolling", "window_seconds": "4 hours",
            "window_unit": "", "limit": "1", "reserve_below_priority": "", "reserve_slots": "",
        },
    )  # fmt: skip
    assert Rule.objects.get(name="Texts 4 h apart").channel == "sms"
    listing = text(marketer_client.get(reverse("admin:limits_rule_changelist")))
    assert "at most 1 text message in any 4 hours" in listing


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("email-daily", "-1", "email daily: &#x27;-1&#x27; is not a whole number"),
        ("push-weekly", "lots", "push weekly: &#x27;lots&#x27; is not a whole number"),
        ("all-daily", "99999999999", "all daily: at most 2,147,483,647"),
        ("email-weekly", "٣", "email weekly: &#x27;٣&#x27; is not a whole number"),
        ("push-daily", "9" * 5000, "push daily: at most 2,147,483,647"),
        ("push-daily", "+12", "push daily: &#x27;+12&#x27; is not a whole number"),
        ("push-daily", "1_000", "push daily: &#x27;1_000&#x27; is not a whole number"),
    ],
)
def test_a_bad_cap_value_saves_nothing_and_says_which(marketer_client, demo, field, value, message):
    vip = Segment.objects.get(slug="vip")
    data = {
        "email-daily": "7",
        "email-weekly": "8",
        "all-daily": "3",
        "all-weekly": "9",
        field: value,
    }
    response = marketer_client.post(reverse("admin:cap_grid", args=[vip.pk]), data)
    assert response.status_code == 200
    page = text(response)
    assert message in page and "Nothing was saved" in page
    assert Cap.objects.get(segment=vip, channel="email").daily == 2
    assert not SettingChange.objects.filter(kind="cap", via="admin").exists()


def test_spaces_around_a_cap_in_the_grid_are_ignored_as_in_any_form(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    data = {"email-daily": " 12 ", "email-weekly": "20", "all-daily": "3", "all-weekly": "9"}
    marketer_client.post(reverse("admin:cap_grid", args=[vip.pk]), data)
    assert Cap.objects.get(segment=vip, channel="email").daily == 12


def test_snapshots_list_versions_and_a_confirmed_make_live_rolls_back(marketer_client, demo):
    first = demo
    second = build_run(build_id=build_start(queue=False).pk).version
    page = text(marketer_client.get(reverse("admin:snapshots")))
    assert first in page and second in page and "live" in page
    confirm = marketer_client.get(reverse("admin:snapshot_make_live", args=[first]))
    assert "Make <code>" + first + "</code> the live snapshot?" in text(confirm)
    assert snapshot_live_version() == second  # asking changes nothing
    done = marketer_client.post(reverse("admin:snapshot_make_live", args=[first]), follow=True)
    assert f"{first} is live" in text(done)
    assert snapshot_live_version() == first
    missing = marketer_client.post(reverse("admin:snapshot_make_live", args=["nope"]), follow=True)
    assert "There is no snapshot version" in text(missing) and snapshot_live_version() == first


def test_make_live_of_a_version_missing_an_object_says_so_in_the_apis_words(
    marketer_client, demo, settings
):
    from segments.store import snapshot_key, store_from_settings
    from tests.support.stores import delete_object, unreadable

    second = build_run(build_id=build_start(queue=False).pk).version
    store = store_from_settings()
    delete_object(store, snapshot_key(demo, "vip.roaring"))
    done = text(marketer_client.post(reverse("admin:snapshot_make_live", args=[demo]), follow=True))
    assert (
        f"{demo} was not made live: Snapshot version {demo} is incomplete: its object "
        f"snapshots/{demo}/vip.roaring is missing from the store ({store.url}), so it can never "
        "be loaded. Make another version live, or build and publish a new one."
    ) in done
    assert snapshot_live_version() == second
    unreadable(store, snapshot_key(second, "vip.roaring"), settings)
    done = text(
        marketer_client.post(reverse("admin:snapshot_make_live", args=[second]), follow=True)
    )
    assert f"{second} was not made live: the snapshot store is unreachable: " in done


def test_build_and_publish_goes_to_the_build_page_whose_progress_is_json(
    marketer_client, demo, django_capture_on_commit_callbacks
):
    broker.clear("builds")
    with django_capture_on_commit_callbacks(execute=True):
        response = marketer_client.post(reverse("admin:snapshot_build"))
    ((task, (build_id,)),) = broker.queued("builds")
    assert task == "segments.tasks.build_snapshot"
    build = Build.objects.get(pk=build_id)
    assert response["Location"] == reverse("admin:segments_build_change", args=[build.pk])
    page = text(marketer_client.get(response["Location"]))
    assert 'role="progressbar"' in page
    progress = marketer_client.get(reverse("admin:build_progress", args=[build.pk])).json()
    assert progress == {**progress, "status": "queued", "progress": 0, "done": False}
    again = marketer_client.post(reverse("admin:snapshot_build"), follow=True)
    assert "wait for it to finish before starting another" in text(again)
    build_run(build_id=build.pk)
    progress = marketer_client.get(reverse("admin:build_progress", args=[build.pk])).json()
    assert (progress["status"], progress["progress"], progress["done"]) == ("succeeded", 100, True)
    page = text(marketer_client.get(reverse("admin:segments_build_change", args=[build.pk])))
    assert "Lost to higher priorities" in page


def make_rule(name, **values):
    fields = {
        "segment": None, "channel": "email", "match": "any", "tag": "", "window_kind": "rolling",
        "window_seconds": 86_400, "window_unit": "", "limit": 3, "reserve_below_priority": None,
        "reserve_slots": None,
    }  # fmt: skip
    return RULES.create(fields=RuleFields(name=name, **{**fields, **values}), via="command")


@pytest.mark.postgres
def test_a_user_lookup_shows_segment_zone_quota_rules_and_recent_sends(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    vip.time_zone = "Asia/Kathmandu"
    vip.save()
    make_rule(
        "1 promo a day", segment="vip", match="tag", tag="promo", window_kind="calendar",
        window_seconds=None, window_unit="day", limit=1,
    )  # fmt: skip
    gate_check(channel="email", requests=[(1, "spring:1")], campaign="spring", tags=("promo",))
    page = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": "1"}))
    assert 'segment <span id="user-segment">vip</span>' in page
    assert "Time zone <strong>Asia/Kathmandu</strong> (their segment&#x27;s)" in page
    assert "(+0545)" in page  # their local time, with the zone's offset
    assert "1 / 2" in page  # email: one of two in 24 hours
    rules = re.search(r'<table class="gk-table" id="rules">(.*?)</table>', page).group(1)
    assert (
        "Vip users: at most 1 promo-tagged email per calendar day, in their own time zone" in rules
    )
    assert re.search(
        r"1 promo a day</a>.*?<td>email</td><td class=\"num\">1 / 1</td><td class=\"num\">0</td><td>in \d",
        rules,
    )
    assert "classic cap" in rules and "Vip: daily cap on email" in rules
    sends = re.search(r'<table class="gk-table" id="recent-sends">(.*?)</table>', page).group(1)
    # The log keeps hashes: the message's, shortened; a campaign the ledger has not counted; a rule's tag.
    assert (
        f'<code title="{stored_message_hash("spring:1").hex()}">{stored_message_hash("spring:1").hex()[:8]}</code>'
        in sends
    )
    assert "not in the ledger's counts" in sends and "<td>promo</td>" in sends
    assert "spring:1" not in page
    ledger_drain_all()  # once the ledger has counted the campaign, it is named
    page = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": "1"}))
    sends = re.search(r'<table class="gk-table" id="recent-sends">(.*?)</table>', page).group(1)
    assert "<td>spring</td>" in sends and "not in the ledger's counts" not in sends
    for value in ("-4", "+4", "\u0661\u0662", "4.0"):
        bad = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": value}))
        assert "is not a whole number (digits 0-9 only)" in bad, value


def test_a_user_in_a_segment_without_a_zone_reads_the_setting(marketer_client, demo, settings):
    settings.GATEKEEPER_DEFAULT_TIME_ZONE = "America/New_York"
    page = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": "4"}))
    assert "Time zone <strong>America/New_York</strong> (the default" in page
    assert re.search(r"\((EST|EDT)\)", page)


def test_a_quota_reset_asks_first_needs_a_reason_and_is_audited(marketer_client, demo):
    gate_check(channel="email", requests=[(1, "a:1"), (1, "b:1")], campaign="x")
    url = reverse("admin:quota_reset", args=[1])
    assert "Yes, reset the quota" in text(marketer_client.get(url))
    refused = marketer_client.post(url, {"reason": "  "})
    assert refused.status_code == 200 and "This field is required" in text(refused)
    assert gate_check(channel="email", requests=[(1, "c:1")], dry_run=True)[0].reason == "daily_cap"
    done = marketer_client.post(
        url, {"reason": "complaint #12: sent twice by mistake"}, follow=True
    )
    assert "quota is reset" in text(done)
    assert gate_check(channel="email", requests=[(1, "c:1")], dry_run=True)[0].allowed
    (record,) = QuotaReset.objects.all()
    assert (record.user_id, record.segment_slug, record.reset_by.username) == (1, "vip", "mia")
    assert record.usage["email"] == {"daily": 2, "weekly": 2}


def test_what_if_counts_refusals_under_a_draft_without_writing(marketer_client, demo, redis_client):
    gate_check(channel="email", requests=[(1, "a:1")], campaign="x")
    keys_before = sorted(redis_client.keys())
    response = marketer_client.post(
        reverse("admin:what_if"),
        {"segment": Segment.objects.get(slug="vip").pk, "channel": "email", "vip|email|daily": "1"},
    )
    page = text(response)
    rows = re.findall(
        r"<tr><td>(\w+)</td><td>(\w+)</td><td class=\"num\">(\d+)</td> <td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>",
        page,
    )
    assert rows == [("Vip", "email", "3", "0", "1")]  # user 1 has had one email today
    assert sorted(redis_client.keys()) == keys_before
    upload = SimpleUploadedFile("audience.txt", b"1\n4\n99\n")
    response = marketer_client.post(
        reverse("admin:what_if"),
        {"user_list": upload, "dormant|email|daily": "", "dormant|email|weekly": ""},
    )
    rows = re.findall(
        r"<tr><td>([\w ]+)</td><td>(\w+)</td><td class=\"num\">(\d+)</td> <td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>",
        text(response),
    )
    assert ("Dormant", "email", "1", "1", "0") in rows  # lifting dormant's 0 lets user 4 through
    assert ("Everyone else", "email", "1", "0", "0") in rows


def test_what_if_takes_the_sends_tags_and_priority_and_counts_refusals_by_rule(
    marketer_client, demo
):
    make_rule(
        "1 promo a day", match="tag", tag="promo", window_kind="calendar", window_seconds=None,
        window_unit="day", limit=1,
    )  # fmt: skip
    make_rule("Keep 1 for 8+", channel="push", limit=1, reserve_below_priority=8, reserve_slots=1)
    gate_check(channel="email", requests=[(1, "a:1"), (2, "a:2")], campaign="a", tags=("promo",))
    vip = Segment.objects.get(slug="vip").pk

    def by_rule(**data):
        page = text(marketer_client.post(reverse("admin:what_if"), {"segment": vip, **data}))
        table = re.search(r'id="what-if-by-rule">(.*?)</table>', page)
        cells = r"<tr><td>(\w+)</td><td>([^<]+)</td><td class=\"num\">(\d+)</td></tr>"
        return page, re.findall(cells, table.group(1)) if table else []

    page, rows = by_rule(channel="email", tags="promo, news", campaign="autumn")
    assert rows == [("email", "1 promo a day", "2")]
    assert (
        "One more send of campaign &#x27;autumn&#x27;, tagged promo, news, at priority 5." in page
    )
    page, rows = by_rule(channel="email")  # untagged: the tag rule does not apply
    assert rows == [] and "No one: under the draft, every user of the audience could get" in page
    # The push rule keeps its one slot for priority 8 and above: refused below it, not at it.
    assert by_rule(channel="push", priority="7")[1] == [("push", "Keep 1 for 8+", "3")]
    assert by_rule(channel="push", priority="8")[1] == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "Choose a segment or upload a list"),
        ({"segment": "2", "tags": "promo, Promo!"}, "Tags: &#x27;Promo!&#x27; is not a tag."),
        (
            {"segment": "2", "tags": ",".join(f"t{i}" for i in range(9))},
            "Tags: At most 8 tags; 9 given.",
        ),
        ({"segment": "2", "priority": "10"}, "Priority: at most 9."),
        ({"segment": "2", "priority": "-1"}, "Priority: &#x27;-1&#x27; is not a whole number"),
        ({"segment": "2", "campaign": "c" * 500}, "Ensure this value has at most"),
        ({"user_list": SimpleUploadedFile("a.txt", b"1\nxyz\n")}, "line 2"),
        (
            {"user_list": SimpleUploadedFile("a.txt", b"1\n"), "vip|email|daily": "-3"},
            "Vip email daily",
        ),
    ],
)
def test_what_if_refuses_bad_input_naming_it(marketer_client, demo, data, message):
    page = text(marketer_client.post(reverse("admin:what_if"), data))
    assert message in page and "what-if-result" not in page


def test_the_dashboard_shows_versions_processes_decisions_and_sizes(marketer_client, demo):
    from worker.stats import flush

    gate_check(channel="email", requests=[(1, "a:1"), (4, "a:4"), (50, "a:50")], campaign="a")
    flush()
    process_report(role="worker", status={"version": "an-old-version"})
    page = text(marketer_client.get(reverse("admin:dashboard")))
    assert demo in page
    assert "an-old-version" in page and "not the live one yet" in page
    data = json.loads(
        re.search(r'id="dashboard-data" type="application/json">(.*?)</script>', page).group(1)
    )
    assert data["today"]["segments"] == ["default", "dormant", "vip"]
    assert data["today"]["datasets"]["blocked"] == [0, 1, 0]
    assert data["history"]["admitted"][-1] == 2 and len(data["history"]["days"]) == 14
    assert data["sizes"]["values"] == [3, 2]
    assert "chart.umd.min.js" in page


@pytest.mark.postgres
def test_segment_pages_link_to_their_caps(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    listing = text(marketer_client.get(reverse("admin:segments_segment_changelist")))
    assert reverse("admin:cap_grid", args=[vip.pk]) in listing and "vip.txt: 3 users" in listing
    assert re.search(r"#\d+, \d{4}-\d\d-\d\d \d\d:\d\d", listing)  # the last build
    change = text(marketer_client.get(reverse("admin:segments_segment_change", args=[vip.pk])))
    assert "Caps of this segment" in change
    rules = reverse("admin:limits_rule_changelist") + f"?segment__id__exact={vip.pk}"
    assert f'href="{rules}" class="rules-link"' in change


def test_a_marketer_uploads_a_list(marketer_client, demo):
    vip = Segment.objects.get(slug="vip")
    (stored,) = vip.user_lists.all()
    data = {
        "name": vip.name, "slug": vip.slug, "priority": vip.priority, "description": "",
        "user_lists-TOTAL_FORMS": "2", "user_lists-INITIAL_FORMS": "1",
        "user_lists-MIN_NUM_FORMS": "0", "user_lists-MAX_NUM_FORMS": "1000",
        "user_lists-0-id": str(stored.pk), "user_lists-0-segment": str(vip.pk),
        "user_lists-1-upload": SimpleUploadedFile("more.txt", b"7\n"),
    }  # fmt: skip
    response = marketer_client.post(
        reverse("admin:segments_segment_change", args=[vip.pk]), data, follow=True
    )
    assert "More.txt: stored" in text(response)  # the admin capitalises messages
    assert vip.user_lists.count() == 2


def test_the_demo_seeds_group_logins_a_service_account_and_a_live_dashboard(
    client, redis_client, settings
):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from gatekeeper.lib.groups import groups_sync

    groups_sync()
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    assert "login marketer / gatekeeper-demo" in out.getvalue()
    users = get_user_model().objects
    marketer, viewer, service = (users.get(username=n) for n in ("marketer", "viewer", "campaigns"))
    assert marketer.is_staff and not marketer.is_superuser
    assert [g.name for g in marketer.groups.all()] == ["Marketer"]
    assert [g.name for g in viewer.groups.all()] == ["Viewer"]
    assert service.has_perm("limits.use_gate") and not service.is_staff
    assert not service.has_usable_password()
    client.login(username="marketer", password="gatekeeper-demo")
    data = json.loads(
        re.search(
            r'id="dashboard-data" type="application/json">(.*?)</script>',
            text(client.get(reverse("admin:dashboard"))),
        ).group(1)
    )
    assert sum(data["history"]["admitted"]) > 0 and sum(data["history"]["refused"]) > 0
    assert len(data["sizes"]["values"]) == 4
    # A finished send job, so the send-job pages are not empty on first look.
    from worker.models import SendJob

    job = SendJob.objects.get(campaign="demo-welcome")
    assert job.status == "done" and job.pending == 0 and job.invalid == 3
    assert job.sent > 0 and job.capped > 0
    jobs = text(client.get(reverse("admin:worker_sendjob_changelist")))
    assert "demo-welcome" in jobs
    call_command("seed_demo", stdout=out)  # a second start seeds nothing
    assert "already there" in out.getvalue()
    assert SendJob.objects.count() == 3  # the finished one and the two scheduled


@pytest.mark.postgres
def test_the_demo_seeds_the_newer_pages_a_plan_an_experiment_topics_and_preferences(
    client, redis_client, settings
):
    from django.core.management import call_command
    from django.utils import timezone

    from gatekeeper.lib.groups import groups_sync
    from limits.models.people import Preference
    from limits.models.policy import Topic
    from limits.models.studies import Experiment, StudyDay, StudyEvent
    from limits.policy.selectors import topics_read
    from limits.studies.experiments import status_of
    from worker.models import SendJob

    groups_sync()
    call_command("seed_demo", stdout=io.StringIO())
    client.login(username="marketer", password="gatekeeper-demo")
    # A scheduled job and a reserved one, both ahead, and the plan page lists both.
    scheduled = list(SendJob.objects.filter(status="scheduled").order_by("start_at"))
    assert [job.reserve for job in scheduled] == [False, True]
    assert all(job.start_at is not None and job.start_at > timezone.now() for job in scheduled)
    plan = text(client.get("/admin/plan/"))
    assert "No plan yet" not in plan and "Made at" in plan
    for job in scheduled:
        assert f'id="plan-job-{job.pk}"' in plan and job.campaign in plan
    shown = client.get("/admin/plan/").context["current"]
    assert not shown["stale"] and len(shown["jobs"]) == 2
    reserved, earlier = shown["jobs"][1], shown["jobs"][0]
    assert reserved["reserve"] and reserved["sent"] > 0
    assert earlier["refused"].get("reserved", 0) > 0  # what the reservation holds for itself
    # A running experiment whose users entered with the demo newsletter, with outcome events.
    (experiment,) = Experiment.objects.all()
    now = timezone.now()
    assert status_of(experiment.state, experiment.starts_at, experiment.ends_at, now) == "running"
    days = StudyDay.objects.filter(study=experiment.pk)
    assert {d.arm for d in days} == {0, 1} and sum(d.entered for d in days) > 0
    rides = StudyEvent.objects.filter(study=experiment.pk, name="ride")
    assert sum(e.count for e in rides) > 0 and sum(e.value for e in rides) > 0
    report = text(client.get(reverse("admin:limits_experiment_report", args=[experiment.pk])))
    assert "ride" in report
    # Topics, and people's preferences about them.
    assert set(topics_read()) == {"offers", "product-news", "partner-offers", "safety"}
    assert Topic.objects.get(slug="safety").default == "required"
    assert Preference.objects.count() == 2_000
    assert Preference.objects.filter(topics__offers__push=False).exists()
    assert "Topics" in text(client.get(reverse("admin:limits_topic_changelist")))


def test_a_large_audience_is_estimated_from_a_sample(marketer_client, demo, monkeypatch):
    from worker import selectors

    monkeypatch.setattr(selectors, "WHAT_IF_LIMIT", 2)
    result = selectors.what_if(
        ids=np.array([1, 2, 3, 1]),
        draft=selectors.draft_table({}),
        only_channels=["email"],
    )
    assert (result["audience"], result["evaluated"], result["sampled"]) == (3, 2, True)
    (row,) = result["rows"]
    assert (row["segment"], row["audience"]) == ("vip", 3)  # 2 sampled, scaled by 3/2


def test_make_live_is_refused_while_a_build_runs(marketer_client, demo):
    second = build_run(build_id=build_start(queue=False).pk).version
    running = build_start(queue=False)
    confirm = text(marketer_client.get(reverse("admin:snapshot_make_live", args=[demo])))
    assert f"#{running.pk}</a> is queued" in confirm
    done = text(marketer_client.post(reverse("admin:snapshot_make_live", args=[demo]), follow=True))
    assert "was not made live" in done and "wait for it to finish" in done
    assert snapshot_live_version() == second


def test_a_quota_reset_of_an_id_no_snapshot_can_hold_is_not_found(marketer_client, demo):
    assert marketer_client.get(reverse("admin:quota_reset", args=[2**64])).status_code == 404
    page = text(marketer_client.get(reverse("admin:user_lookup"), {"user_id": str(2**64)}))
    assert "User id: at most 4,294,967,295" in page


def test_a_stale_cap_grid_neither_reverts_nor_overwrites_a_colleagues_change(marketer_client, demo):
    from limits.policy.services import cap_set

    vip = Segment.objects.get(slug="vip")
    url = reverse("admin:cap_grid", args=[vip.pk])
    page = text(marketer_client.get(url))
    assert 'name="email-daily-was" value="2"' in page
    form = {
        "email-daily": "2", "email-weekly": "5", "email-daily-was": "2", "email-weekly-was": "5",
        "push-daily": "", "push-weekly": "", "push-daily-was": "", "push-weekly-was": "",
        "all-daily": "3", "all-weekly": "9", "all-daily-was": "3", "all-weekly-was": "9",
    }  # fmt: skip
    cap_set(segment=vip, channel="email", daily=4, weekly=10)  # a colleague, meanwhile
    # Changing only push leaves the colleague's email caps alone.
    marketer_client.post(url, {**form, "push-daily": "1"})
    email = Cap.objects.get(segment=vip, channel="email")
    assert (email.daily, email.weekly) == (4, 10)
    assert Cap.objects.get(segment=vip, channel="push").daily == 1
    # Changing email from what the stale form showed is a conflict: nothing is saved.
    response = marketer_client.post(url, {**form, "email-daily": "3", "push-daily": "7"})
    page = text(response)
    assert "email was changed by someone else while you edited" in page
    assert "At most 4 emails in any 24 hours and 10 in any 7 days" in page
    assert (
        Cap.objects.get(segment=vip, channel="email").daily,
        Cap.objects.get(segment=vip, channel="push").daily,
    ) == (4, 1)
    # A form without some channel's fields leaves that channel as it is.
    marketer_client.post(
        url, {"all-daily": "5", "all-weekly": "9", "all-daily-was": "3", "all-weekly-was": "9"}
    )
    assert Cap.objects.get(segment=vip, channel="all").daily == 5
    assert Cap.objects.get(segment=vip, channel="email").daily == 4


def test_what_if_samples_a_large_segment_and_bounds_an_upload(marketer_client, demo, monkeypatch):
    from worker import selectors

    monkeypatch.setattr(selectors, "WHAT_IF_LIMIT", 2)
    vip = Segment.objects.get(slug="vip")
    page = text(
        marketer_client.post(reverse("admin:what_if"), {"segment": vip.pk, "channel": "email"})
    )
    assert "3 distinct users in the audience; estimated from a random sample of 2" in page
    monkeypatch.setattr(selectors, "WHAT_IF_MAX_IDS", 2)
    upload = SimpleUploadedFile("big.txt", b"1\n2\n3\n")
    page = text(marketer_client.post(reverse("admin:what_if"), {"user_list": upload}))
    assert "big.txt: more than 2 ids. Choose a segment" in page and "what-if-result" not in page
    # A small upload that inflates far is refused after reading a bounded part of it.
    monkeypatch.setattr(selectors, "WHAT_IF_MAX_IDS", 10**9)
    bomb = SimpleUploadedFile("bomb.gz", inflating_gzip(b"1\n", 256 * 2**20))
    page = text(marketer_client.post(reverse("admin:what_if"), {"user_list": bomb}))
    assert "larger than 134,217,728 bytes once decompressed" in page
