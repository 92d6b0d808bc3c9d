"""A round's choice: for every user, no fitting set of the round's sends is worth more than the
one chosen (brute force over every subset), and the gate admits every send chosen, in whatever
order they reach it."""

import itertools
import random
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from limits.engine.limiter import get_limiter
from limits.engine.reservations import holds_cache
from limits.ledger.drain import ledger_drain_all
from limits.ledger.table import decisions
from limits.policy.selectors import policy_cache, policy_read
from segments.models import Segment
from tests.conftest import examples
from tests.support.sends import make_rule, recipients
from tests.worker.test_plan import CHANGES, USERS, ZONES, earlier_sends
from worker import rounds, services
from worker.chunks import send_chunk_run
from worker.gate import gate_check
from worker.models import Round, RoundEntry, SendChunk, SendJob
from worker.plan import (
    JobRecipients,
    _job_decided,
    _model_gate,
    job_audiences,
    plan_compute,
    plan_logs,
)
from worker.round_entries import MICROS, round_entries_erase, round_entries_of
from worker.rounds import (
    Entrant,
    rank_order,
    round_choice,
    round_decide,
    round_project,
    rounds_close_due,
)
from worker.scheduling import jobs_start_due
from worker.services import send_job_create, send_job_edit

pytestmark = pytest.mark.django_db

ROUND_USERS = USERS[:6]


@pytest.fixture
def world(published, settings):
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    settings.GATEKEEPER_SEND_CHUNK_SIZE = 4
    published(vip=(10, USERS[:20], {}))


def round_rule(rng: random.Random, n: int) -> None:
    """A rule of overlapping scope: any segment or one, a channel or all, every send, a tag or
    each campaign; rolling or calendar; now and then a reserve."""
    calendar = rng.random() < 0.4
    match = rng.choice(["any", "any", "tag", "campaign"])
    limit = rng.choice([1, 1, 2, 2, 3, 4])
    reserve = rng.random() < 0.5 and limit >= 2
    make_rule(
        f"rule {n}",
        segment=rng.choice([None, "vip"]),
        channel=rng.choice(["email", "push", "all"]),
        match=match,
        tag="promo" if match == "tag" else "",
        window_kind="calendar" if calendar else "rolling",
        window_seconds=None if calendar else rng.choice([3600, 86_400, 7 * 86_400]),
        window_unit=rng.choice(["day", "week"]) if calendar else "",
        limit=limit,
        reserve_below_priority=rng.randint(1, 9) if reserve else None,
        reserve_slots=rng.randint(1, limit - 1) if reserve else None,
    )


