"""Mailbox providers in a chunk run: each group paced at its own rate, email beyond a warm-up
plan's day held for the next day, a braked group's email held until it is resumed. Real Redis,
a real SMTP server."""

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gatekeeper.lib.conflicts import Conflict
from limits.models.policy import SettingChange
from tests.support.sends import run_all
from worker.chunks import send_chunk_run
from worker.delivery.deliverability import sending_domain
from worker.delivery.mailbox_settings import mailbox_pause, mailbox_resume
from worker.delivery.mailboxes import (
    OTHER,
    mailbox_problems,
    mailboxes,
    mailboxes_built,
    rate_of,
    rates_problems,
)
from worker.delivery.mx import mx_forget, mx_key
from worker.delivery.warmup import warmup_plans, warmup_problems, warmup_taken
from worker.models import MailboxProvider, SendChunk, SendJob, WarmupPlan
from worker.services import send_job_create

NOON = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)


@pytest.fixture
def uncapped(published):
    published(vip=(10, list(range(1, 40)), {}))


def job_to(addresses: list[str], campaign: str = "spring") -> SendJob:
    return send_job_create(
        channel="email",
        campaign=campaign,
        template="welcome",
        recipients=[
            {"user_id": i, "address": a, "context": {"name": f"U{i}"}}
            for i, a in enumerate(addresses, start=1)
        ],
        queue=False,
        on_capped="defer",
    )


def group_set(slug: str, **fields) -> None:
    MailboxProvider.objects.filter(slug=slug).update(**fields)
    mailboxes(fresh=True)


def test_the_default_groups_take_their_domains_and_every_other_is_other(db):
    boxes = mailboxes(fresh=True)
    assert boxes.groups_of(
        [
            "a@gmail.com",
            "b@GoogleMail.com",
            "c@hotmail.co.uk",
            "d@live.fr",
            "e@outlook.com",
            "f@yahoo.co.jp",
            "g@aol.com",
            "h@me.com",
            "i@example.org",
            "j@mail.gmail.com",  # not gmail.com itself
        ]
    ) == [
        "gmail",
        "gmail",
        "microsoft",
        "microsoft",
        "microsoft",
        "yahoo",
        "yahoo",
        "apple",
        OTHER,
        OTHER,
    ]


def test_a_rate_is_the_tightest_of_its_periods_with_a_small_burst():
    assert rate_of({"per_second": 10, "per_minute": 300, "per_hour": None}).per_second == 5
    hourly = rate_of({"per_hour": 36_000})
    assert (hourly.per_second, hourly.burst) == (10, 1)
    fast = rate_of({"per_second": 1000})
    assert fast.burst == 40  # 4% of a second: at most 1.04x over any second
    # A dispatcher's own rate, else every dispatcher's.
    rows = [
        MailboxProvider(
            slug="gmail",
            domains=["gmail.com"],
            rates=[
                {"dispatcher": "*", "per_second": 5},
                {"dispatcher": "smtp", "per_second": 2},
            ],
        )
    ]
    boxes = mailboxes_built(rows, mx_lookup=False)
    assert boxes.rate_for("smtp", "gmail").per_second == 2
    assert boxes.rate_for("amazon_ses", "gmail").per_second == 5
    assert boxes.rate_for("smtp", OTHER) is None


@pytest.mark.parametrize(
    ("rates", "words"),
    [
        ([{"dispatcher": "smtp", "per_second": -1}], "per_second is -1"),
        ([{"dispatcher": "smtp"}], "give per_second, per_minute or per_hour"),
        ([{"dispatcher": "Not A Name", "per_second": 1}], "not a provider's name"),
        ([{"dispatcher": "*", "per_minute": "fast"}], "per_minute is 'fast'"),
        ([{"per_second": 1}, {"per_second": 2}], "has a rate already"),
        ([{"per_second": 1, "per_day": 5}], "unknown field per_day"),
        ({"per_second": 1}, "A list of rates"),
    ],
)
def test_bad_rates_are_named(rates, words):
    assert any(words in problem for problem in rates_problems(rates)), rates_problems(rates)


def test_a_group_names_its_fields_problems():
    others = {"gmail": ["gmail.com"]}
    problems = mailbox_problems(
        {"slug": "Big One", "name": "", "domains": ["gmail.com", "bad domain"], "rates": []},
        others=others,
    )
    assert set(problems) == {"slug", "name", "domains"}
    assert "has a space in it" in problems["domains"][0]
    problems = mailbox_problems(
        {"slug": "corp", "name": "Corp", "domains": ["gmail.com"]}, others=others
    )
    assert problems == {"domains": ["'gmail.com' is in the group 'gmail' already."]}
    problems = mailbox_problems({"slug": OTHER, "name": "Other", "domains": ["x.com"]}, others={})
    assert "names none itself" in problems["domains"][0]


