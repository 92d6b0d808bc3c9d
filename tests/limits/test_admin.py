"""The admin pages through Django's test client."""

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from gatekeeper.lib.groups import MARKETER, VIEWER
from limits.engine.quiet import QuietFields
from limits.models.policy import Cap, QuietHours, Rule, SettingChange
from limits.policy.rules import RuleFields
from limits.policy.services import QUIET_HOURS, RULES, cap_set
from segments.models import Build, Segment, UserList

pytestmark = pytest.mark.django_db


@pytest.fixture
def vip(db):
    return Segment.objects.create(slug="vip", name="VIP", priority=10)


def inline_data(segment, upload=None):
    data = {
        "name": segment.name, "slug": segment.slug, "priority": segment.priority, "description": "",
        "user_lists-TOTAL_FORMS": "1", "user_lists-INITIAL_FORMS": "0",
        "user_lists-MIN_NUM_FORMS": "0", "user_lists-MAX_NUM_FORMS": "1000", "time_zone": "",
    }  # fmt: skip
    if upload is not None:
        data["user_lists-0-upload"] = upload
    return data


@pytest.mark.parametrize(
    "page",
    [
        "segments_segment",
        "limits_cap",
        "limits_rule",
        "limits_quiethours",
        "limits_topic",
        "limits_settingchange",
        "segments_build",
        "worker_sendjob",
    ],
)
def test_every_list_page_loads(admin_client, vip, page):
    assert admin_client.get(reverse(f"admin:{page}_changelist")).status_code == 200


def test_an_upload_with_a_bad_line_is_refused_with_its_line_number(admin_client, vip):
    url = reverse("admin:segments_segment_change", args=[vip.pk])
    response = admin_client.post(
        url, inline_data(vip, SimpleUploadedFile("bad.txt", b"1\n2\nabc\n")), follow=True
    )
    assert "line 3: &#x27;abc&#x27; is not a user id" in response.content.decode()
    assert not UserList.objects.exists()


def test_a_good_upload_is_stored(admin_client, vip):
    url = reverse("admin:segments_segment_change", args=[vip.pk])
    admin_client.post(
        url, inline_data(vip, SimpleUploadedFile("good.txt", b"user_id\n1\n2\n2\n")), follow=True
    )
    (stored,) = UserList.objects.all()
    assert (stored.original_name, stored.id_count, stored.line_count) == ("good.txt", 2, 4)


def test_a_priority_follows_the_one_rule_for_whole_numbers_and_a_slug_never_changes(
    admin_client, vip
):
    url = reverse("admin:segments_segment_change", args=[vip.pk])
    for value in ("+5", "\u0665", "5.0", "-5"):
        response = admin_client.post(url, {**inline_data(vip), "priority": value})
        assert "is not a whole number (digits 0-9 only)" in response.content.decode(), value
    renamed = {**inline_data(vip), "priority": "11", "slug": "renamed"}
    admin_client.post(url, renamed, follow=True)
    vip.refresh_from_db()
    assert (vip.slug, vip.priority) == ("vip", 11)  # the slug is read-only once created


def test_the_default_segment_has_no_delete_button(admin_client):
    default = Segment.objects.get(is_default=True)
    response = admin_client.get(reverse("admin:segments_segment_delete", args=[default.pk]))
    assert response.status_code == 403


def test_a_cap_edit_is_recorded_with_who_made_it(admin_client, admin_user, vip):
    response = admin_client.post(
        reverse("admin:limits_cap_add"),
        {"segment": vip.pk, "channel": "email", "daily": "3", "weekly": "2"},
    )
    assert response.status_code == 302
    cap = Cap.objects.get()
    (change,) = SettingChange.objects.filter(kind="cap", via="admin")
    after = change.after or {}
    assert (after["daily"], after["weekly"], change.by) == (3, 2, admin_user)
    listing = admin_client.get(reverse("admin:limits_cap_changelist")).content.decode()
    assert "at most 3 emails in any 24 hours and 2 in any 7 days" in listing
    assert "The weekly cap (2) is below the daily cap (3)" in listing
    bad = admin_client.post(
        reverse("admin:limits_cap_change", args=[cap.pk]),
        {"segment": vip.pk, "channel": "email", "daily": "-1", "weekly": ""},
    )
    assert (
        bad.status_code == 200 and "is not a whole number (digits 0-9 only)" in bad.content.decode()
    )


