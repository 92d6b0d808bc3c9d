"""A marketer's afternoon in headless Chromium against a live server, a real Celery worker for
the build, real Redis and a real published snapshot. Each step saves a screenshot under
test-output/screenshots/ (look at them: the pages must read well, not only pass)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.lib.groups import MARKETER
from limits.engine.log import stored_message_hash
from limits.models.people import Suppression, SuppressionChange
from limits.models.policy import QuietHours, Rule, SettingChange
from limits.people.suppression import suppress
from segments.models import Segment
from segments.selectors import snapshot_live_version
from tests.support import broker
from tests.support.browser import Page
from tests.support.celery_workers import start_celery_worker, stop_celery_worker, worker_env
from worker.gate import gate_check

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def build_worker(settings) -> Iterator[None]:
    """A real Celery worker on the `builds` queue of the tests' broker (tests/settings.py),
    where the live server queues its builds."""
    broker.clear("builds")
    process = start_celery_worker("builds", worker_env(settings.CELERY_BROKER_URL))
    yield
    stop_celery_worker(process)


def test_a_marketer_uploads_builds_edits_caps_and_rules_rolls_back_looks_up_and_runs_a_what_if(
    browser, live_server, published, staff, build_worker, tmp_path
):
    first = published(
        gold=(5, [6, 7], {}),
        vip=(10, [1, 2, 3], {"email": (2, 5), "all": (3, 9)}),
        dormant=(20, [4, 5], {"email": (0, 0)}),
    )
    staff("mia", MARKETER)
    gate_check(
        channel="email",
        requests=[(1, "spring:1"), (4, "spring:4"), (9, "spring:9")],
        campaign="spring",
    )
    page = Page(browser, live_server.url)

    # Log in as a marketer (staff in the Marketer group, not a superuser).
    page.log_in("mia", "/admin/", shot=True)
    page.wait_for(lambda: "Marketing console" in page.text(), "the admin index")
    page.shot("index")

    # The dashboard, charts drawn by Chart.js.
    page.click(".gk-cards a[href$='/dashboard/']")
    page.wait_for_charts()
    assert first in page.text()
    page.shot("dashboard")

    # Upload a list to the VIP segment.
    vip = Segment.objects.get(slug="vip")
    upload = tmp_path / "vip-more.txt"
    upload.write_text("user_id\n1\n2\n3\n42\n")
    page.open(f"/admin/segments/segment/{vip.pk}/change/")
    page.find("input[type=file][name^='user_lists-']:not([disabled])").send_keys(str(upload))
    page.click("input[name='_continue']")
    page.wait_for(lambda: "vip-more.txt: stored" in page.text().lower(), "the upload message")
    page.shot("segment-upload")

    # Build and publish, and watch the progress bar reach 100%.
    page.open("/admin/snapshots/")
    page.shot("snapshots-before-build")
    page.click("#build-and-publish")
    page.wait_for(lambda: "100% · succeeded" in page.text(), "the build to finish")
    assert page.find("#build-status").text == "succeeded"
    second = snapshot_live_version()
    assert second != first and second in page.find("#build-version").text
    page.driver.refresh()
    assert "lost to higher priorities" in page.text().lower()
    page.shot("build-done")

    # Edit a cap in the grid and see it govern the next gate call.
    page.open(f"/admin/segments/segment/{vip.pk}/caps/")
    page.type("#id_email-daily", "0")
    page.type("#id_email-weekly", "0")
    page.click("input[name=save]")
    page.wait_for(lambda: "Saved caps of Vip" in page.text(), "the saved message")
    assert "No marketing emails" in page.text()
    page.shot("cap-grid-saved")
    decision = gate_check(channel="email", requests=[(2, "summer:2")], campaign="summer")[0]
    assert (decision.allowed, decision.reason) == (False, "blocked")

    # Roll back to the first version, confirming first.
    page.open("/admin/snapshots/")
    page.click(f"a[href$='/snapshots/{first}/make-live/']")
    page.wait_for(
        lambda: "Make " in page.text() and "the live snapshot?" in page.text(), "the confirmation"
    )
    page.shot("make-live-confirm")
    assert snapshot_live_version() == second
    page.click("#confirm-make-live")
    page.wait_for(lambda: f"{first} is live" in page.text(), "the rollback message")
    assert snapshot_live_version() == first
    page.shot("snapshots-after-rollback")

    # Look a user up, then reset their quota.
    page.open("/admin/users/")
    page.type("#id_user_id", "1")
    page.click("#lookup input[type=submit]")
    page.wait_for(lambda: "User 1: segment vip" in page.text(), "the lookup")
    assert stored_message_hash("spring:1").hex()[:8] in page.find("#recent-sends").text
    page.shot("user-lookup")
    page.click("#reset-quota")
    page.type("#id_reason", "asked by support, ticket 7")
    page.shot("quota-reset-confirm")
    page.click("#confirm-reset")
    page.wait_for(lambda: "quota is reset" in page.text(), "the reset message")
    page.shot("user-after-reset")

    # What if VIP could get one email a day again?
    page.open("/admin/what-if/")
    from selenium.webdriver.support.ui import Select

    Select(page.find("#id_segment")).select_by_visible_text(vip.name)
    page.type("input[name='vip|email|daily']", "1")
    page.type("input[name='vip|email|weekly']", "5")
    page.click("#run-what-if")
    page.wait_for(lambda: "refused under the draft" in page.text().lower(), "the what-if result")
    rows = [r.text for r in browser.find_elements(page.by.CSS_SELECTOR, "#what-if-result tbody tr")]
    assert rows and rows[0].startswith("Vip email 3 3 0 -3"), rows
    page.shot("what-if")

    # Gold's users live in Kathmandu: their calendar days start at their midnight.
    gold = Segment.objects.get(slug="gold")
    page.open(f"/admin/segments/segment/{gold.pk}/change/")
    page.type("#id_time_zone", "Asia/Kathmandu")
    page.click("input[name='_continue']")
    page.wait_for(lambda: "was changed successfully" in page.text(), "the segment saved")
    gold.refresh_from_db()
    assert gold.time_zone == "Asia/Kathmandu"

    # The rules page reads every rule out, the classic caps' too; then a rule of her own.
    page.open("/admin/")
    page.click(".gk-cards a[href$='/limits/rule/']")
    page.wait_for(
        lambda: "Cap rules" in page.text() and "To look at" in page.text(), "the rules page"
    )
    assert "Vip users: no emails" in page.text()  # the cap grid's 0 above, as a rule
    page.shot("rules")
    page.click(".object-tools a.addlink")
    page.wait_for(lambda: "Add rule" in page.text(), "the add form")
    page.type("#id_name", "1 promo a day")
    page.choose("#id_segment", "Gold")
    page.choose("#id_channel", "email")
    page.choose("#id_match", "sends carrying a tag")
    page.type("#id_tag", "promo")
    page.choose("#id_window_kind", "calendar, in the user's time zone")
    assert not page.find("#id_window_seconds").is_displayed()  # only the calendar's fields
    page.choose("#id_window_unit", "day")
    page.type("#id_limit", "1")
    page.shot("rule-add")
    page.click("input[name='_save']")
    reading = "Gold users: at most 1 promo-tagged email per calendar day, in their own time zone"
    page.wait_for(lambda: f"It reads: {reading}." in page.text(), "the rule saved")
    assert reading in page.find("#result_list").text
    page.shot("rule-added")
    decisions = gate_check(
        channel="email", requests=[(6, "promo:6"), (6, "promo-2:6")], tags=("promo",)
    )
    assert [d.reason for d in decisions] == ["allowed", "daily_cap"]
    assert (decisions[1].rule or {}).get("name") == "1 promo a day"

    # A looser rule behind it never decides: she is told when she saves it, and on the list.
    page.click(".object-tools a.addlink")
    page.wait_for(lambda: "Add rule" in page.text(), "the add form")
    page.type("#id_name", "2 promos a day")
    page.choose("#id_segment", "Gold")
    page.choose("#id_match", "sends carrying a tag")
    page.type("#id_tag", "promo")
    page.choose("#id_window_kind", "calendar, in the user's time zone")
    page.choose("#id_window_unit", "day")
    page.type("#id_limit", "2")
    page.click("input[name='_save']")
    page.wait_for(lambda: "Never decides: '1 promo a day'" in page.text(), "the finding")
    findings = page.find("#rule-findings").text
    assert "2 promos a day" in findings and "Never decides: '1 promo a day'" in findings
    page.shot("rule-finding")
    assert Rule.objects.filter(cap__isnull=True).count() == 2
    page.find("#rule-findings").find_element(page.by.LINK_TEXT, "2 promos a day").click()
    page.wait_for(lambda: "Change rule" in page.text(), "the rule's page")
    assert "Never decides: '1 promo a day'" in page.find(".field-findings").text
    assert "Created: Gold users: at most 2 promo-tagged emails" in page.find("#rule-history").text
    assert "mia" in page.find("#rule-history").text
    page.shot("rule-change")
    # A classic cap's rule is shown, not edited: it changes in its segment's cap grid.
    classic = Rule.objects.get(cap__segment=vip, channel="email", window_seconds=86_400)
    page.open(f"/admin/limits/rule/{classic.pk}/change/")
    page.wait_for(lambda: "View rule" in page.text(), "the classic rule's page")
    assert not browser.find_elements(page.by.CSS_SELECTOR, "input[name='_save']")
    page.shot("rule-classic")
    page.click(".cap-grid-link")
    page.wait_for(lambda: "Caps of Vip" in page.text(), "the cap grid from the rule")

    # What if Gold got one more promo email?
    page.open("/admin/what-if/")
    page.choose("#id_segment", "Gold")
    page.choose("#id_channel", "email")
    page.type("#id_tags", "promo")
    page.type("#id_priority", "7")
    page.click("#run-what-if")
    page.wait_for(lambda: "refused by" in page.text().lower(), "the what-if by rule")
    assert page.rows("#what-if-by-rule tbody tr") == ["email 1 promo a day 1"]
    assert "tagged promo, at priority 7" in page.text()
    page.shot("what-if-by-rule")

    # User 6's page: Kathmandu time, the rule full until their next midnight.
    page.open("/admin/users/?user_id=6")
    page.wait_for(lambda: "User 6: segment gold" in page.text(), "the lookup of user 6")
    assert "Time zone Asia/Kathmandu (their segment's)" in page.find("#user-zone").text
    rules = page.rows("#rules tbody tr")
    promo = next(r for r in rules if r.startswith("1 promo a day"))
    assert reading in promo and "email 1 / 1 0 in " in promo, rules
    assert "promo" in page.find("#recent-sends").text
    page.shot("user-lookup-rules")


def test_a_marketer_sets_quiet_hours_reads_them_in_plain_words_and_is_told_a_bad_time(
    browser, live_server, staff
):
    owls = Segment.objects.create(slug="night-owls", name="Night owls", priority=5)
    staff("mia", MARKETER)
    page = Page(browser, live_server.url, prefix="quiet-")
    page.log_in("mia", "/admin/")
    page.wait_for(lambda: "Marketing console" in page.text(), "the admin index")

    # From the index's console to the quiet hours, then "Add".
    page.click(".gk-cards a[href$='/limits/quiethours/']")
    page.wait_for(lambda: "own clock" in page.text(), "the quiet hours page")
    assert "Transactional sends (receipts, one-time codes) are never held." in page.text()
    page.click(".object-tools a.addlink")
    page.wait_for(lambda: "Add quiet hours" in page.text(), "the add form")
    page.choose("#id_segment", "Night owls")
    page.choose("#id_channel", "all channels together")
    page.type("#id_start", "21:00")
    page.type("#id_end", "25:00")
    page.type("#id_spread_minutes", "30")
    page.shot("add")
    page.click("input[name='_save']")

    # A time that is no time of day: refused, said under the field, nothing saved.
    page.wait_for(lambda: "Please correct the error" in page.text(), "the refusal")
    assert "'25:00' is not a time of day. A time of day as HH:MM, 00:00 to 23:59." in (
        page.find(".field-end .errorlist").text
    )
    assert not browser.find_elements(page.by.CSS_SELECTOR, ".field-start .errorlist")
    assert page.find("#id_start").get_attribute("value") == "21:00"  # what she typed stays
    assert not QuietHours.objects.exists()
    page.shot("add-bad-time")

    page.type("#id_end", "08:00")
    page.click("input[name='_save']")
    reading = (
        "Night owls users: no marketing messages from 21:00 to 08:00 (the next morning), in their "
        "own time zone; sends held until then go out over 30 minutes"
    )
    page.wait_for(lambda: f"It reads: {reading}." in page.text(), "the quiet hours saved")
    assert reading in page.find("#result_list").text
    page.shot("added")
    entry = QuietHours.objects.get()
    assert (entry.segment, entry.channel, entry.spread_minutes) == (owls, "all", 30)
    (change,) = SettingChange.objects.filter(kind="quiet_hours").all()
    assert (change.action, change.via, change.by.username) == ("created", "admin", "mia")

    # Its page: the reading and the history in words, with who made it.
    page.find("#result_list").find_element(page.by.PARTIAL_LINK_TEXT, "Night owls users").click()
    page.wait_for(lambda: "Change quiet hours" in page.text(), "the entry's page")
    assert f"Created: {reading}" in page.find("#quiet-hours-history").text
    assert "mia" in page.find("#quiet-hours-history").text
    page.shot("change")


def test_a_marketer_sends_a_campaign_file_watches_it_go_out_and_cancels_another(
    browser, live_server, published, staff, settings, tmp_path
):
    from worker.models import SendChunk, SendJob

    published(vip=(10, [1, 2], {"push": (5, 10)}))
    staff("mia", MARKETER)
    broker.clear("sends")
    page = Page(browser, live_server.url, prefix="send-file-")
    page.log_in("mia", "/admin/worker/sendjob/add/")
    page.wait_for(lambda: "Send a campaign file" in page.text(), "the upload form")

    def send(path: Path, campaign: str) -> None:
        page.open("/admin/worker/sendjob/add/")
        page.wait_for(lambda: "Send a campaign file" in page.text(), "the upload form")
        page.find("#id_recipients_file").send_keys(str(path))
        page.choose("#id_channel", "push")
        page.type("#id_campaign", campaign)
        page.choose("#id_template", "welcome")
        page.click("#send-file")

    # A file whose header names an unknown column: refused under the field, nothing stored.
    bad = tmp_path / "bad.csv"
    bad.write_text("user_id,adress\n1,token-1\n")
    send(bad, "oops")
    page.wait_for(lambda: "unknown column 'adress'" in page.text(), "the refusal")
    assert "line 1" in page.find(".errorlist").text
    page.shot("refused")
    assert not SendJob.objects.exists()

    # No worker runs yet: the file waits to be read, and she cancels the job.
    spring = tmp_path / "spring.csv"
    spring.write_text("user_id,address\n" + "".join(f"{i},token-{i}\n" for i in range(1, 3001)))
    send(spring, "spring")
    page.wait_for(lambda: "its file is being read" in page.text(), "the job's page")
    assert page.find("#job-status").text == "preparing"
    assert "reading the file: 0 of" in page.find("#job-stage").text
    page.shot("preparing")
    page.click("#job-cancel")
    page.wait_for(lambda: "Cancelled send job" in page.text(), "the cancel")
    job = SendJob.objects.get(campaign="spring")
    assert job.status == "cancelled" and not SendChunk.objects.filter(job=job).exists()
    assert page.find("#job-status").text == "cancelled"
    page.shot("cancelled")

    # With a worker: the next file is read, sent, and the bar fills without a reload.
    worker = start_celery_worker(
        "sends",
        worker_env(settings.CELERY_BROKER_URL, GATEKEEPER_DISPATCHERS='{"push": "null"}'),
    )
    try:
        summer = tmp_path / "summer.csv"
        summer.write_text("".join(f"{i},token-{i}\n" for i in range(1, 2501)))
        send(summer, "summer")
        page.wait_for(lambda: "its file is being read" in page.text(), "the job's page")
        page.wait_for(
            lambda: page.find("#job-status").text == "done", "the job to finish", seconds=120
        )
    finally:
        stop_celery_worker(worker)
    assert page.find("#job-percent").text == "100%"
    assert "2,500 of 2,500 recipients settled" in page.find("#job-stage").text
    page.shot("done")
    job = SendJob.objects.get(campaign="summer")
    assert (job.total, job.sent + job.capped, job.pending) == (2500, 2500, 0)
    assert SendJob.objects.get(campaign="spring").status == "cancelled"  # its task did nothing


def test_a_marketer_looks_a_user_up_on_the_suppression_list_adds_one_and_takes_one_off(
    browser, live_server, staff, published
):
    published(vip=(10, [1], {}))
    suppress(channel="email", user_ids=[41, 42], reason="bounced", source="esp:postmark")
    staff("mia", MARKETER)
    page = Page(browser, live_server.url, prefix="suppress-")
    page.log_in("mia", "/admin/limits/suppression/")
    page.wait_for(lambda: "Select suppression to view" in page.text(), "the list")

    # A search by user id finds the one user; anything else is refused with a message.
    page.type("#searchbar", "42")
    page.click("#changelist-search input[type='submit']")
    page.wait_for(lambda: "q=42" in browser.current_url and "1 result" in page.text(), "user 42")
    assert "esp:postmark" in page.find("#result_list").text
    page.shot("found")
    page.type("#searchbar", "forty-two")
    page.click("#changelist-search input[type='submit']")
    page.wait_for(lambda: "is not a whole number" in page.text(), "the refusal")
    page.shot("bad-search")

    # Add: a user on every channel; the gate refuses their push at once (this process).
    page.open("/admin/limits/suppression/add/")
    page.choose("#id_channel", "all channels together")
    page.type("#id_user_id", "7")
    page.choose("#id_reason", "added by hand")
    page.type("#id_note", "asked by phone")
    page.shot("add")
    page.click("input[name='_save']")
    page.wait_for(lambda: "was added successfully" in page.text(), "the entry saved")
    row = Suppression.objects.get(user_id=7)
    assert (row.channel, row.source, row.created_by.username) == ("all", "admin", "mia")
    assert gate_check(channel="push", requests=[(7, "p7")])[0].reason == "suppressed"

    # Take user 41 off: through the service, journalled.
    page.open("/admin/limits/suppression/?q=41")
    page.wait_for(lambda: "1 result" in page.text(), "user 41")
    page.click("#result_list tbody input.action-select")
    page.choose("select[name='action']", "Delete selected suppressions")
    page.click("button[name='index']")
    page.wait_for(lambda: "Are you sure" in page.text(), "the confirmation")
    page.click("input[type='submit']")
    page.wait_for(lambda: "Successfully deleted 1 suppression" in page.text(), "the deletion")
    page.shot("deleted")
    assert set(Suppression.objects.values_list("user_id", flat=True)) == {7, 42}
    assert SuppressionChange.objects.filter(user_id=41, action="removed", by__username="mia")