def round_job(rng: random.Random, n: int, start) -> tuple[SendJob, dict[int, int]]:
    """A job of the round (its start the round's), to some of ROUND_USERS, and each one's value
    in millionths."""
    users = [u for u in ROUND_USERS if rng.random() < 0.75] or [ROUND_USERS[0]]
    rows = recipients(*users)
    for row in rows:
        if rng.random() < 0.3:
            row["time_zone"] = rng.choice(ZONES)
    channel = rng.choice(["email", "push"])
    if channel == "push":
        for row in rows:
            row["address"] = f"token-{row['user_id']}"
    job = send_job_create(
        channel=channel,
        campaign=rng.choice(["spring", "launch", f"c{n}"]),
        template="welcome",
        tags=rng.choice([[], ["promo"], ["news"], ["promo", "news"]]),
        priority=rng.choice([2, 5, 5, 9]),
        recipients=rows,
        start_at=timezone.now() + timedelta(days=1),
        queue=False,
    )
    SendJob.objects.filter(pk=job.pk).update(start_at=start, expires_at=start + timedelta(days=1))
    job.refresh_from_db()
    values = {u: rng.choice([0, 1, 2, 3, 5, 8]) * MICROS // rng.choice([1, 2, 4]) for u in users}
    return job, values


def one_user(recipients: JobRecipients, user: int) -> JobRecipients:
    return recipients.only(recipients.users == user)


def test_no_fitting_set_of_a_users_sends_is_worth_more_than_the_one_chosen(world):
    """Random rules (overlapping scopes, tags, campaigns, reserves), earlier sends, clocks around
    DST changes, and 2 to 8 jobs to 6 users: checked user by user against every subset."""

    @settings(
        max_examples=examples(40),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(seed=st.integers(0, 2**32 - 1))
    @example(seed=4)
    def check(seed: int) -> None:
        get_limiter().client.flushdb()
        with transaction.atomic():
            a_round(seed)
            transaction.set_rollback(True)

    check()


def a_round(seed: int) -> None:
    rng = random.Random(seed)
    base = CHANGES[seed % len(CHANGES)]
    Segment.objects.filter(slug="vip").update(time_zone=rng.choice(ZONES))
    for n in range(rng.randint(1, 3)):
        round_rule(rng, n)
    policy_cache().invalidate()
    earlier_sends(rng, base, most=6)
    send_at = base + timedelta(minutes=15 * rng.randint(0, 8))
    made = [round_job(rng, n, send_at) for n in range(rng.randint(2, 8))]
    ranked = sorted(made, key=lambda jv: rank_order(jv[0]))
    jobs = [job for job, _ in ranked]
    audiences = job_audiences(jobs)
    entrants = [
        Entrant(
            job=job,
            recipients=audiences[job.pk],
            values=np.array([values[int(u)] for u in audiences[job.pk].users], dtype=np.int64),
        )
        for job, values in ranked
    ]
    live = get_limiter()
    logs = plan_logs(jobs, audiences, live)
    table = policy_read()
    holds = holds_cache().get(live.client, live.prefix)
    choice = round_choice(entrants, logs=logs, table=table, holds=holds)
    gate = _model_gate(logs, table, holds)

    def fits(members: list[int], user: int) -> bool:
        """Brute force: the sends of `members` (places in `entrants`) to `user`, highest
        priority first, each admitted by the model on a fork of the logs."""
        fork = logs.fork()
        for j in sorted(members, key=lambda j: -entrants[j].job.priority):
            part = one_user(entrants[j].recipients, user)
            found = _job_decided(entrants[j].job, part, gate, fork, table=table)
            assert found is not None
            if found.reason[0] != 0:  # REASONS[0] is allowed
                return False
        return True

    for user in ROUND_USERS:
        theirs = [j for j, e in enumerate(entrants) if (e.recipients.users == user).any()]
        place = {j: int(np.flatnonzero(entrants[j].recipients.users == user)[0]) for j in theirs}
        chosen = [j for j in theirs if choice.jobs[j].chosen[place[j]]]
        outranked = [j for j in theirs if choice.jobs[j].outranked[place[j]]]
        value = sum(int(entrants[j].values[place[j]]) for j in chosen)
        case = f"seed {seed}, user {user}, chosen {chosen}, outranked {outranked}"
        assert fits(chosen, user), case
        for size in range(1, len(theirs) + 1):
            for subset in itertools.combinations(theirs, size):
                worth = sum(int(entrants[j].values[place[j]]) for j in subset)
                if worth > value:
                    assert not fits(list(subset), user), f"{case}: {subset} fits, worth {worth}"
        # Outranked: fitted alone, not chosen, and named after a chosen job worth most.
        for j in outranked:
            assert fits([j], user) and chosen, case
            by = int(choice.jobs[j].by[place[j]])
            assert by in [entrants[c].job.pk for c in chosen], case
            assert choice.jobs[j].by_value[place[j]] == max(
                entrants[c].values[place[c]] for c in chosen
            ), case

    # The gate admits every chosen send, in a random order, and the first come, first served
    # figure is what the model says the jobs would win one after the other.
    sends = [
        (entrants[j].job, u)
        for j, c in enumerate(choice.jobs)
        for u in entrants[j].recipients.users[c.chosen].tolist()
    ]
    rng.shuffle(sends)
    for job, user in sends:
        (decision,) = gate_check(
            channel=job.channel,
            requests=[(user, f"{job.campaign}:{user}")],
            campaign=job.campaign,
            tags=tuple(job.tags),
            priority=job.priority,
            time_zones=[_zone_of(job, user)],
            now=send_at,
            job=job.pk,
        )
        assert decision.allowed, f"seed {seed}: job {job.pk} to {user}: {decision.reason}"


def _zone_of(job: SendJob, user: int) -> str | None:
    for chunk in job.chunks.all():
        for row in chunk.recipients:
            if row["user_id"] == user:
                return row.get("time_zone")
    return None


def joined(round_: Round, *user_ids: int, value: float, **options) -> SendJob:
    """A job of the round, to `user_ids`, worth `value` a send."""
    job = send_job_create(
        channel=options.pop("channel", "email"),
        campaign=options.pop("campaign", f"c{value}"),
        template="welcome",
        recipients=recipients(*user_ids),
        start_at=round_.send_at,
        queue=False,
        **options,
    )
    SendJob.objects.filter(pk=job.pk).update(round=round_, value=value)
    job.refresh_from_db()
    return job


@pytest.fixture
def one_a_day(world):
    make_rule("1 promo a day", channel="all", limit=1)
    policy_cache().invalidate()
    closes = timezone.now() + timedelta(hours=1)
    return Round.objects.create(name="Tuesday", channel="all", closes_at=closes, send_at=closes)


def test_a_closed_round_gives_each_user_the_send_worth_most_and_the_gate_agrees(one_a_day):
    round_ = one_a_day
    low = joined(round_, 1, 2, 3, value=1.0, priority=9)
    high = joined(round_, 2, 3, 4, value=5.0, channel="push", campaign="high")
    # Before it closes: not decided, and its jobs do not start even when their time has come.
    assert rounds_close_due(now=round_.closes_at - timedelta(seconds=1)) == []
    assert jobs_start_due(now=round_.send_at + timedelta(days=1)) == []

    assert rounds_close_due(now=round_.closes_at) == [round_.pk]
    round_.refresh_from_db()
    assert round_.status == Round.Status.DECIDED
    report = {row["job"]: row for row in round_.report["jobs"]}
    assert (report[low.pk]["won"], report[low.pk]["outranked"]) == (1, 2)
    assert report[low.pk]["outranked_by"] == [{"job": high.pk, "count": 2}]
    assert (report[high.pk]["won"], report[high.pk]["outranked"]) == (3, 0)
    # First come, first served: the low job starts first (its priority), and wins users 2, 3.
    assert report[low.pk]["first_come"] == {"won": 3, "value": 3.0}
    assert report[high.pk]["first_come"] == {"won": 1, "value": 5.0}
    assert (round_.report["value_won"], round_.report["first_come_value"]) == (16.0, 8.0)
    assert round_.report["gain"] == 8.0
    # Deciding again changes nothing.
    assert rounds_close_due(now=round_.closes_at + timedelta(minutes=20)) == []
    # The plan counts the outranked as the jobs' runs will, and predicts the rest.
    planned = {p.job_id: p for p in plan_compute()}
    assert (planned[low.pk].recipients, planned[low.pk].reasons) == (
        3,
        Counter({"outranked": 2, "allowed": 1}),
    )
    assert planned[high.pk].reasons == Counter({"allowed": 3})

    assert jobs_start_due(now=round_.send_at)
    for job in (low, high):
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, now=round_.send_at)
        job.refresh_from_db()
    assert (low.sent, low.capped, low.reasons) == (1, 2, {"allowed": 1, "outranked": 2})
    assert (high.sent, high.reasons) == (3, {"allowed": 3})
    round_.refresh_from_db()
    assert round_.differences == 0
    # In the ledger (so the history, the stream and the reports) with what outranked them.
    ledger_drain_all()
    kept = decisions().filter(reason="outranked").order_by("user_id")
    assert list(kept.values_list("user_id", "campaign", "segment", "outranked_by")) == [
        (user, low.campaign, "vip", {"job": high.pk, "value": 5.0}) for user in (2, 3)
    ]


def test_a_chosen_send_the_gate_refuses_is_counted_as_a_difference(one_a_day):
    round_ = one_a_day
    low = joined(round_, 1, 2, value=1.0)
    high = joined(round_, 2, value=3.0, campaign="high")
    assert rounds_close_due(now=round_.closes_at) == [round_.pk]
    # Something else took user 2's slot between the decision and the send.
    gate_check(channel="push", requests=[(2, "other:2")], campaign="other", now=round_.closes_at)
    assert jobs_start_due(now=round_.send_at)
    for job in (low, high):
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, now=round_.send_at)
    round_.refresh_from_db()
    assert round_.differences == 1
    high.refresh_from_db()
    assert high.reasons == {"daily_cap": 1}