def test_one_build_button_and_a_stalled_build_is_shown_and_treated_as_stalled(
    admin_client, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from tests.support import broker

    broker.clear("builds")
    # A build whose worker stopped reporting eleven minutes ago (killed, say).
    stalled = Build.objects.create(
        status=Build.Status.RUNNING, heartbeat_at=timezone.now() - timedelta(minutes=11)
    )
    listing = admin_client.get(reverse("admin:segments_build_changelist")).content.decode()
    assert "stalled" in listing
    assert 'name="action"' not in listing  # builds start from the Snapshots page only
    snapshots = admin_client.get(reverse("admin:snapshots")).content.decode()
    assert f"#{stalled.pk}</a> is" not in snapshots  # not shown as running
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(reverse("admin:snapshot_build"))
    stalled.refresh_from_db()
    assert stalled.status == "failed" and "stopped reporting" in stalled.error
    started = Build.objects.exclude(pk=stalled.pk).get()
    assert broker.queued("builds") == [("segments.tasks.build_snapshot", [started.pk])]


def test_the_cap_page_follows_the_one_rule_for_whole_numbers(admin_client, vip):
    url = reverse("admin:limits_cap_add")
    for value in ("+12", "1_000", "\u0661\u0662", "12.0"):
        data = {"segment": vip.pk, "channel": "email", "daily": value, "weekly": ""}
        response = admin_client.post(url, data)
        assert "is not a whole number (digits 0-9 only)" in response.content.decode(), value
    assert not Cap.objects.exists()
    admin_client.post(url, {"segment": vip.pk, "channel": "email", "daily": " 12 ", "weekly": ""})
    assert Cap.objects.get().daily == 12


def test_searching_the_quota_resets_with_any_text_answers(admin_client):
    for text in ("abc", "\u0661\u0662", "12", "9" * 30):
        response = admin_client.get(reverse("admin:limits_quotareset_changelist"), {"q": text})
        assert response.status_code == 200, text


# --- cap rules -------------------------------------------------------------------------------


def rule_data(**changes):
    """A rule's add/change form as a browser posts it: every field, these ones changed."""
    data = {
        "name": "1 promo a day", "enabled": "on", "segment": "", "channel": "email",
        "match": "any", "tag": "", "window_kind": "rolling", "window_seconds": "24 hours",
        "window_unit": "", "limit": "1", "reserve_below_priority": "", "reserve_slots": "",
    }  # fmt: skip
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def listed(response) -> list[str]:
    """The rules a changelist shows, in order."""
    return re.findall(
        r'<th class="field-name"><a href="[^"]+">([^<]+)</a></th>', response.content.decode()
    )


def make_rule(name="rule", **values):
    fields = {
        "segment": None, "channel": "email", "match": "any", "tag": "", "window_kind": "rolling",
        "window_seconds": 86_400, "window_unit": "", "limit": 3, "reserve_below_priority": None,
        "reserve_slots": None,
    }  # fmt: skip
    return RULES.create(fields=RuleFields(name=name, **{**fields, **values}), via="command")


def test_a_rule_added_in_the_admin_reads_in_plain_words_and_is_recorded_with_who(
    admin_client, admin_user
):
    gold = Segment.objects.create(slug="gold", name="Gold", priority=5)
    response = admin_client.post(
        reverse("admin:limits_rule_add"),
        rule_data(
            name="1 promo a day",
            segment=str(gold.pk),
            match="tag",
            tag="promo",
            window_kind="calendar",
            window_seconds="",
            window_unit="day",
        ),
        follow=True,
    )
    page = response.content.decode()
    reading = "Gold users: at most 1 promo-tagged email per calendar day, in their own time zone"
    assert f"It reads: {reading}." in page
    rule = Rule.objects.get(name="1 promo a day")
    assert (rule.segment, rule.match, rule.tag, rule.window_unit) == (gold, "tag", "promo", "day")
    assert (rule.window_seconds, rule.created_by) == (None, admin_user)
    (change,) = SettingChange.objects.filter(kind="rule", object_id=rule.pk)
    assert (change.action, change.via, change.by) == ("created", "admin", admin_user)
    listing = admin_client.get(reverse("admin:limits_rule_changelist")).content.decode()
    assert reading in listing


def test_a_rolling_window_is_typed_in_words_or_seconds_and_shown_in_words(admin_client):
    url = reverse("admin:limits_rule_add")
    for typed, seconds in (
        ("4 hours", 14_400),
        ("1 day 12 h", 129_600),
        (" 90 ", 90),
        ("2W", 1_209_600),
    ):
        admin_client.post(url, rule_data(name=typed, window_seconds=typed))
        assert Rule.objects.get(name=typed.strip()).window_seconds == seconds, typed
    rule = Rule.objects.get(window_seconds=14_400)
    form = admin_client.get(reverse("admin:limits_rule_change", args=[rule.pk])).content.decode()
    assert 'name="window_seconds" value="4 hours"' in form
    assert "at most 1 email in any 4 hours (at least 4 hours apart)" in form


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"limit": "-1"}, "Limit: &#x27;-1&#x27; is not a whole number (digits 0-9 only)."),
        ({"limit": ""}, "This field is required."),
        ({"window_seconds": "30 seconds"}, "From 60 (1 minute) to 7,776,000 (90 days); 30 is not."),
        ({"window_seconds": "91 days"}, "From 60 (1 minute) to 7,776,000 (90 days)"),
        ({"window_seconds": "4 parsecs"}, "&#x27;4 parsecs&#x27; is not a length of time"),
        ({"window_seconds": "٤ hours"}, "is not a length of time"),
        ({"window_seconds": "99999999999 days"}, "is not a length of time"),
        ({"window_seconds": ""}, "A rolling window needs its length in seconds."),
        ({"window_kind": "calendar", "window_unit": ""}, "Choose one of: day, week, month."),
        ({"match": "tag"}, "A tag rule needs the tag it counts."),
        ({"match": "tag", "tag": "Promo!"}, "&#x27;Promo!&#x27; is not a tag."),
        ({"tag": "promo"}, "Only a tag rule counts a tag; this one counts every send."),
        ({"reserve_slots": "1"}, "A reserve needs both below_priority and slots."),
        (
            {"reserve_below_priority": "7", "reserve_slots": "2"},
            "2 slots kept out of a limit of 1: at most the limit.",
        ),
        ({"reserve_below_priority": "7", "reserve_slots": "0"}, "At least 1 slot, or no reserve."),
        ({"name": "  "}, "This field is required."),
        ({"channel": "fax"}, "Select a valid choice. fax is not one of the available choices."),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field_and_nothing_is_saved(
    admin_client, changes, message
):
    response = admin_client.post(reverse("admin:limits_rule_add"), rule_data(**changes))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Rule.objects.exists() and not SettingChange.objects.filter(kind="rule").exists()


