"""The admin of cap experiments through Django's test client: made from a form without JSON
(every problem shown on the arm it is about, nothing made while one is left), read with its
arms and history in words, renamed and moved while it runs, stopped and concluded from its page
(each step in its history, via admin); a Viewer reads it all and changes nothing; the user
lookup links a user's experiment to its page."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse

from limits.models.policy import Rule, SettingChange
from limits.models.studies import Experiment
from limits.studies.experiments import ArmFields, ExperimentFields, experiment_create
from segments.models import Segment

pytestmark = pytest.mark.django_db

DAY = {"kind": "rolling", "seconds": 86_400}
ADD = reverse("admin:limits_experiment_add")
PICKED = "%Y-%m-%dT%H:%M"


@pytest.fixture
def vip(db):
    """The VIP segment, with a rule of its own: 2 emails a day."""
    segment = Segment.objects.create(slug="vip", name="VIP", priority=10)
    Rule.objects.create(
        name="2 a day", segment=segment, channel="email", window_seconds=86_400, limit=2
    )
    return segment


def arm_data(n: int, name: str = "", share: str = "", limit: str = "", **more: str) -> dict:
    """Arm n of the add form as a browser sends it (its selects always carry a value)."""
    return {
        f"arm{n}_name": name,
        f"arm{n}_share": share,
        f"arm{n}_mode": more.get("mode", "replace"),
        f"arm{n}_channel": more.get("channel", "email"),
        f"arm{n}_limit": limit,
        f"arm{n}_window": more.get("window", "rolling-1d"),
    }


def form_data(*arms: dict, **more: str) -> dict:
    ends = datetime.now(UTC) + timedelta(days=14)
    data = {"name": "1 a day or 3 a week", "segment": "vip", "starts_at": "",
            "ends_at": f"{ends:{PICKED}}", **more}  # fmt: skip
    given = list(arms) or [
        arm_data(1, "1 a day", "50", "1"),
        arm_data(2, "3 a week", "50", "3", mode="add", window="calendar-week"),
    ]
    for n in range(len(given) + 1, 6):
        given.append(arm_data(n))
    for arm in given:
        data.update(arm)
    return data


def make(*, starts_in: timedelta = timedelta(0), segment: str | None = "vip") -> Experiment:
    now = datetime.now(UTC)
    rule = {"channel": "email", "window": DAY}
    return experiment_create(
        ExperimentFields(
            name="One or three",
            segment=segment,
            arms=[
                ArmFields("one", 0.5, [{**rule, "name": "1 a day", "limit": 1}]),
                ArmFields("three", 0.5, [{**rule, "name": "3 a day", "limit": 3}], "add"),
            ],
            starts_at=now + starts_in,
            ends_at=now + starts_in + timedelta(days=14),
        ),
        via="api",
        now=now,
    )


def page_of(row: Experiment) -> str:
    return reverse("admin:limits_experiment_change", args=[row.pk])


def text(response: Any) -> str:
    return response.content.decode()


def errors_of(response: Any) -> dict[str, list[str]]:
    """The errors of the form a page was drawn with, by field (`__all__`: the form's own)."""
    return response.context["form"].errors


def test_the_add_form_makes_an_experiment_of_two_arms_recorded_via_admin(
    admin_client, admin_user, vip
):
    shown = text(admin_client.get(ADD))
    assert "Arm 5 (optional" in shown and 'name="arm5_window"' in shown
    assert "calendar week (Monday to Sunday)" in shown
    made = admin_client.post(ADD, form_data())
    row = Experiment.objects.get()
    assert made.status_code == 302 and made["Location"] == page_of(row)
    assert (row.name, row.segment, row.state) == ("1 a day or 3 a week", vip, "active")
    one, three = row.arms.all()
    assert (one.name, one.share, one.mode, three.mode) == ("1 a day", 0.5, "replace", "add")
    assert one.rules == [{"name": "1 a day", "channel": "email", "match": "any", "tag": None,
                          "window": DAY, "limit": 1, "reserve": None}]  # fmt: skip
    assert three.rules[0]["window"] == {"kind": "calendar", "unit": "week"}
    assert row.salt and row.starts_at <= datetime.now(UTC) < row.ends_at
    (change,) = SettingChange.objects.filter(kind="experiment").all()
    assert (change.action, change.via, change.by) == ("created", "admin", admin_user)
    assert "'1 a day' 50% (replacing its rules: 1 a day)" in change.words
    listing = text(admin_client.get(reverse("admin:limits_experiment_changelist")))
    assert "1 a day or 3 a week" in listing and "running" in listing
    assert "VIP users: at most 1 email in any 24 hours" in listing
    assert "VIP users: at most 3 emails per calendar week" in listing


def test_a_third_arm_counts_only_when_typed_and_every_segment_is_a_choice(admin_client, vip):
    data = form_data(
        arm_data(1, "a", "30", "1"),
        arm_data(2, "b", "30", "2"),
        arm_data(3),  # left empty: no arm 3
        arm_data(4, "d", "30", "5", channel="all", window="calendar-month"),
        segment="",
    )
    assert admin_client.post(ADD, data).status_code == 302
    row = Experiment.objects.get()
    assert row.segment is None
    assert [(a.name, a.rules[0]["channel"]) for a in row.arms.all()] == [
        ("a", "email"), ("b", "email"), ("d", "all"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("arms", "field", "message"),
    [
        ((arm_data(1, "a", "60", "1"), arm_data(2, "b", "50", "2")),
         None, "Arms: The arms&#x27; shares add up to 110.0%: at most 100 %."),
        ((arm_data(1, "a", "50", "1"), arm_data(2, "b", "50", "-1")),
         "arm2_limit", "Limit: &#x27;-1&#x27; is not a whole number (digits 0-9 only)."),
        ((arm_data(1, "a", "50", "1"), arm_data(2, "b", "50", "")),
         "arm2_limit", "Give its rule a limit"),
        ((arm_data(1, "a", "50", "1"), arm_data(2, "b", "0", "2")),
         "arm2_share", "Above 0 and at most 100 (%)."),
        ((arm_data(1, "a", "30", "1"), arm_data(2, "b", "30", "2"), arm_data(3),
          arm_data(4, "a", "30", "3")),
         "arm4_name", "&#x27;a&#x27; names another arm: each its own name."),
        ((arm_data(1, "a", "50", "1"),), "arm2_name", "Give the arm a name"),
    ],
)  # fmt: skip
def test_a_bad_form_shows_each_problem_on_its_arm_and_makes_nothing(
    admin_client, vip, arms, field, message
):
    refused = admin_client.post(ADD, form_data(*arms))
    assert refused.status_code == 200
    assert "Nothing was made" in text(refused) and message in text(refused)
    errors = errors_of(refused)
    assert field in errors if field else "__all__" in errors
    assert (
        not Experiment.objects.exists()
        and not SettingChange.objects.filter(kind="experiment").exists()
    )


def test_an_overlap_and_a_start_in_the_past_are_refused_on_their_fields(admin_client, vip):
    make()
    overlap = admin_client.post(ADD, form_data())
    assert "a user is in one experiment at a time" in text(overlap)
    assert "segment" in errors_of(overlap)
    past = f"{datetime.now(UTC) - timedelta(days=1):{PICKED}}"
    early = admin_client.post(ADD, form_data(starts_at=past, segment=""))
    assert "starts_at" in errors_of(early)
    assert Experiment.objects.count() == 1


def test_what_the_writer_refuses_itself_is_mapped_onto_the_form_too(admin_client, vip, monkeypatch):
    """Another experiment made between the form's check and the write: the writer's own
    ValidationError lands on the fields it names."""
    monkeypatch.setattr("limits.studies.admin.experiment_problems", lambda *a, **k: {})
    data = form_data(arm_data(1, "a", "60", "1"), arm_data(2, "a", "50", "2"))
    refused = admin_client.post(ADD, data)
    assert refused.status_code == 200
    errors = errors_of(refused)
    assert "names another arm" in errors["arm2_name"][0]
    assert "add up to 110.0%" in errors["__all__"][0]
    assert not Experiment.objects.exists()


def test_a_problem_without_a_field_of_its_own_names_the_arm_as_the_form_numbers_it():
    from limits.studies.admin import label_of

    assert label_of("arms.2.rules.0.reserve", [1, 2, 4]) == "Arm 4, rule 1, reserve"
    assert label_of("arms.1.rules") == "Arm 2, rules"
    assert label_of("salt") == "Salt"


def test_its_page_shows_arms_words_and_history_and_changes_its_name_and_end(
    admin_client, admin_user, vip
):
    row = make()
    page = text(admin_client.get(page_of(row)))
    assert 'id="experiment-status">running<' in page
    assert "VIP users: at most 1 email in any 24 hours (at least 24 hours apart)" in page
    assert "replacing the segment&#x27;s own rules" in page and "50 %" in page
    assert "On segment &#x27;vip&#x27;, from" in page  # the experiment in words
    assert 'id="experiment-history"' in page and "<td>created</td>" in page
    assert 'id="stop-experiment"' in page and 'id="conclude-experiment"' in page
    later = row.ends_at.replace(second=0, microsecond=0) + timedelta(days=2)
    saved = admin_client.post(
        page_of(row), {"name": " One or 3 ", "ends_at": f"{later:{PICKED}}"}, follow=True
    )
    assert "Changed its name and its end" in text(saved)
    row.refresh_from_db()
    assert (row.name, row.ends_at) == ("One or 3", later)
    change = SettingChange.objects.filter(kind="experiment").get(action="changed")
    assert (change.via, change.by) == ("admin", admin_user)
    assert (change.before or {}).get("name") == "One or three"
    # Left as shown: nothing changes, nothing is recorded.
    same = admin_client.post(page_of(row), {"name": "One or 3", "ends_at": f"{later:{PICKED}}"})
    assert same.status_code == 302 and SettingChange.objects.filter(kind="experiment").count() == 2
    # An end in the past is the writer's to refuse: said on the field, nothing changed.
    past = f"{datetime.now(UTC) - timedelta(hours=1):{PICKED}}"
    refused = admin_client.post(page_of(row), {"name": "One or 3", "ends_at": past})
    assert "stop it to end it now" in errors_of(refused)["ends_at"][0]
    row.refresh_from_db()
    assert row.ends_at == later


def test_stop_now_is_audited_and_a_second_stop_is_told_not_now(admin_client, admin_user, vip):
    row = make()
    stop = reverse("admin:limits_experiment_stop", args=[row.pk])
    assert admin_client.get(stop).status_code == 405
    stopped = admin_client.post(stop, follow=True)
    assert "Stopped &#x27;One or three&#x27;: every user is back" in text(stopped)
    row.refresh_from_db()
    assert row.state == "stopped" and row.stopped_at is not None
    change = SettingChange.objects.filter(kind="experiment").get(action="stopped")
    assert (change.via, change.by) == ("admin", admin_user)
    page = text(admin_client.get(page_of(row)))
    assert 'id="stop-experiment"' not in page and 'id="experiment_form"' not in page
    assert 'id="conclude-experiment"' in page  # a stopped one may still be concluded
    again = admin_client.post(stop, follow=True)
    assert "The experiment is already stopped." in text(again)
    assert SettingChange.objects.filter(kind="experiment", action="stopped").count() == 1


def test_conclude_promotes_the_arm_says_what_it_did_and_is_audited(admin_client, admin_user, vip):
    row = make()
    conclude = reverse("admin:limits_experiment_conclude", args=[row.pk])
    wrong = admin_client.post(conclude, {"arm": "nine"}, follow=True)
    assert "No arm &#x27;nine&#x27;. Arms: one, three." in text(wrong)
    done = admin_client.post(conclude, {"arm": "one"}, follow=True)
    assert (
        "Concluded: arm &#x27;one&#x27; promoted to segment &#x27;vip&#x27;: made &#x27;1 a day"
        "&#x27;; disabled &#x27;2 a day&#x27;." in text(done)
    )
    row.refresh_from_db()
    assert (row.state, row.concluded_arm) == ("concluded", "one")
    promoted = Rule.objects.get(name="1 a day")
    assert (promoted.segment, promoted.limit) == (vip, 1)
    assert not Rule.objects.get(name="2 a day").enabled
    assert SettingChange.objects.filter(kind="rule", via="experiment").count() == 2
    change = SettingChange.objects.filter(kind="experiment").get(action="concluded")
    assert (change.via, change.by) == ("admin", admin_user)
    page = text(admin_client.get(page_of(row)))
    assert 'id="conclude-experiment"' not in page and 'id="stop-experiment"' not in page
    assert "promoted</span>" in page and "<td>concluded</td>" in page
    again = admin_client.post(conclude, {"arm": "three"}, follow=True)
    assert "Already concluded." in text(again)


def test_a_scheduled_one_can_be_stopped_but_not_concluded(admin_client, vip):
    row = make(starts_in=timedelta(days=1))
    page = text(admin_client.get(page_of(row)))
    assert 'id="experiment-status">scheduled<' in page
    assert 'id="stop-experiment"' in page and 'id="conclude-experiment"' not in page
    conclude = reverse("admin:limits_experiment_conclude", args=[row.pk])
    refused = admin_client.post(conclude, {"arm": "one"}, follow=True)
    assert "The experiment is scheduled: nothing to conclude yet." in text(refused)
    row.refresh_from_db()
    assert row.state == "active"


def test_a_viewer_reads_it_all_and_changes_nothing(viewer_client, vip):
    row = make()
    page = viewer_client.get(page_of(row))
    assert page.status_code == 200 and "VIP users: at most 3 emails" in text(page)
    assert 'id="stop-experiment"' not in text(page)
    assert 'id="conclude-experiment"' not in text(page)
    assert 'id="experiment_form"' not in text(page)
    listing = reverse("admin:limits_experiment_changelist")
    assert viewer_client.get(listing).status_code == 200
    assert viewer_client.get(ADD).status_code == 403
    assert viewer_client.post(ADD, form_data()).status_code == 403
    for name, data in (("stop", {}), ("conclude", {"arm": "one"})):
        url = reverse(f"admin:limits_experiment_{name}", args=[row.pk])
        assert viewer_client.post(url, data).status_code == 403
    renamed = viewer_client.post(page_of(row), {"name": "Mine", "ends_at": "2031-01-01T00:00"})
    assert renamed.status_code == 403
    row.refresh_from_db()
    assert (row.state, row.name) == ("active", "One or three")
    assert SettingChange.objects.filter(kind="experiment").count() == 1
    history = reverse("admin:limits_settingchange_changelist")
    assert viewer_client.get(history).status_code == 200


def test_experiments_are_history_never_deleted_and_their_changes_read_only(admin_client, vip):
    row = make()
    delete = reverse("admin:limits_experiment_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert 'value="delete_selected"' not in text(
        admin_client.get(reverse("admin:limits_experiment_changelist"))
    )
    change = SettingChange.objects.filter(kind="experiment").get()
    listing = text(admin_client.get(reverse("admin:limits_settingchange_changelist")))
    assert "One or three" in listing and "created" in listing
    url = reverse("admin:limits_settingchange_change", args=[change.pk])
    assert 'name="_save"' not in text(admin_client.get(url))
    assert admin_client.get(reverse("admin:limits_settingchange_add")).status_code == 403
    assert Experiment.objects.filter(pk=row.pk).exists()


def test_the_status_filter_reads_the_clock(admin_client, vip):
    running = make()
    scheduled = make(starts_in=timedelta(days=30))
    listing = reverse("admin:limits_experiment_changelist")
    for status, row in (("running", running), ("scheduled", scheduled)):
        shown = admin_client.get(listing, {"status": status})
        assert list(shown.context["cl"].result_list) == [row]


@pytest.mark.django_db(transaction=True)
def test_the_user_lookup_links_a_users_experiment_to_its_page(viewer_client, published):
    from limits.policy.selectors import policy_cache

    published(vip=(10, [1, 2], {}))
    row = make()  # its two arms share every user
    policy_cache().invalidate()
    page = text(viewer_client.get(reverse("admin:user_lookup"), {"user_id": "1"}))
    assert f'In experiment <a href="{page_of(row)}">{row.pk}</a>' in page
    assert viewer_client.get(page_of(row)).status_code == 200