@pytest.mark.parametrize("dies_in", ["reading", "choosing", "writing the entries", "saving"])
def test_a_run_that_dies_mid_decision_leaves_nothing_and_the_round_is_decided_once(
    one_a_day, monkeypatch, dies_in
):
    """A run killed while it reads the jobs and logs, while it chooses, while it writes the
    jobs' entries, or as it saves the round: nothing of its choice is kept but its lease, and
    the next run, once the lease has run out, decides the round once."""
    round_ = one_a_day
    joined(round_, 1, 2, value=1.0)
    joined(round_, 2, 3, value=2.0, campaign="other")
    closes = round_.closes_at

    def dies(*args, **kwargs):
        raise SystemExit("killed")

    where = {
        "reading": (rounds, "entrants_read"),
        "choosing": (rounds, "round_choice"),
        "writing the entries": (RoundEntry.objects, "bulk_create"),
        "saving": (Round, "save"),
    }[dies_in]
    monkeypatch.setattr(*where, dies)
    with pytest.raises(SystemExit):
        round_decide(round_.pk, now=closes)
    monkeypatch.undo()
    round_.refresh_from_db()
    assert round_.status == Round.Status.DECIDING and round_.report is None
    assert not RoundEntry.objects.exists()
    assert SendJob.objects.filter(round=round_, status=SendJob.Status.SCHEDULED).count() == 2
    # Another run waits for the dead one's lease to run out, then decides it once.
    assert rounds_close_due(now=closes + timedelta(minutes=1)) == []
    later = closes + rounds.LEASE + timedelta(seconds=1)
    assert rounds_close_due(now=later) == [round_.pk]
    assert RoundEntry.objects.filter(round=round_).count() == 2
    assert rounds_close_due(now=later + rounds.LEASE * 2) == []