@pytest.mark.postgres
def test_a_rule_change_and_delete_go_through_the_services_and_show_in_its_history(
    admin_client, admin_user
):
    rule = make_rule("3 a day")
    url = reverse("admin:limits_rule_change", args=[rule.pk])
    admin_client.post(url, rule_data(name="3 a day", limit="2", window_seconds="7 days"))
    rule.refresh_from_db()
    assert (rule.limit, rule.window_seconds, rule.changed_by) == (2, 604_800, admin_user)
    change = SettingChange.objects.filter(kind="rule").get(object_id=rule.pk, action="changed")
    before, after = change.before or {}, change.after or {}
    assert (before["limit"], after["limit"], change.via) == (3, 2, "admin")
    page = admin_client.get(url).content.decode()
    assert "window: rolling 24 hours → rolling 7 days; limit: 3 → 2" in page
    assert "Created: Everyone: at most 3 emails in any 24 hours" in page
    admin_client.post(reverse("admin:limits_rule_delete", args=[rule.pk]), {"post": "yes"})
    assert not Rule.objects.exists()
    deleted = SettingChange.objects.filter(kind="rule").get(action="deleted")
    assert (deleted.object_label, deleted.by, deleted.via) == ("3 a day", admin_user, "admin")
    log = admin_client.get(reverse("admin:limits_settingchange_changelist")).content.decode()
    assert "Deleted." in log and "limit: 3 → 2" in log


