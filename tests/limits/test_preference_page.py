"""The hosted preference page: a signed link per person, no login, a plain form that works
without JavaScript, in the person's language; what it saves is journaled as `page` and the gate
follows it; a tampered link or a pause in the past changes nothing. Driven over HTTP and in
headless Chromium."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from limits.engine.topics import TopicFields
from limits.models.people import Preference, PreferenceChange
from limits.people.preference_page import preferences_reader, preferences_token, preferences_url
from limits.people.preferences import PreferencesFields
from limits.policy.services import TOPICS

TopicRow = tuple[str, str, list[str], str]
NEWS: TopicRow = ("news", "Product news", ["email", "push"], "subscribed")
OFFERS: TopicRow = ("offers", "Offers", ["email"], "unsubscribed")
TERMS: TopicRow = ("terms", "Terms of service", [], "required")


def topics_made() -> None:
    for slug, name, on, default in (NEWS, OFFERS, TERMS):
        TOPICS.create(
            fields=TopicFields(slug=slug, name=name, channels=on, default=default), via="command"
        )


def page_path(user_id: int) -> str:
    return reverse("preferences", args=[preferences_token(user_id)])


def text(response) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


@pytest.mark.django_db
def test_the_link_is_signed_for_one_person_and_a_tampered_one_is_refused(client, settings):
    settings.GATEKEEPER_PUBLIC_URL = "https://mail.example.com"
    url = preferences_url(42)
    assert url.startswith("https://mail.example.com/p/")
    token = url.rsplit("/", 2)[-2]
    assert preferences_reader(token) == 42
    forged = token.replace("42", "43", 1)
    assert preferences_reader(forged) is None
    refused = client.get(reverse("preferences", args=[forged]))
    assert refused.status_code == 400 and "This link is not valid" in text(refused)
    assert client.post(reverse("preferences", args=[forged]), {}).status_code == 400
    assert not PreferenceChange.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_page_shows_each_topic_as_the_person_gets_it_and_saves_what_they_choose(client):
    topics_made()
    page = text(client.get(page_path(7)))
    # Subscribed by default: ticked; one people must ask for: not; required: no switch.
    assert re.search(r'name="topic:news:email" value="on" checked', page)
    assert re.search(r'name="topic:offers:email" value="on">', page)
    assert "topic:terms" not in page and "always sent" in page
    assert re.search(r'<label><input type="checkbox" name="channel:sms" value="on" checked>', page)
    saved = client.post(page_path(7), {
        "topic:news:push": "on", "topic:offers:email": "on",  # news by email unticked
        "channel:email": "on", "channel:push": "on",  # sms unticked
        "pause": "week",
    })  # fmt: skip
    assert saved.status_code == 200 and "Saved." in text(saved)
    row = Preference.objects.get(user_id=7)
    assert row.topics == {"news": {"email": False}, "offers": {"email": True}}
    assert row.channels == {"sms": False}
    assert row.paused_until is not None
    assert row.paused_until - datetime.now(tz=UTC) > timedelta(days=6)
    assert PreferenceChange.objects.get().source == "page"
    # Shown back as saved, the pause with its day.
    again = text(client.get(page_path(7)))
    assert re.search(r'name="topic:news:email" value="on">', again)
    assert f"Paused until {row.paused_until:%Y-%m-%d}." in again


@pytest.mark.django_db
def test_a_pause_in_the_past_is_refused_and_nothing_changes(client):
    topics_made()
    posted = {"topic:news:email": "on", "pause": "until", "until": "2020-01-01"}
    refused = client.post(page_path(7), posted)
    assert refused.status_code == 400 and "A pause ends on a day after today." in text(refused)
    unreadable = client.post(page_path(7), {**posted, "until": "soon"})
    assert unreadable.status_code == 400
    assert not Preference.objects.exists() and not PreferenceChange.objects.exists()


@pytest.mark.django_db
def test_the_page_offers_only_a_frequency_tighter_than_the_rules_and_keeps_the_chosen_one(client):
    from limits.policy.rules import RuleFields
    from limits.policy.selectors import policy_cache
    from limits.policy.services import RULES

    topics_made()
    RULES.create(fields=RuleFields(name="3 a week", segment=None, channel="email", match="any",
                 tag="", window_kind="rolling", window_seconds=604_800, window_unit="", limit=3,
                 reserve_below_priority=None, reserve_slots=None), via="command")  # fmt: skip
    policy_cache().invalidate()
    page = text(client.get(page_path(7)))
    email = re.search(r'<select id="often-email" name="often:email">(.*?)</select>', page)
    assert email is not None
    assert re.findall(r'value="(\d*)"', email.group(1)) == ["", "1", "2"]
    push = re.search(r'<select id="often-push" name="often:push">(.*?)</select>', page)
    assert push is not None and len(re.findall(r'value="\d+"', push.group(1))) == 7
    base = {"channel:email": "on", "channel:push": "on", "channel:sms": "on",
            "topic:news:email": "on", "topic:news:push": "on"}  # fmt: skip
    saved = client.post(page_path(7), {**base, "often:email": "2"})
    assert saved.status_code == 200, text(saved)
    week = {"kind": "rolling", "seconds": 604_800}
    assert Preference.objects.get(user_id=7).frequency == [
        {"channel": "email", "window": week, "limit": 2}
    ]
    assert re.search(r'<option value="2" selected>At most 2 a week</option>', text(saved))
    # A form made by hand with more than the rules leave, or no number: refused, nothing kept.
    for bad in ("5", "many"):
        refused = client.post(page_path(7), {**base, "often:email": bad})
        assert refused.status_code == 400, bad
    assert Preference.objects.get(user_id=7).frequency[0]["limit"] == 2
    assert PreferenceChange.objects.count() == 1


@pytest.mark.django_db
def test_the_page_offers_each_calendar_week_too_and_keeps_what_it_leaves_as_it_was(client):
    from limits.people.preferences import preferences_replace
    from limits.policy.selectors import topics_read

    topics_made()
    week = {"kind": "rolling", "seconds": 604_800}
    calendar = {"kind": "calendar", "unit": "week"}
    page = text(client.get(page_path(7)))
    email = re.search(r'<select id="often-email" name="often:email">(.*?)</select>', page)
    assert email is not None
    assert re.findall(r'value="calendar:(\d+)"', email.group(1)) == [str(n) for n in range(1, 8)]
    assert '<optgroup label="Each calendar week (Monday to Sunday)">' in email.group(1)
    base = {"channel:email": "on", "channel:push": "on", "channel:sms": "on",
            "topic:news:email": "on", "topic:news:push": "on"}  # fmt: skip
    chosen = {**base, "often:email": "calendar:2", "often:push": "3"}
    saved = client.post(page_path(7), chosen)
    assert saved.status_code == 200, text(saved)
    row = Preference.objects.get(user_id=7)
    assert row.frequency == [
        {"channel": "email", "window": calendar, "limit": 2},
        {"channel": "push", "window": week, "limit": 3},
    ]
    # A calendar week lasts 7 days and an hour where the clocks go back: the logs keep that.
    assert row.keeps_seconds == 7 * 86_400 + 3_600
    assert '<option value="calendar:2" selected>At most 2 a calendar week</option>' in text(saved)
    assert '<option value="3" selected>At most 3 a week</option>' in text(saved)
    french = text(client.get(page_path(7), HTTP_ACCEPT_LANGUAGE="fr"))
    assert "Au plus 2 par semaine du calendrier" in french
    # Saved again as it is: nothing changes. A choice the page never offers: refused.
    assert client.post(page_path(7), chosen).status_code == 200
    for bad in ("calendar:0", "calendar:two", "month:2", ":2", "calendar:"):
        refused = client.post(page_path(7), {**chosen, "often:email": bad})
        assert refused.status_code == 400, bad
    assert PreferenceChange.objects.count() == 1
    # Two weekly frequencies on one channel (set over the API): the page shows one, and keeps
    # both while its choice stays as shown.
    both = [{"channel": "email", "window": calendar, "limit": 2},
            {"channel": "email", "window": week, "limit": 3}]  # fmt: skip
    preferences_replace(user_id=8, prefs=PreferencesFields(frequency=both), topics=topics_read(),
                        source="api")  # fmt: skip
    shown = text(client.get(page_path(8)))
    assert '<option value="calendar:2" selected>' in shown and "selected>At most 3" not in shown
    assert client.post(page_path(8), {**base, "often:email": "calendar:2"}).status_code == 200
    assert Preference.objects.get(user_id=8).frequency == both
    assert client.post(page_path(8), {**base, "often:email": "1"}).status_code == 200
    assert Preference.objects.get(user_id=8).frequency == [
        {"channel": "email", "window": week, "limit": 1}
    ]


@pytest.mark.django_db
def test_the_page_reads_in_the_persons_language(client):
    topics_made()
    french = client.get(page_path(7), HTTP_ACCEPT_LANGUAGE="fr-FR,fr;q=0.9")
    assert french["Content-Language"] == "fr"
    page = text(french)
    assert '<html lang="fr">' in page and "Ce que vous recevez de notre part" in page
    assert "Tout mettre en pause pendant 1 semaine" in page
    english = client.get(page_path(7), HTTP_ACCEPT_LANGUAGE="en")
    assert "What you get from us" in text(english) and english["Content-Language"] == "en"


@pytest.mark.django_db
def test_a_template_that_names_preferences_url_links_each_persons_own_page(settings, tmp_path):
    import copy

    from worker.delivery.base import Recipient
    from worker.delivery.rendering import Renderer

    folder = tmp_path / "email" / "choices"
    folder.mkdir(parents=True)
    (folder / "subject.txt").write_text("News")
    (folder / "body.txt").write_text("Choose what you get from us: {{ preferences_url }}\n")
    (folder / "body.html").write_text('<a href="{{ preferences_url }}">Your choices</a>')
    templates = copy.deepcopy(settings.TEMPLATES)
    templates[0]["DIRS"] = [*templates[0].get("DIRS", []), str(tmp_path)]
    settings.TEMPLATES = templates
    settings.GATEKEEPER_PUBLIC_URL = "https://mail.example.com"
    renderer = Renderer(channel="email", template="choices", campaign="spring")
    for user_id in (5, 6):
        message = renderer(
            Recipient(message_id=f"spring:{user_id}", user_id=user_id,
                      address=f"u{user_id}@example.com", context={})
        )  # fmt: skip
        found = re.search(r"https://mail\.example\.com/p/([^/\s]+)/", message.body)
        assert found is not None, message.body
        assert preferences_reader(found[1]) == user_id
        assert f'href="https://mail.example.com/p/{found[1]}/"' in (message.html or "")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_person_changes_their_choices_in_a_real_browser_with_the_keyboard(browser, live_server):
    from selenium.webdriver.common.keys import Keys

    from tests.support.browser import Page

    topics_made()
    page = Page(browser, live_server.url, prefix="preferences-")
    page.open(page_path(9))
    page.wait_for(lambda: "What you get from us" in page.text(), "the preference page")
    # Every control has a label a screen reader reads.
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('input:not([type=hidden]), select')]"
        ".filter(i => !i.labels || !i.labels.length).map(i => i.name)"
    )
    assert unlabelled == []
    page.shot("ask")
    # With the keyboard alone: to news by email, untick it with the space bar.
    box = page.find("input[name='topic:news:email']")
    box.send_keys(Keys.SPACE)
    page.find("input[name=pause][value=month]").send_keys(Keys.SPACE)
    # "At most 2 a week" by push, from the keyboard: down twice in the list.
    page.find("select[name='often:push']").send_keys(Keys.ARROW_DOWN, Keys.ARROW_DOWN)
    page.find("button[type=submit]").send_keys(Keys.ENTER)
    page.wait_for(lambda: "Saved." in page.text(), "the saved page")
    page.shot("saved")
    row = Preference.objects.get(user_id=9)
    assert row.topics == {"news": {"email": False}}
    assert row.paused_until is not None
    assert [(e["channel"], e["limit"]) for e in row.frequency] == [("push", 2)]


@pytest.mark.django_db
def test_the_unsubscribe_page_offers_fewer_first(client):
    from limits.people.unsubscribe import unsubscribe_token

    page = text(
        client.get(reverse("unsubscribe", args=[unsubscribe_token(user_id=8, channel="email")]))
    )
    found = re.search(r'<a href="/p/([^/"]+)/" id="choices">', page)
    assert found is not None, page
    assert preferences_reader(found[1]) == 8
