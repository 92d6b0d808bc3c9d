"""The ledger's formats, without a database: the stream entry of a gate call's decisions (its
columns of one length, the zones' and the outranked sends' columns empty or one per decision;
an entry of an older writer read, and read by an older drainer), what ledger_append refuses
before appending anything, and the kinds' digests (a kind stored before zones, or before
rounds, were kept is found again by the same digest)."""

import math

import msgspec
import pytest

from limits.engine.limiter import Decision
from limits.ledger.stream import DECIDED, Decided, ledger_append, ledger_entry, stream_key
from limits.ledger.table import KindFields, kind_digest
from limits.reasons import Reason


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


# ... and as stored with a zone before rounds.
ZONED = {
    PLAIN._replace(zone="Europe/London"): "fa6f36ee2ba0cd9f1069fe2d5cc311864fc8490a",
    ARM._replace(zone="Asia/Tokyo"): "43d034d943dfc56aeaf0501e9b2568b459a2a5b3",
}


def test_a_kind_not_outranked_keeps_the_digest_it_was_stored_by():
    for fields, digest in {**STORED, **ZONED}.items():
        assert fields.outranked_by is None
        assert kind_digest(fields) == digest


def test_the_job_that_outranked_makes_a_kind_of_its_own():
    digests = set(STORED.values()) | set(ZONED.values())
    for fields in [*STORED, *ZONED]:
        for job in (12, 13):
            digest = kind_digest(fields._replace(reason="outranked", outranked_by=job))
            assert digest not in digests
            digests.add(digest)
    # Every field is digested once a job is: none left out stands for another's value.
    outranked = PLAIN._replace(reason="outranked", outranked_by=12)
    assert kind_digest(outranked) != kind_digest(outranked._replace(zone="UTC"))
    assert kind_digest(outranked) != kind_digest(outranked._replace(topic="news"))


def test_the_zone_makes_a_kind_of_its_own():
    digests = set(STORED.values())
    for fields in STORED:
        for zone in ("Europe/London", "America/New_York"):
            digest = kind_digest(fields._replace(zone=zone))
            assert digest not in digests
            digests.add(digest)
    # Every field is digested once a zone is: none left out stands for another's value.
    assert kind_digest(PLAIN._replace(zone="UTC")) != kind_digest(TOPIC._replace(zone="UTC"))


def test_an_entry_has_no_outranked_sends_or_one_per_decision():
    for by, values in (([], []), ([12, 0], [3.5, 0.0])):
        entry = ledger_entry(msgspec.msgpack.encode(call(by=by, values=values)))
        assert isinstance(entry, Decided) and (entry.by, entry.values) == (by, values)
    assert call().outranked_by() == [0, 0]
    for by, values in (([12], [3.5]), ([12, 0], [3.5]), ([12, 0, 0], [3.5, 0.0, 0.0])):
        with pytest.raises(ValueError, match="not of one length"):
            ledger_entry(msgspec.msgpack.encode(call(by=by, values=values)))


class BeforeRounds(msgspec.Struct, array_like=True, tag=DECIDED, frozen=True):
    """Decided as the gate packed it before rounds (and as a drainer of that version reads)."""

    at_ms: int
    channel: str
    campaign: str
    tags: list[str]
    priority: int
    category: str
    version: str
    users: list[int]
    messages: list[str]
    segments: list[str]
    reasons: list[str]
    rules: list[int | None]
    topic: str = ""
    arms: list[int] = []
    zones: list[str] = []


def test_an_entry_before_rounds_reads_as_none_outranked_and_an_older_drainer_reads_a_new_one():
    fields = {f: getattr(call(), f) for f in BeforeRounds.__struct_fields__}
    old = msgspec.msgpack.encode(BeforeRounds(**{**fields, "zones": ["Europe/London", ""]}))
    entry = ledger_entry(old)
    assert isinstance(entry, Decided) and (entry.by, entry.values) == ([], [])
    assert entry.zones == ["Europe/London", ""] and entry.outranked_by() == [0, 0]
    # The new fields come last: a drainer of the version before ignores them.
    new = msgspec.msgpack.encode(call(reasons=["outranked", "daily_cap"], by=[12, 0],
                                      values=[3.5, 0.0]))  # fmt: skip
    read = msgspec.msgpack.decode(new, type=BeforeRounds)
    assert (read.users, read.reasons, read.zones) == ([1, 2], ["outranked", "daily_cap"], [])


def refused(user_id: int, reason: str = Reason.OUTRANKED) -> Decision:
    """A decision refused before the gate, as the gate's stages build a refusal."""
    return Decision(
        user_id=user_id, message_id=f"spring:{user_id}", allowed=False, reason=reason,
        counts={}, limits={}, retry_after=None, rule=None, segment="vip",
    )  # fmt: skip


def append(decisions, outranked) -> bool:
    return ledger_append(
        at_ms=1_763_800_000_000, channel="email", campaign="spring", tags=(), priority=5,
        category="marketing", snapshot_version="v1", decisions=decisions, outranked=outranked,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("reasons", "outranked", "words"),
    [
        (["outranked"] * 2, [(12, 3.5)], "1 outranked sends for 2 decisions"),
        (["outranked"] * 2, [(12, 3.5), None, None], "3 outranked sends for 2 decisions"),
        (["outranked", "holdout"], [None, (12, 3.5)], "decision 1 is 'holdout'"),
        (["outranked"], [(0, 3.5)], "outranked by 0, not a send job's id"),
        (["outranked"], [(True, 3.5)], "outranked by True"),
        (["outranked"], [(12, -1.0)], "value -1.0 is not 0 or more"),
        (["outranked"], [(12, math.nan)], "value nan is not 0 or more"),
        (["outranked"], [(12, math.inf)], "value inf is not 0 or more"),
        (["outranked"], [(12, "3.5")], "value '3.5' is not a number"),
    ],
)
def test_outranked_sends_it_cannot_keep_are_refused_and_nothing_is_appended(
    redis_client, reasons, outranked, words
):
    decisions = [refused(k + 1, reason) for k, reason in enumerate(reasons)]
    with pytest.raises(ValueError, match=words):
        append(decisions, outranked)
    assert redis_client.xlen(stream_key()) == 0


def test_outranked_sends_are_appended_one_per_decision(redis_client):
    assert append([refused(1), refused(2, Reason.HOLDOUT)], [(12, 3), None])
    assert append([refused(3)], [None])  # none outranked by a job: the columns stay empty
    first, second = [ledger_entry(fields[b"d"]) for _, fields in redis_client.xrange(stream_key())]
    assert isinstance(first, Decided) and isinstance(second, Decided)
    assert (first.by, first.values, first.reasons) == (
        [12, 0],
        [3.0, 0.0],
        ["outranked", "holdout"],
    )
    assert (second.by, second.values) == ([], [])