def test_a_run_whose_lease_another_took_writes_nothing(one_a_day, monkeypatch):
    round_ = one_a_day
    joined(round_, 1, 2, value=1.0)
    closes = round_.closes_at
    real = rounds.round_projected

    def slow(*args, **kwargs):
        # The run took longer than its lease: another took the round and decided it.
        monkeypatch.setattr(rounds, "round_projected", real)
        assert round_decide(round_.pk, now=closes + rounds.LEASE + timedelta(seconds=1))
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "round_projected", slow)
    assert round_decide(round_.pk, now=closes) is False
    assert RoundEntry.objects.filter(round=round_).count() == 1


def test_a_projection_says_what_the_round_would_choose_and_what_another_value_would_do(
    one_a_day,
):
    round_ = one_a_day
    low = joined(round_, 1, 2, 3, value=1.0)
    high = joined(round_, 2, 3, 4, value=5.0, campaign="high")
    as_is = round_project(round_.pk)["report"]
    assert {j["job"]: j["won"] for j in as_is["jobs"]} == {low.pk: 1, high.pk: 3}
    tried = round_project(round_.pk, values={low.pk: 10.0})
    assert tried["values"] == {str(low.pk): 10.0}
    assert {j["job"]: j["won"] for j in tried["report"]["jobs"]} == {low.pk: 3, high.pk: 1}
    assert tried["report"]["value_won"] == 35.0
    round_.refresh_from_db()
    # Kept on the round; nothing decided, nothing of the jobs changed.
    assert round_.projection == tried and round_.status == Round.Status.OPEN
    assert not RoundEntry.objects.exists()
    low.refresh_from_db()
    assert low.value == 1.0


