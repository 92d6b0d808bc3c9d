"""The admin pages through Django's test client."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from limits.models import Cap, CapChange
from segments.models import Build, Segment, UserList

pytestmark = pytest.mark.django_db


@pytest.fixture
def vip(db):
    return Segment.objects.create(slug="vip", name="VIP", priority=10)


def inline_data(segment, upload=None):
    data = {
        "name": segment.name, "slug": segment.slug, "priority": segment.priority, "description": "",
        "user_lists-TOTAL_FORMS": "1", "user_lists-INITIAL_FORMS": "0",
        "user_lists-MIN_NUM_FORMS": "0", "user_lists-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    if upload is not None:
        data["user_lists-0-upload"] = upload
    return data


@pytest.mark.parametrize(
    "page",
    ["segments_segment", "limits_cap", "limits_capchange", "segments_build", "worker_sendjob"],
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
    (change,) = CapChange.objects.filter(via="admin")
    assert (change.new_daily, change.new_weekly, change.changed_by) == (3, 2, admin_user)
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

    from tests import broker

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
