"""A privacy officer answers a person's requests in the admin, in headless Chromium: she looks
the person up, downloads everything held about them, then erases them; the erasure is listed
with who asked and how far it got, never whom. A viewer sees neither button."""

import json

import pytest
from django.contrib.auth.models import Permission

from gatekeeper.lib.groups import VIEWER
from limits.models.privacy import Erasure
from limits.privacy.erasure import erasure_run
from tests.support.admin import PASSWORD
from tests.support.browser import Page
from worker.gate import gate_check

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PERSON = 987_654_321


def test_an_officer_exports_then_erases_a_person(browser, live_server, published, staff, client):
    published(vip=(10, [1, 2], {"email": (5, 10)}))
    (sent,) = gate_check(channel="email", requests=[(PERSON, "welcome:1")], campaign="welcome")
    assert sent.allowed
    officer = staff("olga", VIEWER)
    officer.user_permissions.add(
        *Permission.objects.filter(codename__in=["erase_users", "view_erasure"])
    )
    page = Page(browser, live_server.url, prefix="erase-")
    page.log_in("olga", f"/admin/users/?user_id={PERSON}")
    page.wait_for(lambda: f"User {PERSON}" in page.text(), "the lookup")
    assert page.find("#export-person").get_attribute("href").endswith(f"/users/{PERSON}/export/")
    # The download, as the browser would fetch it (a file: the browser saves it).
    client.login(username="olga", password=PASSWORD)
    download = client.get(f"/admin/users/{PERSON}/export/")
    assert download["Content-Disposition"] == f'attachment; filename="user-{PERSON}.json"'
    document = json.loads(download.content)
    assert document["user_id"] == PERSON and len(document["send_log"]) == 1
    page.shot("lookup")

    page.click("#erase-person")
    page.wait_for(lambda: "This cannot be undone" in page.text(), "the confirmation")
    assert "send_jobs" in page.find("#erase-places").text
    page.shot("confirm")
    page.click("#confirm-erase")
    page.wait_for(lambda: "Erasure " in page.text() and "started" in page.text(), "the erasure")
    (erasure,) = Erasure.objects.all()
    assert (erasure.count, erasure.via, erasure.requested_by) == (1, "admin", officer)
    assert str(PERSON) not in page.text()  # the erasure's page names who asked, not whom
    page.shot("erasure")
    (refused,) = gate_check(channel="email", requests=[(PERSON, "again:1")], campaign="again")
    assert refused.reason == "suppressed"
    assert erasure_run(erasure.pk) is not None
    page.open("/admin/limits/erasure/")
    page.wait_for(lambda: "olga" in page.text() and "admin" in page.text(), "the list")

    staff("vic", VIEWER)
    viewer = Page(browser, live_server.url, prefix="erase-viewer-")
    browser.delete_all_cookies()
    viewer.log_in("vic", f"/admin/users/?user_id={PERSON}")
    viewer.wait_for(lambda: f"User {PERSON}" in viewer.text(), "the lookup")
    assert "Erase this person" not in viewer.text()
    viewer.open(f"/admin/users/{PERSON}/erase/")
    viewer.wait_for(lambda: "403" in viewer.text() or "Forbidden" in viewer.text(), "a refusal")
