"""The suppression list at the gate, and the one-click unsubscribe link that feeds it.

Real snapshot, real rules, real Redis, a real SMTP server. A suppressed user's marketing send
is refused with `suppressed` before quiet hours and caps, charged nothing, whether or not
the user is in a list; every process sees a change within its TTL, the one that made it at
once."""

import email
import re
from datetime import datetime, timedelta
from email.policy import default as default_policy
from zoneinfo import ZoneInfo

import pytest
from django.core import signing
from django.core.exceptions import ValidationError
from django.test import Client

from limits.engine.limiter import get_limiter
from limits.engine.quiet import QuietFields
from limits.models.people import Suppression, SuppressionChange
from limits.people.suppression import SuppressionCache, suppression_cache
from limits.people.suppression import suppress as suppress_now
from limits.people.suppression import unsuppress as unsuppress_now
from limits.people.unsubscribe import token_reader, unsubscribe_token, unsubscribe_url
from limits.policy.services import QUIET_HOURS
from segments.models import Segment
from tests.support.sends import make_job, run_all
from worker.gate import Gate, gate_check

NIGHT = datetime(2026, 6, 10, 23, 0, tzinfo=ZoneInfo("Europe/Paris"))


@pytest.fixture
def snapshot(published):
    # vip: users 1 and 2, one email a day; user 9 is in no list (the default segment).
    return published(vip=(10, [1, 2], {"email": (1, 5), "push": (1, 5)}))


def suppress(**given) -> int:
    added = suppress_now(**given)
    suppression_cache().read_now()  # as its commit would: the test's transaction never commits
    return added


def unsuppress(**given) -> int:
    removed = unsuppress_now(**given)
    suppression_cache().read_now()
    return removed


def recorded(user_id: int) -> int:
    return len(get_limiter().entries(user_id))


def decide(*user_ids: int, channel: str = "email", **options):
    requests = [(u, f"m-{channel}-{u}") for u in user_ids]
    return gate_check(channel=channel, requests=requests, **options)


def test_a_suppressed_user_is_refused_first_and_charged_nothing(snapshot):
    assert suppress(channel="email", user_ids=[1, 9], reason="unsubscribed", source="test") == 2
    one, two, nine = decide(1, 2, 9)
    assert (one.allowed, one.reason, one.segment, one.retry_after) == (
        False,
        "suppressed",
        "vip",
        None,
    )
    assert (two.allowed, two.reason) == (True, "allowed")
    # Users in no list are suppressed just the same.
    assert (nine.reason, nine.segment) == ("suppressed", "default")
    assert recorded(1) == 0 and recorded(9) == 0
    # Taken off the list, the user's daily slot is still whole: nothing was charged.
    assert unsuppress(channel="email", user_ids=[1], source="test") == 1
    again = gate_check(channel="email", requests=[(1, "again")])[0]
    assert (again.reason, again.counts["daily"]) == ("allowed", 1)


def test_suppression_is_per_channel_and_all_covers_every_channel(snapshot):
    suppress(channel="email", user_ids=[1], reason="bounced", source="test")
    suppress(channel="all", user_ids=[2], reason="manual", source="test")
    assert [d.reason for d in decide(1, 2, channel="email")] == ["suppressed", "suppressed"]
    assert [d.reason for d in decide(1, 2, channel="push")] == ["allowed", "suppressed"]


def test_suppressed_comes_before_quiet_hours_blocks_and_a_dry_run_says_so_too(published):
    published(vip=(10, [1, 2], {"email": (0, 0)}))
    Segment.objects.filter(slug="vip").update(time_zone="Europe/Paris")
    QUIET_HOURS.create(
        fields=QuietFields(
            segment="vip", channel="email", start="21:00", end="08:00", spread_minutes=0
        ),
        via="command",
    )
    suppress(channel="email", user_ids=[1], reason="complained", source="test")
    night = decide(1, 2, now=NIGHT)
    assert [d.reason for d in night] == ["suppressed", "quiet_hours"]
    assert [d.reason for d in decide(1, 2, now=NIGHT + timedelta(hours=13))] == [
        "suppressed",
        "blocked",
    ]
    noon = NIGHT + timedelta(hours=13)
    assert [d.reason for d in decide(1, 2, now=noon, dry_run=True)] == ["suppressed", "blocked"]


