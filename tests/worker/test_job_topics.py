"""A send job names its topic: checked when the job is made (REST, the service, the command),
carried by every send to the gate and kept in the ledger; a topic deleted while the job runs
lets its sends go as of no topic, never fails the job."""

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from limits.engine.topics import TopicFields
from limits.ledger.drain import ledger_drain_all
from limits.ledger.table import decisions
from limits.policy.services import TOPICS
from tests.support.sends import make_job, run_all

pytestmark = pytest.mark.django_db


@pytest.fixture
def news(published):
    published(vip=(10, [1, 2], {"email": (5, None)}))
    return TOPICS.create(
        fields=TopicFields(slug="news", name="News", channels=["email"]), via="command"
    )


@pytest.mark.postgres
def test_a_job_names_a_topic_that_exists_on_its_channel(news, relay):
    with pytest.raises(ValidationError) as refused:
        make_job(1, topic="nope")
    assert "No topic 'nope'. Known: news." in refused.value.message_dict["topic"][0]
    with pytest.raises(ValidationError) as refused:
        make_job(1, channel="push", topic="news")
    assert "not sent on push" in refused.value.message_dict["topic"][0]
    job = make_job(1, 9, topic="news")
    assert job.topic == "news"
    run_all(job)
    job.refresh_from_db()
    assert job.sent == 2
    ledger_drain_all()
    assert sorted(decisions().values_list("user_id", "topic")) == [(1, "news"), (9, "news")]


@pytest.mark.postgres
def test_a_topic_deleted_before_the_job_runs_lets_its_sends_go_without_it(news, relay, caplog):
    job = make_job(1, topic="news")
    TOPICS.delete(row=news, via="command")
    from limits.policy.selectors import policy_cache

    policy_cache().invalidate()
    run_all(job)
    job.refresh_from_db()
    assert (job.sent, job.duplicate, job.capped, job.failed, job.pending) == (1, 0, 0, 0, 0)
    assert "Sends go without their topic: No topic 'news'" in caplog.text
    ledger_drain_all()
    assert list(decisions().values_list("topic", flat=True)) == [""]


def test_send_campaign_takes_a_topic_and_names_a_bad_one(news, tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("user_id,address\n1,a@example.com\n")
    with pytest.raises(CommandError) as refused:
        call_command("send_campaign", "--channel", "email", "--template", "welcome",
                     "--recipients", str(path), "--topic", "offers")  # fmt: skip
    assert "--topic: No topic 'offers'" in str(refused.value)
    call_command("send_campaign", "--channel", "email", "--template", "welcome",
                 "--recipients", str(path), "--topic", "news")  # fmt: skip
    from worker.models import SendJob

    assert SendJob.objects.get().topic == "news"


@pytest.mark.postgres
def test_a_change_made_while_a_job_runs_governs_the_chunks_not_yet_gated(
    news, relay, settings, django_capture_on_commit_callbacks
):
    # Chunks of 2: the first is gated before the person switches the topic off, the rest after.
    from limits.people.preferences import preferences_patch
    from limits.policy.selectors import topics_read
    from worker.chunks import send_chunk_run
    from worker.models import SendChunk

    settings.GATEKEEPER_SEND_CHUNK_SIZE = 2
    job = make_job(1, 3, 1_000_001, 1_000_002, topic="news")
    first, *rest = SendChunk.objects.filter(job=job).order_by("pk")
    send_chunk_run(chunk_id=first.pk)
    with django_capture_on_commit_callbacks(execute=True):  # as their commits would
        for user_id in (1, 3, 1_000_001, 1_000_002):
            preferences_patch(user_id=user_id, changes={"topics": {"news": {"email": False}}},
                              topics=topics_read(), source="api")  # fmt: skip
    for chunk in rest:
        send_chunk_run(chunk_id=chunk.pk)
    job.refresh_from_db()
    assert (job.sent, job.capped) == (2, 2)
    ledger_drain_all()
    assert sorted(decisions().values_list("user_id", "reason")) == [
        (1, "allowed"),
        (3, "allowed"),
        (1_000_001, "preference"),
        (1_000_002, "preference"),
    ]
