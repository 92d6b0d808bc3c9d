"""Who is held out and who gets which arm: the keyed hash is the same in every process and
after a restart (a pure-Python reference and another interpreter agree with it), a share holds
its share of 10M ids within 0.1 percentage point, a larger share holds everyone in a smaller
one, two salts split independently, and arms take their shares."""

import subprocess
import sys

import numpy as np
import pytest

from limits.engine.assignment import RANGE, arms_of, in_share, keyed_hashes, salt_key

MASK = RANGE - 1
TEN_MILLION = np.arange(10_000_000, dtype=np.uint64) * np.uint64(7919) + np.uint64(12345)


def reference(user_id: int, salt: str) -> int:
    """The hash as its docstring says it, one id at a time in plain integers."""

    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
        return x ^ (x >> 31)

    k0, k1 = salt_key(salt)
    return mix(mix(user_id ^ k0) ^ k1)


def test_the_hash_is_its_reference_and_does_not_change_between_releases():
    ids = [0, 1, 42, 2**32, 2**63 + 5, MASK]
    assert [int(h) for h in keyed_hashes(ids, "control-1")] == [
        reference(u, "control-1") for u in ids
    ]
    # Fixed here: a change would move people in and out of every group and experiment.
    assert [int(h) for h in keyed_hashes([0, 1, 42, MASK], "control-1")] == [
        1715678381174656291, 5487064980127301964, 1468948510890754543, 9403032639510914255,
    ]  # fmt: skip


@pytest.mark.processes
def test_another_process_assigns_the_same_people():
    ids = list(range(0, 5_000_000, 997))
    mine = in_share(ids, "spring", 0.1)
    code = (
        "import sys, numpy as np; from limits.engine.assignment import in_share; "
        "ids = list(range(0, 5_000_000, 997)); "
        "sys.stdout.write(np.packbits(in_share(ids, 'spring', 0.1)).tobytes().hex())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert np.array_equal(np.unpackbits(np.frombuffer(bytes.fromhex(other), np.uint8))[
        : len(ids)].astype(bool), mine)  # fmt: skip


@pytest.mark.parametrize("share", [0.001, 0.05, 0.2])
def test_a_share_holds_its_share_of_ten_million_ids(share):
    held = float(in_share(TEN_MILLION, "control-1", share).mean())
    assert abs(held - share) <= 0.001, held


def test_a_larger_share_keeps_everyone_a_smaller_one_held():
    small = in_share(TEN_MILLION[:1_000_000], "control-1", 0.05)
    large = in_share(TEN_MILLION[:1_000_000], "control-1", 0.08)
    assert not (small & ~large).any()
    back = large & ~small  # shrinking from 8 % to 5 % lets exactly these back
    assert abs(float(back.mean()) - 0.03) <= 0.001


def test_two_salts_split_independently():
    a = in_share(TEN_MILLION, "control-1", 0.2)
    b = in_share(TEN_MILLION, "experiment-7", 0.2)
    assert abs(float((a & b).mean()) - 0.04) <= 0.001


def test_arms_take_their_shares_and_the_rest_is_in_none():
    arms = arms_of(TEN_MILLION, "experiment-7", [0.3, 0.3, 0.4])
    counts = np.bincount(arms, minlength=3) / len(arms)
    assert np.all(np.abs(counts - [0.3, 0.3, 0.4]) <= 0.001), counts
    half = arms_of(TEN_MILLION[:1_000_000], "experiment-7", [0.25, 0.25])
    assert abs(float((half == -1).mean()) - 0.5) <= 0.002
    # The arms are the same ranges: the first arm of a 30/30/40 split is the users of a 30 %
    # share under the same salt.
    first = arms_of(TEN_MILLION[:1_000_000], "experiment-7", [0.3, 0.7]) == 0
    assert np.array_equal(first, in_share(TEN_MILLION[:1_000_000], "experiment-7", 0.3))
    with pytest.raises(ValueError, match="add up to at most 1"):
        arms_of([1], "x", [0.6, 0.6])