def test_a_group_whose_rate_has_no_room_waits_in_a_later_chunk_and_the_others_go(uncapped, smtp):
    group_set("gmail", rates=[{"dispatcher": "*", "per_minute": 1}])
    job = job_to(["a@gmail.com", "b@gmail.com", "c@yahoo.com", "d@gmail.com", "e@aol.com"])
    run_all(job)
    job.refresh_from_db()
    # One gmail send had the bucket's one token; the next token is a minute away, so the other
    # two wait in a retry chunk (no attempt spent) instead of holding up yahoo's.
    assert sorted(smtp.per_recipient()) == ["a@gmail.com", "c@yahoo.com", "e@aol.com"]
    later = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert later.kind == SendChunk.Kind.RETRY and later.attempts == 0
    assert sorted(r["address"] for r in later.recipients) == ["b@gmail.com", "d@gmail.com"]
    assert later.not_before is not None
    assert 50 < (later.not_before - job.created_at).total_seconds() < 70
    assert (job.sent, job.pending) == (3, 2)


def test_sends_beyond_the_warm_up_day_wait_for_the_next_day_in_the_plans_zone(uncapped, smtp):
    sydney = ZoneInfo("Australia/Sydney")
    # 23:00 in Sydney on the plan's first day (2026-03-28 is a Saturday, before DST ends).
    first_evening = datetime(2026, 3, 28, 23, 0, tzinfo=sydney)
    WarmupPlan.objects.create(
        domain=sending_domain(),
        time_zone="Australia/Sydney",
        starts_on=date(2026, 3, 28),
        volumes={"gmail": [2, 3]},
    )
    job = job_to([f"u{i}@gmail.com" for i in range(6)] + ["y@yahoo.com"])
    run_all(job, now=first_evening)
    job.refresh_from_db()
    assert len(smtp.per_recipient()) == 3  # two gmail, and yahoo (not in the plan)
    assert job.reasons == {"allowed": 3, "warming_up": 4}
    held = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert held.held == f"warmup:{sending_domain()}:gmail"
    # Midnight in Sydney: 13:00 UTC.
    assert held.not_before == datetime(2026, 3, 29, 0, 0, tzinfo=sydney)
    assert held.not_before.astimezone(UTC) == datetime(2026, 3, 28, 13, 0, tzinfo=UTC)
    plan = warmup_plans()[sending_domain()]
    assert warmup_taken(plan, date(2026, 3, 28)) == {"gmail": 2}
    # The next day (the last of the ramp): three go, one waits again, and the ramp has ended.
    send_chunk_run(chunk_id=held.pk, now=held.not_before)
    job.refresh_from_db()
    assert job.sent == 6 and job.reasons["warming_up"] == 5
    assert WarmupPlan.objects.get().ended == {"gmail": "2026-03-29"}
    last = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    send_chunk_run(chunk_id=last.pk, now=last.not_before)
    job.refresh_from_db()
    assert (job.sent, job.status) == (7, "done")  # ended: nothing held any more


def test_warm_up_volume_the_gate_refused_is_given_back(uncapped, smtp):
    from tests.support.sends import make_rule

    make_rule("1 a day")
    WarmupPlan.objects.create(
        domain=sending_domain(), starts_on=NOON.date(), volumes={"gmail": [10]}
    )
    run_all(job_to(["a@gmail.com", "b@gmail.com"], campaign="one"), now=NOON)
    run_all(job_to(["a@gmail.com", "b@gmail.com"], campaign="two"), now=NOON)
    plan = warmup_plans()[sending_domain()]
    assert warmup_taken(plan, NOON.date()) == {"gmail": 2}  # the second job's were refused