@pytest.mark.cluster
def test_a_round_on_one_node_and_on_a_cluster(published, settings, settings_redis):
    """Users on every node of a cluster: the round reads their logs from each, chooses, and the
    gate then admits every chosen send and the outranked never reach it."""
    settings.GATEKEEPER_DISPATCHERS = {"push": "null", "email": "null"}
    users = [k * 257 + 1 for k in range(30)]  # 30 buckets: slots on every node
    published(vip=(10, users[:10], {}))
    make_rule("1 a day", channel="all", limit=1)
    policy_cache().invalidate()
    # Half the users have had their send today already: no candidate of theirs fits.
    gate_check(channel="email", requests=[(u, f"earlier:{u}") for u in users[::2]], campaign="x")
    closes = timezone.now() + timedelta(hours=1)
    round_ = Round.objects.create(name="r", channel="all", closes_at=closes, send_at=closes)
    low = joined(round_, *users[:20], value=1.0)
    high = joined(round_, *users[10:], value=2.0, channel="push", campaign="high")
    assert rounds_close_due(now=closes) == [round_.pk]
    round_.refresh_from_db()
    rows = {j["job"]: j for j in (round_.report or {})["jobs"]}
    # users[10:20] wanted by both: the odd ones (5) go to the job worth more.
    assert (rows[low.pk]["won"], rows[low.pk]["outranked"]) == (5, 5)
    assert (rows[high.pk]["won"], rows[high.pk]["outranked"]) == (10, 0)
    assert jobs_start_due(now=closes)
    for job in (low, high):
        for chunk in SendChunk.objects.filter(job=job).order_by("pk"):
            send_chunk_run(chunk_id=chunk.pk, now=closes)
        job.refresh_from_db()
    assert (low.sent, low.reasons) == (5, {"allowed": 5, "outranked": 5, "daily_cap": 10})
    assert (high.sent, high.reasons) == (10, {"allowed": 10, "daily_cap": 10})
    round_.refresh_from_db()
    assert round_.differences == 0


def test_what_a_round_chose_for_a_person_is_in_their_export_and_gone_when_erased(one_a_day):
    round_ = one_a_day
    low = joined(round_, 1, 2, value=1.0)
    high = joined(round_, 2, value=4.0, campaign="high")
    assert rounds_close_due(now=round_.closes_at) == [round_.pk]
    assert round_entries_of(2) == [
        {"round": round_.pk, "job": low.pk, "chosen": False,
         "outranked_by": {"job": high.pk, "value": 4.0}},
        {"round": round_.pk, "job": high.pk, "chosen": True, "outranked_by": None},
    ]  # fmt: skip
    assert round_entries_erase([2, 99]) == 2
    assert round_entries_of(2) == []
    assert round_entries_of(1) == [
        {"round": round_.pk, "job": low.pk, "chosen": True, "outranked_by": None}
    ]
    assert round_entries_erase([2]) == 0  # again: nothing more


def test_a_round_no_job_joined_is_decided_with_an_empty_report(one_a_day):
    round_ = one_a_day
    assert rounds_close_due(now=round_.closes_at) == [round_.pk]
    round_.refresh_from_db()
    assert round_.status == Round.Status.DECIDED
    assert (round_.report["jobs"], round_.report["users"], round_.report["gain"]) == ([], 0, 0.0)


def test_a_round_takes_no_more_jobs_than_it_can_decide(one_a_day, monkeypatch):
    round_ = one_a_day
    monkeypatch.setattr(services, "ROUND_JOBS_MAX", 2)
    first = joined(round_, 1, value=1.0)
    joined(round_, 2, value=1.0)
    with pytest.raises(ValidationError) as refused:
        send_job_create(
            channel="email", campaign="third", template="welcome", recipients=recipients(3),
            start_at=round_.send_at, round=round_.pk, value=1.0, queue=False,
        )  # fmt: skip
    assert "holds 2 jobs, the most a round decides (2)" in str(refused.value.message_dict["round"])
    # One out, another in.
    send_job_edit(job=first, changes={"round": None})
    assert SendJob.objects.filter(round=round_).count() == 1
