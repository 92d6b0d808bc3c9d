"""The plan's page in headless Chromium: a marketer reads the week ahead before a launch (the
calendar with each job's predicted decisions, who loses a send to whom, the audiences that
overlap) and tries moving the promo."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gatekeeper.lib.groups import MARKETER
from limits.policy.selectors import policy_cache
from tests.support import broker
from tests.support.browser import Page
from tests.support.sends import make_rule, recipients
from worker.plan import plan_refresh
from worker.services import send_job_create

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_marketer_reads_the_plan_and_tries_moving_the_promo(
    browser, live_server, published, staff, settings
):
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    published(vip=(10, [1, 2], {}))
    make_rule("1 promo a day", channel="all", match="tag", tag="promo", limit=1)
    policy_cache().invalidate()
    staff("mia", MARKETER)
    broker.clear("sends")
    start = (timezone.now() + timedelta(days=1)).replace(hour=9, minute=0, second=0)

    def job(campaign, users, *, hours, priority, reserve=False, channel="email"):
        rows = recipients(*users)
        if channel == "push":
            rows = [{"user_id": u, "address": f"token-{u}"} for u in users]
        return send_job_create(
            channel=channel, campaign=campaign, template="welcome", tags=["promo"],
            priority=priority, recipients=rows, start_at=start + timedelta(hours=hours),
            reserve=reserve, queue=False,
        )  # fmt: skip

    promo = job("autumn-promo", range(1, 41), hours=0, priority=3)
    launch = job("launch", range(21, 61), hours=6, priority=9, reserve=True, channel="push")
    job("newsletter", range(50, 71), hours=30, priority=5)

    page = Page(browser, live_server.url, prefix="plan-")
    page.log_in("mia", "/admin/plan/")
    page.wait_for(lambda: "No plan yet" in page.text(), "the page before a plan")
    assert [name for name, _ in broker.queued("sends")] == ["worker.tasks.plan_refresh_due"]
    page.shot("none")

    assert plan_refresh(force=True)
    page.open("/admin/plan/")
    page.wait_for(lambda: "Calendar" in page.text() and "Made at" in page.text(), "the plan")
    promo_row = page.find(f"#plan-job-{promo.pk}").text
    # Users 21 to 40 are the launch's: held for it, the promo reaches the other 20.
    assert "autumn-promo" in promo_row and "sent 20" in promo_row and "reserved 20" in promo_row
    assert "reserved" in page.find(f"#plan-job-{launch.pk}").text
    lost = page.rows("#plan-lost tbody tr")
    assert len(lost) == 1 and "autumn-promo" in lost[0] and "launch: 20 sends" in lost[0]
    assert "21, 22, 23" in lost[0]
    assert "both" not in page.find("#plan-overlaps").text  # email and push
    overlaps = page.rows("#plan-overlaps tbody tr")
    assert any("autumn-promo" in row and "launch" in row and "20" in row for row in overlaps)
    page.shot("week")

    # What if the promo went two days later, after the launch?
    page.choose("#id_job", f"#{promo.pk} autumn-promo (email, {start:%a %d %b %H:%M} UTC)")
    page.type("#id_start_at", (start + timedelta(days=2)).isoformat())
    page.click("#plan-compare")
    page.wait_for(lambda: page.driver.find_elements("css selector", "#plan-move"), "the comparison")
    rows = page.rows("#plan-move tbody tr")
    moved = next(row for row in rows if "autumn-promo" in row)
    assert "+20" in moved  # the launch's users get it too, a day after the launch
    page.shot("moved")
    promo.refresh_from_db()
    assert promo.start_at == start  # nothing saved

    page.find("#id_start_at").clear()
    page.type("#id_start_at", "next thursday")
    page.click("#plan-compare")
    page.wait_for(lambda: "is not a date and time" in page.text(), "the refusal")