def test_a_braked_groups_email_waits_and_is_handed_out_when_it_is_resumed(uncapped, smtp):
    yahoo = MailboxProvider.objects.get(slug="yahoo")
    mailbox_pause(yahoo, {"words": "complaints 0.4%"}, now=NOON)
    assert mailbox_pause(yahoo, {"words": "again"}, now=NOON) is None  # paused once
    job = job_to(["a@yahoo.com", "b@gmail.com"])
    run_all(job, now=NOON)
    job.refresh_from_db()
    assert list(smtp.per_recipient()) == ["b@gmail.com"]
    assert job.reasons == {"allowed": 1, "braked": 1}
    held = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert (held.held, held.not_before) == ("brake:yahoo", NOON + timedelta(hours=1))
    # Still paused an hour later: it waits again.
    send_chunk_run(chunk_id=held.pk, now=held.not_before)
    again = SendChunk.objects.get(job=job, status=SendChunk.Status.QUEUED)
    assert again.held == "brake:yahoo"
    resumed_at = NOON + timedelta(hours=1, minutes=5)
    mailbox_resume(yahoo, via="admin", now=resumed_at)
    again.refresh_from_db()
    assert again.not_before == resumed_at  # handed out at once, not at its hour
    send_chunk_run(chunk_id=again.pk, now=resumed_at)
    job.refresh_from_db()
    assert (job.sent, job.status) == (2, "done")
    history = SettingChange.objects.filter(kind="mailbox_provider").order_by("at")
    assert [(c.action, c.via) for c in history] == [("paused", "brake"), ("resumed", "admin")]
    assert history[0].words == "Paused by the brake: complaints 0.4%"
    with pytest.raises(Conflict, match="not paused"):
        mailbox_resume(yahoo)


@pytest.mark.parametrize(
    ("volumes", "words"),
    [
        ({"gmial": [10]}, "'gmial' is no mailbox provider"),
        ({"gmail": [10, 0, 20]}, "gmail, day 2: 0; each day sends at least 1"),
        ({"gmail": [-5]}, "day 1: -5"),
        ({"gmail": []}, "a list of 1 to 366"),
        ({"gmail": [1.5]}, "not a whole number"),
        ({}, "Each group's volume"),
    ],
)
def test_bad_warm_up_plans_are_named(volumes, words):
    problems = warmup_problems(
        {"domain": "mail.example.com", "time_zone": "UTC", "starts_on": NOON.date(),
         "volumes": volumes},
        groups=["gmail", "yahoo", OTHER],
    )  # fmt: skip
    assert list(problems) == ["volumes"]
    assert any(words in p for p in problems["volumes"]), problems


def test_a_plans_domain_and_zone_are_checked():
    problems = warmup_problems(
        {"domain": "not a domain", "time_zone": "Mars/Base", "starts_on": "soon",
         "volumes": {"gmail": [1]}},
        groups=["gmail"],
    )  # fmt: skip
    assert set(problems) == {"domain", "time_zone", "starts_on"}


def test_a_domain_no_group_names_is_grouped_by_its_mail_servers(
    db, settings, dns_server, redis_client
):
    settings.GATEKEEPER_MAILBOX_MX_LOOKUP = True
    zone = dns_server.zone
    zone.mx("rides.example", 10, "aspmx.l.google.com")
    zone.mx("rides.example", 20, "alt1.aspmx.l.google.com")
    zone.mx("shop.example", 0, "shop-example.mail.protection.outlook.com")
    zone.mx("own.example", 10, "mx.own.example")
    boxes = mailboxes(fresh=True)
    addresses = [
        "a@rides.example",
        "b@shop.example",
        "c@own.example",
        "d@none.example",
        "e@gmail.com",
    ]
    assert boxes.groups_of(addresses) == ["gmail", "microsoft", OTHER, OTHER, "gmail"]
    asked = sum(zone.asked.values())
    assert asked == 4  # gmail.com is named: never asked
    # Kept for every process in Redis: another process (here: after this one forgot) asks none.
    mx_forget()
    assert mailboxes(fresh=True).groups_of(addresses) == [
        "gmail",
        "microsoft",
        OTHER,
        OTHER,
        "gmail",
    ]
    assert sum(zone.asked.values()) == asked
    assert redis_client.ttl(mx_key("rides.example")) > 86_000


def test_a_name_server_that_does_not_answer_leaves_the_domain_in_other_for_a_while(
    db, settings, silent_dns, redis_client
):
    settings.GATEKEEPER_MAILBOX_MX_LOOKUP = True
    assert mailboxes(fresh=True).groups_of(["a@rides.example"]) == [OTHER]
    assert 0 < redis_client.ttl(mx_key("rides.example")) <= 300  # asked again in 5 minutes


def test_switched_off_nothing_is_grouped_held_or_counted(uncapped, smtp, settings, redis_client):
    settings.GATEKEEPER_DELIVERABILITY = False
    group_set("gmail", paused_at=NOON, rates=[{"dispatcher": "*", "per_minute": 1}])
    job = job_to(["a@gmail.com", "b@gmail.com"])
    run_all(job, now=NOON)
    job.refresh_from_db()
    assert (job.sent, job.status) == (2, "done")
    assert redis_client.keys("*brake*") == []
