"""Settings the limiter depends on are checked at start-up, each error with a stable id; the
limiter's Redis by `check --deploy`."""

import pytest
import redis
from django.core.checks import CheckMessage, run_checks

from gatekeeper.lib.redis_client import reset_redis_clients
from limits.engine.log import GROUP_LISTPACK_VALUE
from limits.engine.server_checks import limiter_redis_check


def ids(settings_changes: dict, settings) -> set[str]:
    for name, value in settings_changes.items():
        setattr(settings, name, value)
    return {
        message.id for message in run_checks() if message.id and message.id.startswith("limits.")
    }


def test_the_defaults_pass(settings) -> None:
    assert ids({}, settings) == set()


def test_an_unknown_default_time_zone_is_an_error(settings) -> None:
    assert ids({"GATEKEEPER_DEFAULT_TIME_ZONE": "Mars/Base"}, settings) == {"limits.E001"}


def test_bad_channel_names_are_errors(settings) -> None:
    assert ids({"GATEKEEPER_CHANNELS": ["email", "all", "SMS!"]}, settings) == {"limits.E002"}
    assert ids({"GATEKEEPER_CHANNELS": ["email", "email"]}, settings) == {"limits.E003"}


def test_the_sweep_needs_a_budget(settings) -> None:
    assert ids({"GATEKEEPER_LOG_SWEEP_BUCKETS": 0}, settings) == {"limits.E004"}


def test_the_beat_leaders_lease_lasts_long_enough_to_be_renewed(settings) -> None:
    assert ids({"GATEKEEPER_BEAT_LOCK_SECONDS": 1}, settings) == {"limits.E010"}
    assert ids({"GATEKEEPER_BEAT_LOCK_SECONDS": 3}, settings) == set()


def test_the_unsubscribe_links_base_is_an_http_address_and_https_off_loopback(settings) -> None:
    assert ids({"GATEKEEPER_PUBLIC_URL": "gate.example.com"}, settings) == {"limits.E008"}
    assert ids({"GATEKEEPER_PUBLIC_URL": "https://gate.example.com/?a=1"}, settings) == {
        "limits.E008"
    }
    assert ids({"GATEKEEPER_PUBLIC_URL": "http://gate.example.com"}, settings) == {"limits.W001"}
    assert ids({"GATEKEEPER_PUBLIC_URL": "https://gate.example.com/"}, settings) == set()
    assert ids({"GATEKEEPER_SUPPRESSION_TTL_SECONDS": -1}, settings) == {"limits.E007"}


def redis_warnings(settings, url: str, *, cluster: bool = False) -> list[CheckMessage]:
    """What the deploy check says of the limiter's Redis at `url`."""
    settings.REDIS_URL, settings.REDIS_CLUSTER = url, cluster
    reset_redis_clients()
    try:
        return list(limiter_redis_check(None))
    finally:
        reset_redis_clients()


def test_the_limiters_redis_keeps_groups_as_listpacks(settings, own_redis) -> None:
    assert redis_warnings(settings, own_redis.url) == []
    with redis.Redis.from_url(own_redis.url) as client:
        client.config_set("hash-max-listpack-value", 64)
    warnings = redis_warnings(settings, own_redis.url)
    assert [w.id for w in warnings] == ["limits.W003"]
    assert "hash-max-listpack-value 64" in warnings[0].msg
    assert f"hash-max-listpack-value {GROUP_LISTPACK_VALUE}" in str(warnings[0].hint)
    own_redis.stop()
    assert [w.id for w in redis_warnings(settings, own_redis.url)] == ["limits.W002"]


@pytest.mark.cluster
def test_every_node_of_a_cluster_is_asked(settings, cluster_processes) -> None:
    assert redis_warnings(settings, cluster_processes.url, cluster=True) == []
    node = cluster_processes.nodes[-1]
    with redis.Redis(port=node.port) as client:
        client.config_set("hash-max-listpack-value", 64)
        try:
            warnings = redis_warnings(settings, cluster_processes.url, cluster=True)
            assert [w.id for w in warnings] == ["limits.W003"]
        finally:
            client.config_set("hash-max-listpack-value", GROUP_LISTPACK_VALUE)