def test_a_classic_caps_rule_is_read_only_links_to_its_grid_and_is_never_deleted(admin_client):
    vip = Segment.objects.create(slug="vip", name="VIP", priority=10)
    cap_set(segment=vip, channel="email", daily=2, weekly=5)
    daily = Rule.objects.get(cap__isnull=False, window_seconds=86_400)
    url = reverse("admin:limits_rule_change", args=[daily.pk])
    page = admin_client.get(url).content.decode()
    grid = reverse("admin:cap_grid", args=[vip.pk])
    assert f'href="{grid}" class="cap-grid-link"' in page
    assert 'name="_save"' not in page  # shown, not editable
    assert admin_client.post(url, rule_data(limit="9")).status_code == 403
    refused = admin_client.get(reverse("admin:limits_rule_delete", args=[daily.pk]), follow=True)
    assert (
        "cannot be deleted here. Empty its cell in the cap grid instead."
        in refused.content.decode()
    )
    bulk = admin_client.post(
        reverse("admin:limits_rule_changelist"),
        {"action": "delete_selected", "_selected_action": [daily.pk], "post": "yes"},
        follow=True,
    )
    assert "Nothing was deleted: VIP: daily cap on email is a classic cap." in bulk.content.decode()
    daily.refresh_from_db()
    assert daily.limit == 2
    listing = admin_client.get(reverse("admin:limits_rule_changelist")).content.decode()
    assert (
        "classic cap: <a href" in listing
        and "VIP users: at most 2 emails in any 24 hours" in listing
    )


def test_the_rules_page_shows_rules_that_never_decide_and_reserves_that_shut_sends_out(
    admin_client,
):
    gold = Segment.objects.create(slug="gold", name="Gold", priority=5)
    make_rule("Everyone 3 a day", limit=3)
    loose = make_rule("Gold 5 a day", segment="gold", limit=5)
    make_rule(
        "Kept", segment="gold", channel="push", limit=2, reserve_below_priority=8, reserve_slots=2
    )
    off = make_rule("Off", segment="gold", limit=9, enabled=False)
    page = admin_client.get(reverse("admin:limits_rule_changelist")).content.decode()
    assert 'id="rule-findings"' in page
    assert (
        "Never decides: &#x27;Everyone 3 a day&#x27; always applies with it and is at least as strict"
        in page
    )
    assert "The reserve keeps all 2 slots: sends below priority 8 are always refused." in page
    assert "disabled: it decides nothing" in page
    change = admin_client.get(reverse("admin:limits_rule_change", args=[loose.pk])).content.decode()
    assert "Never decides: &#x27;Everyone 3 a day&#x27;" in change
    # Filters: one segment's rules, the disabled ones, the classic caps' (none here).
    url = reverse("admin:limits_rule_changelist")
    assert listed(admin_client.get(url, {"segment__id__exact": gold.pk})) == [
        "Gold 5 a day",
        "Off",
        "Kept",
    ]  # by segment, then channel
    assert listed(admin_client.get(url, {"enabled__exact": "0"})) == [off.name]
    assert listed(admin_client.get(url, {"kind": "classic"})) == []
    assert listed(admin_client.get(url, {"match__exact": "any", "channel": "push"})) == ["Kept"]


def test_a_rule_saved_behind_a_stricter_one_is_flagged_at_once(admin_client):
    make_rule("Everyone 3 a day", limit=3)
    response = admin_client.post(
        reverse("admin:limits_rule_add"), rule_data(name="5 a day", limit="5"), follow=True
    )
    assert "Never decides: &#x27;Everyone 3 a day&#x27;" in response.content.decode()