def test_transactional_sends_are_not_suppressed(snapshot):
    suppress(channel="all", user_ids=[1], reason="unsubscribed", source="test")
    (receipt,) = decide(1, category="transactional")
    assert (receipt.allowed, receipt.reason) == (True, "exempt")


def test_suppressed_users_are_refused_even_without_a_snapshot(db, redis_client, monkeypatch):
    # The gate logs a missing snapshot once a minute: this test's line is not another's.
    monkeypatch.setattr("worker.stages.snapshot._last_log", 0.0)
    suppress(channel="email", user_ids=[1], reason="bounced", source="test")
    # No snapshot published, none cached.
    decisions = gate_check(channel="email", requests=[(1, "a"), (2, "b")])
    assert [d.reason for d in decisions] == ["suppressed", "unavailable"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_another_process_sees_a_change_within_its_ttl_and_never_before_the_next_read(db):
    clock = Clock()
    other = SuppressionCache(ttl=2.0, clock=clock)  # another worker's list
    assert other.suppressed("email", [1, 2]) is None  # read at 0 s: empty
    suppress(channel="email", user_ids=[2], reason="unsubscribed", source="test")
    clock.now = 1.9
    assert other.suppressed("email", [1, 2]) is None  # still deciding by its last read
    clock.now = 2.0
    assert other.suppressed("email", [1, 2]) == [False, True]
    unsuppress(channel="email", user_ids=[2], source="test")
    suppress(channel="email", user_ids=[1], reason="manual", source="test")
    clock.now = 4.0
    assert other.suppressed("email", [1, 2]) == [True, False]
    # A process started now reads the rows, then the journal after them: the same list.
    fresh = SuppressionCache(ttl=2.0, clock=clock)
    assert fresh.suppressed("email", [1, 2]) == [True, False]
    assert other.count("email") == fresh.count("email") == 1


def test_writes_keep_the_first_reason_journal_each_change_and_refuse_bad_input(db):
    assert suppress(channel="email", user_ids=[5, 5, 6], reason="bounced", source="esp") == 2
    assert suppress(channel="email", user_ids=[5], reason="unsubscribed", source="link") == 0
    assert Suppression.objects.get(channel="email", user_id=5).reason == "bounced"
    assert unsuppress(channel="email", user_ids=[5, 7], source="api") == 1
    assert list(SuppressionChange.objects.order_by("id").values_list("user_id", "action")) == [
        (5, "added"),
        (6, "added"),
        (5, "removed"),
    ]
    with pytest.raises(ValidationError, match="Unknown channel 'fax'"):
        suppress(channel="fax", user_ids=[1], reason="manual", source="test")
    with pytest.raises(ValidationError, match="Unknown suppression reason 'angry'"):
        suppress(channel="email", user_ids=[1], reason="angry", source="test")  # unknown on purpose
    assert Suppression.objects.count() == 1


def test_a_job_counts_suppressed_users_as_refused_and_sends_them_nothing(snapshot, smtp):
    suppress(channel="email", user_ids=[2], reason="unsubscribed", source="test")
    job = make_job(1, 2, campaign="spring")
    run_all(job)
    job.refresh_from_db()
    assert smtp.per_recipient() == {"u1@example.com": 1}
    assert (job.sent, job.capped, job.reasons) == (1, 1, {"allowed": 1, "suppressed": 1})


def headers_of(raw: str) -> email.message.EmailMessage:
    return email.message_from_string(raw, policy=default_policy)


def test_marketing_email_carries_a_one_click_link_that_suppresses_the_user(
    snapshot,
    smtp,
    settings,
    django_capture_on_commit_callbacks,
):
    settings.GATEKEEPER_PUBLIC_URL = "https://gate.example.com/"
    run_all(make_job(1, campaign="spring"))
    run_all(make_job(2, campaign="receipt", category="transactional"))
    marketing, receipt = (headers_of(body) for _, body in smtp.messages)
    assert marketing["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # (a long header is folded onto a second line: unfolded, it starts with a space)
    header = marketing["List-Unsubscribe"].strip()
    link = re.fullmatch(r"<(https://gate\.example\.com/u/[^>]+/)>", header)
    assert link is not None and link.group(1) == unsubscribe_url(user_id=1, channel="email")
    assert receipt["List-Unsubscribe"] is None  # receipts offer no unsubscribe

    path = link.group(1).removeprefix("https://gate.example.com")
    client = Client()
    page = client.get(path)  # a scanner or a person: a page with a button, nothing recorded
    assert page.status_code == 200 and b'<form method="post">' in page.content
    assert not Suppression.objects.exists()
    # The mailbox provider's one-click POST (RFC 8058), no login, no CSRF token.
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(path, {"List-Unsubscribe": "One-Click"})
    assert done.status_code == 200 and b"You are unsubscribed" in done.content
    row = Suppression.objects.get()
    assert (row.channel, row.user_id, row.reason, row.source, row.note) == (
        "email",
        1,
        "unsubscribed",
        "link",
        "one-click",
    )
    assert decide(1)[0].reason == "suppressed"  # this process: at once
    assert client.post(path).status_code == 200  # clicking twice is fine


def test_a_link_is_signed_as_djangos_signer_signs_it_and_follows_the_secret_key(settings):
    for user_id, channel in [(0, "email"), (4_294_967_295, "push"), (12, "all")]:
        expected = signing.Signer(salt="gatekeeper.unsubscribe").sign(f"{user_id}-{channel}")
        assert unsubscribe_token(user_id=user_id, channel=channel) == expected
    first = unsubscribe_token(user_id=7, channel="email")
    settings.SECRET_KEY = "a-second-secret-key-" + "x" * 40
    second = unsubscribe_token(user_id=7, channel="email")
    assert second != first and token_reader(second) == (7, "email")
    assert token_reader(first) is None  # a key dropped is trusted no more ...
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-third-secret-key-" + "y" * 40
    assert token_reader(second) == (7, "email")  # ... a key kept as a fallback still is


def test_a_forged_or_damaged_link_is_refused_and_records_nothing(db):
    token = unsubscribe_token(user_id=1, channel="email")
    assert token_reader(token) == (1, "email")
    forged = token.replace("1-email", "2-email", 1)
    client = Client()
    for bad in (forged, token[:-2], "nonsense", token.replace("email", "sms")):
        response = client.post(f"/u/{bad}/")
        assert response.status_code == 400 and b"not valid" in response.content
    assert client.get(f"/u/{forged}/").status_code == 400
    assert not Suppression.objects.exists()


def test_a_process_that_never_read_the_list_refuses_marketing_until_it_can(snapshot, monkeypatch):
    """Fail closed: without the list nobody can be told not suppressed. Once read, a database
    that goes away leaves the list as last read in force."""
    clock = Clock()
    cache = SuppressionCache(ttl=2.0, clock=clock)
    gate = Gate(suppressions=cache, record_stats=False, record_ledger=False)

    def away(self) -> None:
        raise OSError("database unreachable")

    reading = SuppressionCache._read_all
    monkeypatch.setattr(SuppressionCache, "_read_all", away)
    decisions = gate.check(channel="email", requests=[(1, "a"), (2, "b")])
    assert [d.reason for d in decisions] == ["unavailable", "unavailable"]
    assert [
        d.reason for d in gate.check(channel="email", requests=[(1, "t")], category="transactional")
    ] == ["exempt"]
    monkeypatch.setattr(SuppressionCache, "_read_all", reading)
    suppress_now(channel="email", user_ids=[1], reason="manual", source="test")
    clock.now = 2.0
    assert [d.reason for d in gate.check(channel="email", requests=[(1, "c"), (2, "d")])] == [
        "suppressed",
        "allowed",
    ]
    monkeypatch.setattr(SuppressionCache, "_read_changes", away)
    clock.now = 4.0  # due for a read that fails: the list as last read stands
    assert gate.check(channel="email", requests=[(1, "e")])[0].reason == "suppressed"
