"""Provider rate limits (worker/throttle.py): one token bucket per provider in Redis, shared by
every worker, on one node and on a cluster. The clock is passed in: nothing sleeps."""

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.support.clocks import Clock
from worker.delivery.throttle import (
    Rate,
    Throttle,
    group_bucket_key,
    paced,
    parse_rates,
    provider_rates_check,
    taken_together,
)


def throttle(clock: Clock, per_second: float = 500, provider: str = "fcm") -> Throttle:
    return Throttle(
        provider,
        parse_rates(f"{provider}={per_second}")[provider],
        clock=clock,
        sleep=clock.sleep,
    )


def test_rates_are_read_from_the_setting_and_bad_ones_named() -> None:
    assert parse_rates("smtp=14, webhook=500,ses=0.5") == {
        "smtp": Rate(14.0, 1),
        "webhook": Rate(500.0, 20),
        "ses": Rate(0.5, 1),
    }
    assert parse_rates("") == {}
    for text, words in [
        ("smtp", "'smtp' is not provider=rate"),
        ("SES=14", "'SES=14' is not provider=rate"),
        ("smtp=fast", "the rate of 'smtp' is 'fast'"),
        ("smtp=0", "the rate of 'smtp' is '0'"),
        ("smtp=nan", "the rate of 'smtp' is 'nan'"),
        ("smtp=2000000", "at most 1,000,000"),
        ("smtp=1,smtp=2", "names 'smtp' twice"),
    ]:
        with pytest.raises(ImproperlyConfigured, match=words):
            parse_rates(text)


def test_a_bad_setting_fails_the_start_up_check(settings: Any) -> None:
    settings.GATEKEEPER_PROVIDER_RATES = "smtp=14,fcm"
    (error,) = provider_rates_check(None)
    assert error.id == "worker.E001" and "'fcm' is not provider=rate" in error.msg
    settings.GATEKEEPER_PROVIDER_RATES = "smtp=14"
    assert provider_rates_check(None) == []


def test_two_workers_share_one_rate(settings_redis: Any) -> None:
    clock = Clock()
    first, second = throttle(clock), throttle(clock)  # two processes' throttles, one bucket
    assert first.take(80) == (20, 0.002)  # the burst: 4% of a second's worth
    assert second.take(10) == (0, 0.002)  # the next token comes in 2 ms
    granted = 0
    for _ in range(2_500):  # ten seconds, both asking every 4 ms (2 tokens come meanwhile)
        clock.ms += 4
        granted += first.take(3)[0] + second.take(3)[0]
    assert granted == 5000  # 500 a second, to the send


def test_a_dispatchers_mailbox_providers_are_taken_from_in_one_call(settings_redis: Any) -> None:
    clock = Clock()

    def group(name: str, per_second: float) -> Throttle:
        return Throttle(
            f"smtp:{name}",
            Rate(per_second, max(1, int(per_second * 0.04))),
            clock=clock,
            sleep=clock.sleep,
            key=group_bucket_key("smtp", name),
        )

    gmail, yahoo, other = group("gmail", 1000), group("yahoo", 100), group("other", 1000)
    # One call (the keys share a slot on a cluster): each bucket's burst at most, what is wanted.
    taken_together([(gmail, 70), (yahoo, 3), (other, 10)])
    assert (gmail.ahead, yahoo.ahead, other.ahead) == (40, 3, 10)
    # Handed out before Redis is asked again; then the bucket, which those took from.
    assert gmail.take(30) == (30, 0.0) and gmail.take(30) == (10, 0.0)
    assert gmail.take(30) == (0, 0.001)
    assert group("yahoo", 100).take(5) == (1, 0.01)  # another worker: what the call left


def test_a_provider_that_said_too_many_holds_every_worker(settings_redis: Any) -> None:
    clock = Clock()
    first, second = throttle(clock), throttle(clock)
    assert first.take(10)[0] == 10
    first.hold(2.5)
    assert second.take(5) == (0, 2.5)
    clock.sleep(2.5)
    assert second.take(100)[0] == 20  # the burst again after the pause, not 2.5 s of tokens


def test_sends_are_paced_in_order(settings_redis: Any) -> None:
    clock = Clock()
    sent: list[tuple[int, int]] = []  # (item, ms)

    def send(part: Any) -> list[int]:
        sent.extend((item, clock.ms) for item in part)
        return [item * 10 for item in part]

    started = clock.ms
    assert paced(throttle(clock, 100), list(range(250)), send) == [i * 10 for i in range(250)]
    assert [item for item, _ in sent] == list(range(250))
    # 4 at once (the burst), then 2 every 20 ms: the 250th goes out 2.46 s after the first,
    # and no second sees more than 104.
    assert sent[3][1] == started and sent[4][1] == sent[5][1] == started + 20
    assert sent[-1][1] - started == 2460
    assert paced(None, [1, 2], send) == [10, 20]  # no rate: one call, no round trip


def test_a_bucket_whose_redis_is_away_for_a_moment_is_waited_for(own_redis: Any) -> None:
    """The bucket's node stopped (a failover's seconds): the worker waits for it, renewing its
    lease meanwhile, instead of giving up a batch it has marked `sending` and never sent."""
    import redis

    from worker.delivery.throttle import AWAY_WAITS

    clock = Clock()
    client = redis.Redis.from_url(own_redis.url, socket_timeout=1, socket_connect_timeout=1)
    bucket = Throttle("fcm", parse_rates("fcm=100")["fcm"], client=client, clock=clock)
    waits: list[float] = []
    back_after = [2]  # waits before the server is back: once

    def waiting(seconds: float) -> None:
        waits.append(seconds)
        if back_after and len(waits) == back_after[0]:
            back_after.clear()
            own_redis.start()  # back on its port, empty, as a promoted replica would answer
        clock.sleep(seconds)

    own_redis.stop()
    assert paced(bucket, [1, 2, 3], lambda part: list(part), waiting=waiting) == [1, 2, 3]
    assert waits[:2] == list(AWAY_WAITS[:2])
    # Away for longer than every wait: the run gives up, as before.
    own_redis.stop()
    waits.clear()
    with pytest.raises(redis.ConnectionError):
        paced(bucket, [1], lambda part: list(part), waiting=waiting)
    assert waits == list(AWAY_WAITS)