def test_enable_and_disable_go_through_the_service_and_leave_classic_caps_alone(admin_client):
    vip = Segment.objects.create(slug="vip", name="VIP", priority=10)
    cap_set(segment=vip, channel="email", daily=2, weekly=None)
    rule = make_rule("mine")
    classic = Rule.objects.get(cap__isnull=False)
    response = admin_client.post(
        reverse("admin:limits_rule_changelist"),
        {"action": "disable_selected", "_selected_action": [rule.pk, classic.pk]},
        follow=True,
    )
    page = response.content.decode()
    assert "Disabled 1 rule." in page and "Left alone (classic caps change in the cap grid)" in page
    rule.refresh_from_db()
    classic.refresh_from_db()
    assert (rule.enabled, classic.enabled) == (False, True)
    assert SettingChange.objects.filter(kind="rule", object_id=rule.pk, action="changed").exists()


def test_a_segment_time_zone_is_checked_and_empty_means_the_setting(admin_client, vip, settings):
    url = reverse("admin:segments_segment_change", args=[vip.pk])
    form = admin_client.get(url).content.decode()
    assert 'list="time-zones"' in form and '<option value="Europe/Paris">' in form
    bad = admin_client.post(url, {**inline_data(vip), "time_zone": "Mars/Olympus"})
    assert "Unknown time zone &#x27;Mars/Olympus&#x27;. Use an IANA name" in bad.content.decode()
    admin_client.post(url, {**inline_data(vip), "time_zone": " Asia/Kathmandu "})
    vip.refresh_from_db()
    assert vip.time_zone == "Asia/Kathmandu"
    listing = admin_client.get(reverse("admin:segments_segment_changelist")).content.decode()
    assert (
        "Asia/Kathmandu" in listing
        and f"default ({settings.GATEKEEPER_DEFAULT_TIME_ZONE})" in listing
    )


# --- quiet hours -----------------------------------------------------------------------------


def quiet_data(**changes):
    """The quiet-hours add/change form as a browser posts it: every field, these ones changed."""
    data = {
        "enabled": "on", "segment": "", "channel": "email", "start": "21:00", "end": "08:00",
        "spread_minutes": "0",
    }  # fmt: skip
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def make_quiet(segment=None, channel="email", start="21:00", end="08:00", spread=0, **more):
    fields = QuietFields(
        segment=segment, channel=channel, start=start, end=end, spread_minutes=spread, **more
    )
    return QUIET_HOURS.create(fields=fields, via="command")


def form_errors(response) -> dict[str, list[str]]:
    """The add/change form's errors by field, as the page shows them under each field."""
    form = response.context["adminform"].form
    return {field: list(errors) for field, errors in form.errors.items()}


def test_quiet_hours_added_in_the_admin_read_in_plain_words_and_are_recorded_with_who(
    admin_client, admin_user, vip
):
    response = admin_client.post(
        reverse("admin:limits_quiethours_add"),
        quiet_data(segment=str(vip.pk), channel="all", start=" 22:30 ", spread_minutes="45"),
        follow=True,
    )
    page = response.content.decode()
    reading = (
        "VIP users: no marketing messages from 22:30 to 08:00 (the next morning), in their own "
        "time zone; sends held until then go out over 45 minutes"
    )
    assert f"It reads: {reading}." in page
    entry = QuietHours.objects.get()
    assert (entry.segment, entry.channel, f"{entry.start:%H:%M}", entry.spread_minutes) == (
        vip,
        "all",
        "22:30",
        45,
    )
    assert (entry.enabled, entry.created_by, entry.changed_by) == (True, admin_user, admin_user)
    (change,) = SettingChange.objects.filter(kind="quiet_hours", object_id=entry.pk)
    assert (change.action, change.via, change.by) == ("created", "admin", admin_user)
    assert (change.after or {})["start"] == "22:30"
    listing = admin_client.get(reverse("admin:limits_quiethours_changelist")).content.decode()
    assert reading in listing and "22:30 to 08:00 (next morning)" in listing
    assert "Transactional sends (receipts, one-time codes) are never held." in listing
    form = admin_client.get(reverse("admin:limits_quiethours_change", args=[entry.pk]))
    shown = form.content.decode()
    assert 'name="start" value="22:30"' in shown and 'name="end" value="08:00"' in shown
    assert f"Created: {reading}" in shown


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"start": "25:00"}, "start", "'25:00' is not a time of day. A time of day as HH:MM"),
        ({"start": "9:00"}, "start", "'9:00' is not a time of day"),
        ({"start": "21h"}, "start", "'21h' is not a time of day"),
        ({"start": ""}, "start", "This field is required."),
        ({"end": "24:00"}, "end", "'24:00' is not a time of day"),
        ({"end": "21:00"}, "end", "The end must differ from the start"),
        ({"spread_minutes": "721"}, "spread_minutes", "From 0 to 720 minutes (12 hours)."),
        ({"spread_minutes": "-5"}, "spread_minutes", "'-5' is not a whole number"),
        (
            {"spread_minutes": "\u0663\u0660"},
            "spread_minutes",
            "is not a whole number (digits 0-9 only)",
        ),
        (
            {"start": "08:00", "end": "21:00", "spread_minutes": "660"},
            "spread_minutes",
            "the day outside them is 11 hours long. Use less than 660.",
        ),
        ({"channel": "fax"}, "channel", "Select a valid choice. fax is not one of"),
        ({"segment": "999999"}, "segment", "Select a valid choice."),
    ],
)
def test_bad_quiet_hours_are_refused_naming_the_field_and_nothing_is_saved(
    admin_client, changes, field, message
):
    response = admin_client.post(reverse("admin:limits_quiethours_add"), quiet_data(**changes))
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == [field], errors
    assert any(message in error for error in errors[field]), errors
    assert (
        not QuietHours.objects.exists()
        and not SettingChange.objects.filter(kind="quiet_hours").exists()
    )


