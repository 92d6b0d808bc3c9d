"""The suppression list in the admin: a marketer searches it by user id, adds a user and takes
users off through the service (journalled, and the gate follows); a viewer only reads it."""

import pytest

from limits.models.people import Suppression, SuppressionChange
from limits.people.suppression import suppress, suppression_cache
from worker.gate import gate_check

pytestmark = pytest.mark.django_db

LIST = "/admin/limits/suppression/"


def test_a_marketer_searches_adds_and_removes_and_the_gate_follows(
    marketer_client, published, django_capture_on_commit_callbacks
):
    published(vip=(10, [1], {}))
    suppress(channel="email", user_ids=[41, 42], reason="bounced", source="esp:postmark")
    found = marketer_client.get(LIST, {"q": "42"})
    assert found.status_code == 200
    assert list(found.context["cl"].result_list.values_list("user_id", flat=True)) == [42]
    bad = marketer_client.get(LIST, {"q": "forty-two"}, follow=True)
    assert bad.status_code == 200 and not bad.context["cl"].result_list
    assert "is not a whole number" in bad.content.decode()

    with django_capture_on_commit_callbacks(execute=True):
        added = marketer_client.post(
            f"{LIST}add/",
            {"channel": "all", "user_id": " 7 ", "reason": "manual", "note": "asked by phone"},
        )
    assert added.status_code == 302, added.content.decode()[:2000]
    row = Suppression.objects.get(user_id=7)
    assert (row.channel, row.reason, row.source, row.note, row.created_by.username) == (
        "all",
        "manual",
        "admin",
        "asked by phone",
        "mia",  # the marketer
    )
    assert gate_check(channel="push", requests=[(7, "p7")])[0].reason == "suppressed"

    refused = marketer_client.post(
        f"{LIST}add/", {"channel": "email", "user_id": "-3", "reason": "manual"}
    )
    assert refused.status_code == 200 and "not a whole number" in refused.content.decode()

    ids = list(Suppression.objects.filter(user_id__in=[7, 41]).values_list("pk", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        gone = marketer_client.post(
            LIST, {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
        )
    assert gone.status_code == 302
    assert list(Suppression.objects.values_list("user_id", flat=True)) == [42]
    removed = SuppressionChange.objects.filter(action="removed").values_list("user_id", "source")
    assert sorted(removed) == [(7, "admin"), (41, "admin")]
    suppression_cache().read_now()
    assert gate_check(channel="push", requests=[(7, "p7b")])[0].reason == "allowed"


def test_a_viewer_reads_the_list_and_its_journal_but_changes_nothing(viewer_client):
    suppress(channel="email", user_ids=[5], reason="complained", source="esp:sendgrid")
    assert viewer_client.get(LIST).status_code == 200
    assert viewer_client.get("/admin/limits/suppressionchange/").status_code == 200
    assert viewer_client.get(f"{LIST}add/").status_code == 403
    row = Suppression.objects.get()
    assert viewer_client.post(f"{LIST}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Suppression.objects.count() == 1
