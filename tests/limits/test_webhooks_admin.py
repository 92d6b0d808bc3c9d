"""An operator adds a webhook endpoint in the admin, in headless Chromium: a bad URL is named on
the form and nothing is made; the endpoint is made with a secret, gets the events, and once it
has kept failing it stands out in the list with its failed deliveries; it is resumed by an
action and catches up."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from limits.ledger.drain import ledger_drain_all
from limits.models.stream import WebhookEndpoint
from limits.stream.webhooks import GIVE_UP_AFTER, webhook_deliver
from tests.support.browser import Page
from worker.gate import gate_check

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_adds_an_endpoint_and_resumes_it_after_it_failed(
    browser, live_server, published, staff, receiver
):
    published(vip=(10, [1, 2], {"email": (5, 10)}))
    ledger_drain_all()
    operator = staff("otto")
    operator.user_permissions.add(
        *Permission.objects.filter(codename__endswith="webhookendpoint"),
        *Permission.objects.filter(codename="view_webhookdelivery"),
    )
    page = Page(browser, live_server.url, prefix="webhooks-")
    page.log_in("otto", "/admin/limits/webhookendpoint/add/")
    page.wait_for(lambda: "Add webhook endpoint" in page.text(), "the form")  # after the login
    page.type("#id_url", "ftp://warehouse.example/in")
    page.click("input[name=_save]")
    page.wait_for(lambda: "is not an http or https URL" in page.text(), "the URL's error")
    assert not WebhookEndpoint.objects.exists()
    page.shot("bad-url")

    page.find("#id_url").clear()
    page.type("#id_url", receiver.url)
    page.type("#id_description", "The warehouse loader")
    page.click("input[name=types][value=decision]")
    page.click("input[name=_save]")
    page.wait_for(lambda: "was added successfully" in page.text(), "the endpoint made")
    (endpoint,) = WebhookEndpoint.objects.all()
    assert endpoint.secret.startswith("whsec_") and endpoint.types == ["decision"]
    assert endpoint.created_by == operator
    receiver.secret = endpoint.secret

    gate_check(channel="email", requests=[(1, "a"), (2, "b")], campaign="c")
    ledger_drain_all()
    receiver.default = 500
    at = timezone.now()
    while endpoint.state == WebhookEndpoint.State.ACTIVE:
        webhook_deliver(endpoint.pk, now=at)
        endpoint.refresh_from_db()
        at = endpoint.next_at or at + GIVE_UP_AFTER
    page.open("/admin/limits/webhookendpoint/")
    page.wait_for(lambda: "paused: it kept failing" in page.text(), "the failing endpoint")
    assert "HTTP 500" in page.text()
    page.shot("failing")
    page.open(f"/admin/limits/webhookendpoint/{endpoint.pk}/change/")
    page.wait_for(lambda: "last deliveries" in page.text().lower(), "its deliveries")
    assert "HTTP 500: not now" in page.text()
    page.shot("deliveries")

    receiver.default = 200
    page.open("/admin/limits/webhookendpoint/")
    page.click("input[name=_selected_action]")
    page.choose("select[name=action]", "Resume the selected endpoints (from where they stopped)")
    page.click("button[name=index]")
    page.wait_for(lambda: "1 resumed" in page.text(), "the resumed endpoint")
    report = webhook_deliver(endpoint.pk, now=at + timedelta(seconds=1))
    assert report is not None and report.events == 2
    assert [e["message_id"] for e in receiver.taken()] == ["a", "b"]
