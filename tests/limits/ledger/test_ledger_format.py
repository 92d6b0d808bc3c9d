"""The ledger's formats, without a database: the stream entry of a gate call's decisions (its
columns of one length, the zones' column empty or one per decision) and the kinds' digests (a
kind stored before zones were kept is found again by the same digest)."""

import msgspec
import pytest

from limits.ledger.stream import Decided, ledger_append, ledger_entry
from limits.ledger.table import KindFields, kind_digest


def call(**fields) -> Decided:
    return Decided(
        **{
            "at_ms": 1_763_800_000_000, "channel": "email", "campaign": "spring",
            "tags": ["promo"], "priority": 5, "category": "marketing", "version": "v1",
            "users": [1, 2], "messages": ["a", "b"], "segments": ["vip", ""],
            "reasons": ["allowed", "daily_cap"], "rules": [None, 3], **fields,
        }
    )  # fmt: skip


def test_an_entry_has_no_zones_or_one_per_decision():
    for zones in ([], ["Europe/London", ""]):
        entry = ledger_entry(msgspec.msgpack.encode(call(zones=zones)))
        assert isinstance(entry, Decided) and entry.zones == zones
    assert call().zone_names() == ["", ""]
    for zones in (["Europe/London"], ["Europe/London", "", ""]):
        with pytest.raises(ValueError, match="not of one length"):
            ledger_entry(msgspec.msgpack.encode(call(zones=zones)))


def test_the_gate_cannot_append_zones_not_one_per_decision():
    with pytest.raises(ValueError, match="1 time zones for 2 decisions"):
        ledger_append(
            at_ms=0, channel="email", campaign="", tags=(), priority=5, category="marketing",
            snapshot_version="", decisions=[object(), object()], time_zones=["Europe/London"],
        )  # fmt: skip


# Digests of kinds as they were stored before zones were kept (kind_digest of that version):
# a kind without a zone must find its row again.
PLAIN = KindFields("email", "spring", ("promo",), 5, "marketing", "v1", "vip", "allowed", None)
TOPIC = PLAIN._replace(topic="news")
ARM = PLAIN._replace(reason="daily_cap", rule_id=3, topic="news", experiment=4, arm=1)
ARM_NO_TOPIC = ARM._replace(topic="")
STORED = {
    PLAIN: "7c4168fc6283e3029672c84bd2814298de8b9c99",
    TOPIC: "32289ae63e817d000d9eed1668baa48183ea6b0c",
    ARM: "1f646fca989e3f2af7dd9a8d1b3f116fb46b0244",
    ARM_NO_TOPIC: "a17e2610e7ebcee8cab806e8324de215af6e63e0",
}


def test_a_kind_without_a_zone_keeps_the_digest_it_was_stored_by():
    for fields, digest in STORED.items():
        assert fields.zone == ""
        assert kind_digest(fields) == digest


def test_the_zone_makes_a_kind_of_its_own():
    digests = set(STORED.values())
    for fields in STORED:
        for zone in ("Europe/London", "America/New_York"):
            digest = kind_digest(fields._replace(zone=zone))
            assert digest not in digests
            digests.add(digest)
    # Every field is digested once a zone is: none left out stands for another's value.
    assert kind_digest(PLAIN._replace(zone="UTC")) != kind_digest(TOPIC._replace(zone="UTC"))