@pytest.mark.postgres
def test_quiet_hours_change_and_delete_go_through_the_services_and_show_in_the_history(
    admin_client, admin_user, vip
):
    entry = make_quiet(segment="vip", spread=30)
    url = reverse("admin:limits_quiethours_change", args=[entry.pk])
    response = admin_client.post(
        url, quiet_data(segment=str(vip.pk), end="07:00", spread_minutes="0"), follow=True
    )
    assert "It reads: VIP users: no marketing emails from 21:00 to 07:00" in (
        response.content.decode()
    )
    entry.refresh_from_db()
    assert (f"{entry.end:%H:%M}", entry.spread_minutes, entry.changed_by) == (
        "07:00",
        0,
        admin_user,
    )
    change = SettingChange.objects.filter(kind="quiet_hours").get(
        object_id=entry.pk, action="changed"
    )
    assert ((change.before or {})["end"], (change.after or {})["end"], change.via) == (
        "08:00",
        "07:00",
        "admin",
    )
    page = admin_client.get(url).content.decode()
    assert "end: 08:00 → 07:00; spread: 30 min → at once" in page
    # A refused change saves nothing.
    refused = admin_client.post(url, quiet_data(segment=str(vip.pk), start="07:00", end="07:00"))
    assert list(form_errors(refused)) == ["end"]
    assert SettingChange.objects.filter(kind="quiet_hours", object_id=entry.pk).count() == 2
    admin_client.post(reverse("admin:limits_quiethours_delete", args=[entry.pk]), {"post": "yes"})
    assert not QuietHours.objects.exists()
    deleted = SettingChange.objects.filter(kind="quiet_hours").get(action="deleted")
    assert (deleted.by, deleted.via, deleted.object_id) == (admin_user, "admin", entry.pk)
    log = admin_client.get(reverse("admin:limits_settingchange_changelist")).content.decode()
    assert "Deleted." in log and "end: 08:00 → 07:00" in log


def test_bulk_delete_enable_and_disable_go_through_the_services(admin_client, admin_user):
    night, lunch = make_quiet(), make_quiet(channel="push", start="12:00", end="14:00")
    url = reverse("admin:limits_quiethours_changelist")
    response = admin_client.post(
        url, {"action": "disable_selected", "_selected_action": [night.pk, lunch.pk]}, follow=True
    )
    assert "Disabled 2 entries." in response.content.decode()
    assert not QuietHours.objects.filter(enabled=True).exists()
    assert (
        SettingChange.objects.filter(kind="quiet_hours", action="changed", by=admin_user).count()
        == 2
    )
    admin_client.post(url, {"action": "enable_selected", "_selected_action": [lunch.pk]})
    assert list(QuietHours.objects.filter(enabled=True)) == [lunch]
    admin_client.post(
        url, {"action": "delete_selected", "_selected_action": [night.pk, lunch.pk], "post": "yes"}
    )
    assert not QuietHours.objects.exists()
    assert (
        SettingChange.objects.filter(kind="quiet_hours", action="deleted", via="admin").count() == 2
    )


