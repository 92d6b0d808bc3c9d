"""A job across the five mailbox providers, through a real SMTP server and through an ESP's API
(a local server speaking Postmark's), each group paced at its own rate on a clock the test
moves; the ESP answering "too many" and refusing 30% of its calls loses nothing."""

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.fakes.esp import FakePostmark, Request, Status
from tests.support.clocks import Clock, throttles_on
from tests.support.sends import Inbox, smtp_serving, smtp_settings
from worker.chunks import send_chunk_run
from worker.delivery.mailboxes import mailboxes
from worker.delivery.throttle import BURST_SECONDS
from worker.models import MailboxProvider, SendChunk, SendJob
from worker.services import send_job_create

START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
# Messages a second each group may get, and the domains of its recipients.
RATES = {"gmail": 40, "microsoft": 25, "yahoo": 20, "apple": 10, "other": 50}
DOMAINS = {
    "gmail": "gmail.com",
    "microsoft": "hotmail.co.uk",
    "yahoo": "yahoo.fr",
    "apple": "icloud.com",
    "other": "example.org",
}
PER_GROUP = 60
ESP_PER_GROUP = 30  # one HTTP call a send: fewer
# The servers' threads find a group without the database.
GROUP_OF = {domain: slug for slug, domain in DOMAINS.items()}


def group_of(address: str) -> str:
    return GROUP_OF[address.rpartition("@")[2]]


@pytest.fixture
def five_groups(published, settings, monkeypatch) -> Clock:
    published(vip=(10, list(range(1, 1000)), {}))
    for slug, rate in RATES.items():
        MailboxProvider.objects.filter(slug=slug).update(
            rates=[{"dispatcher": "*", "per_second": rate, "per_minute": None, "per_hour": None}]
        )
    mailboxes(fresh=True)
    clock = Clock()
    throttles_on(clock, settings, monkeypatch)
    return clock


def job_across_groups(per_group: int = PER_GROUP) -> SendJob:
    rows: list[dict[str, Any]] = []
    for g, slug in enumerate(RATES):
        for i in range(per_group):
            user = g * per_group + i + 1
            rows.append({"user_id": user, "address": f"u{user}@{DOMAINS[slug]}"})
    # Interleaved: a chunk holds every group's recipients.
    rows.sort(key=lambda row: row["user_id"] % per_group)
    return send_job_create(
        channel="email", campaign="across", template="welcome", recipients=rows, queue=False
    )


def run_until_done(job: SendJob, clock: Clock) -> None:
    """Every chunk of the job, follow-ups included, each run when due (on the test's time)."""
    for _ in range(100):
        queued = SendChunk.objects.filter(job=job, status=SendChunk.Status.QUEUED).order_by("pk")
        if not queued.exists():
            return
        for chunk in queued:
            now = max(chunk.not_before or START, START + timedelta(milliseconds=clock.ms))
            send_chunk_run(chunk_id=chunk.pk, now=now)
    raise AssertionError("the job never finished")


def assert_within_rates(times: dict[str, list[int]]) -> None:
    """In any second, no group got more than its rate and its burst (4% of a second)."""
    for slug, rate in RATES.items():
        sent = sorted(times[slug])
        assert len(sent) == PER_GROUP, slug
        most = 0
        for i, at in enumerate(sent):
            most = max(most, sum(1 for t in sent[i:] if t < at + 1000))
        assert most <= rate + max(1, int(rate * BURST_SECONDS)), (slug, most, rate)
        # And it was paced, not merely small: the group took about PER_GROUP / rate seconds.
        took = (sent[-1] - sent[0]) / 1000
        assert took >= (PER_GROUP - rate - 1) / rate, (slug, took)


class TimedInbox(Inbox):
    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.times: dict[str, list[int]] = defaultdict(list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        for rcpt in envelope.rcpt_tos:
            self.times[group_of(rcpt)].append(self.clock.ms)
        return await super().handle_DATA(server, session, envelope)


def test_through_smtp_each_group_gets_its_own_rate(five_groups, settings):
    inbox = TimedInbox(five_groups)
    with smtp_serving(inbox) as port:
        smtp_settings(settings, port)
        job = job_across_groups()
        run_until_done(job, five_groups)
    job.refresh_from_db()
    assert (job.sent, job.failed, job.ambiguous, job.status) == (5 * PER_GROUP, 0, 0, "done")
    assert len(inbox.per_recipient()) == 5 * PER_GROUP  # each once
    assert_within_rates(inbox.times)


class RefusingPostmark(FakePostmark):
    """Postmark's API refusing 30% of its calls with a 500 (at random, seeded), and, besides,
    answering "too many" (429) to a few; each delivery stamped with the test's clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.calls = self.refused = 0
        self.chance = random.Random(52)
        self.times: dict[str, list[int]] = defaultdict(list)

    def handle(self, request: Request) -> tuple[int, dict[str, str], Any]:
        self.calls += 1
        if self.chance.random() < 0.3:
            self.refused += 1
            return 500, {}, self.error_body(500)
        before = len(self.deliveries)
        answer = super().handle(request)
        for delivery in self.deliveries[before:]:
            for address in delivery.to:
                self.times[group_of(address)].append(self.clock.ms)
        return answer


def test_through_an_esp_that_throttles_and_refuses_nothing_is_lost(five_groups, settings):
    esp = RefusingPostmark(five_groups)
    settings.DEFAULT_FROM_EMAIL = "Rides <marketing@example.com>"
    settings.EMAIL_BACKEND = "anymail.backends.postmark.EmailBackend"
    settings.ANYMAIL = {
        "POSTMARK_SERVER_TOKEN": esp.token,
        "POSTMARK_API_URL": esp.base + "/",
        "REQUESTS_TIMEOUT": 2.0,
    }
    settings.GATEKEEPER_DISPATCHERS = {"email": "postmark"}
    # Its "too many" holds the provider's bucket (on the test's clock) for every worker.
    settings.GATEKEEPER_PROVIDER_RATES = "postmark=1000"
    esp.then(Status(429, {"Retry-After": "2"}), Status(429, {"Retry-After": "1"}))
    try:
        job = job_across_groups(ESP_PER_GROUP)
        run_until_done(job, five_groups)
    finally:
        esp.close()
    job.refresh_from_db()
    assert (job.sent, job.failed, job.ambiguous, job.status) == (5 * ESP_PER_GROUP, 0, 0, "done")
    delivered = [address for d in esp.deliveries for address in d.to]
    assert len(delivered) == len(set(delivered)) == 5 * ESP_PER_GROUP  # every one, each once
    assert 0.25 < esp.refused / esp.calls < 0.35  # the refusals were met, and sent again
    # The retries (refused calls) go in later chunks: a group's count is over every chunk.
    for slug in RATES:
        assert len(esp.times[slug]) == ESP_PER_GROUP
