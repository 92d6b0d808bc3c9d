"""Settings the limiter depends on are checked at start-up, each error with a stable id."""

from django.core.checks import run_checks


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