def test_the_quiet_hours_history_is_read_only(admin_client):
    change = SettingChange.objects.filter(kind="quiet_hours").get(object_id=make_quiet().pk)
    assert admin_client.get(reverse("admin:limits_settingchange_add")).status_code == 403
    url = reverse("admin:limits_settingchange_change", args=[change.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="_save"' not in page
    delete = reverse("admin:limits_settingchange_delete", args=[change.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert SettingChange.objects.filter(kind="quiet_hours", pk=change.pk).exists()


def test_viewers_read_quiet_hours_marketers_change_them_and_both_find_them(client, staff, vip):
    entry = make_quiet(segment="vip")
    staff("vic", VIEWER)
    client.login(username="vic", password="a-long-test-password")
    index = client.get(reverse("admin:index")).content.decode()
    listing_url = reverse("admin:limits_quiethours_changelist")
    assert f'href="{listing_url}"' in index and "Quiet hours" in index
    assert "VIP users: no marketing emails" in client.get(listing_url).content.decode()
    assert client.get(reverse("admin:limits_quiethours_add")).status_code == 403
    change = reverse("admin:limits_quiethours_change", args=[entry.pk])
    assert client.post(change, quiet_data(end="07:00")).status_code == 403
    entry.refresh_from_db()
    assert f"{entry.end:%H:%M}" == "08:00"
    segment = client.get(reverse("admin:segments_segment_change", args=[vip.pk])).content.decode()
    mine = f"{listing_url}?segment__id__exact={vip.pk}"
    assert f'href="{mine}" class="quiet-hours-link"' in segment
    staff("mia", MARKETER)
    client.login(username="mia", password="a-long-test-password")
    saved = client.post(change, quiet_data(segment=str(vip.pk), end="07:00"))
    assert saved.status_code == 302
    entry.refresh_from_db()
    assert (f"{entry.end:%H:%M}", entry.changed_by.username) == ("07:00", "mia")


def test_a_rule_of_a_channel_no_longer_configured_is_left_alone_not_an_error(
    admin_client, settings
):
    settings.GATEKEEPER_CHANNELS = ["email", "push", "sms"]
    rule = make_rule("Texts 1 a day", channel="sms")
    kept = make_rule("Mails")
    settings.GATEKEEPER_CHANNELS = ["email", "push"]  # sms removed since
    response = admin_client.post(
        reverse("admin:limits_rule_changelist"),
        {"action": "disable_selected", "_selected_action": [rule.pk, kept.pk]},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Disabled 1 rule." in page and "Left alone: Texts 1 a day (" in page
    rule.refresh_from_db()
    assert rule.enabled  # nothing half-written


def test_two_changes_of_different_fields_made_at_once_both_stay(db):
    from limits.policy.services import QUIET_HOURS, RULES

    rule = make_rule("Mails", limit=3)
    stale = Rule.objects.get(pk=rule.pk)  # read by one marketer's page
    RULES.update(row=Rule.objects.get(pk=rule.pk), changes={"limit": 7}, via="api")
    RULES.update(row=stale, changes={"name": "Mails, 7 a day"}, via="admin")
    rule.refresh_from_db()
    assert (rule.name, rule.limit) == ("Mails, 7 a day", 7)

    entry = QUIET_HOURS.create(
        fields=QuietFields(segment=None, channel="all", start="21:00", end="08:00",
                           spread_minutes=0),
        via="command",
    )  # fmt: skip
    stale_entry = QuietHours.objects.get(pk=entry.pk)
    QUIET_HOURS.update(row=QuietHours.objects.get(pk=entry.pk), changes={"end": "09:00"}, via="api")
    QUIET_HOURS.update(row=stale_entry, changes={"spread_minutes": 30}, via="admin")
    entry.refresh_from_db()
    assert (f"{entry.end:%H:%M}", entry.spread_minutes) == ("09:00", 30)
