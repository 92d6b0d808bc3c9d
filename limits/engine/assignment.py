"""Who is held out and who gets which arm: a stable keyed hash of the user id (DESIGN.md,
"Topics, preferences, holdouts, experiments"). No list is stored: every process computes the
same answer for the same id and salt, across snapshots, segment changes and restarts.

The hash is a keyed mix of the 64-bit id (two rounds of the SplitMix64 finaliser, each after
mixing in one half of a 128-bit key taken from the salt by BLAKE2b), computed over a whole
batch at once with numpy. It is not a secret-keeping hash (nobody gains by guessing who is held
out); it is uniform, and a different salt gives an independent split, so a control group and
each experiment split users independently of each other.

A user is in a share `s` when their hash is below `s` of the 64-bit range: the people in a
share are all in any larger share of the same salt (a control group that grows keeps everyone
who was out; one that shrinks lets back exactly those between the two bounds). Arms split the
range in order of their shares.
"""

import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RANGE = 2**64
CONTROL_GROUP = 0  # the global control group's study id (experiments' are their ids)
HELD, SAMPLE = 0, 1  # its arms: held out, and the treatment sample
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@functools.lru_cache(maxsize=1024)
def salt_key(salt: str) -> tuple[int, int]:
    """The two 64-bit halves of a salt's key."""
    digest = hashlib.blake2b(salt.encode(), digest_size=16, person=b"gk-assignment").digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


def _mix(x: Any) -> Any:
    x = (x ^ (x >> _S30)) * _MUL1
    x = (x ^ (x >> _S27)) * _MUL2
    return x ^ (x >> _S31)


def keyed_hashes(user_ids: Sequence[int] | Any, salt: str) -> Any:
    """Each user's 64-bit hash under `salt`, as an array of uint64."""
    k0, k1 = salt_key(salt)
    ids = np.asarray(user_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(_mix(ids ^ np.uint64(k0)) ^ np.uint64(k1))


def bound(share: float) -> int:
    """The hash below which a user is in `share` (0 to 1) of the range."""
    if not 0 <= share <= 1:
        raise ValueError(f"a share is from 0 to 1, not {share!r}")
    return min(int(share * RANGE), RANGE - 1) if share < 1 else RANGE - 1


def in_share(user_ids: Sequence[int] | Any, salt: str, share: float) -> Any:
    """Whether each user is in `share` of the users under `salt` (a bool array)."""
    hashes = keyed_hashes(user_ids, salt)
    if share >= 1:
        return np.ones(len(hashes), dtype=bool)
    return hashes < np.uint64(bound(share))


@functools.lru_cache(maxsize=256)
def _edges(shares: tuple[float, ...]) -> Any:
    """Where each arm's range ends (uint64 bounds, in order)."""
    if any(s < 0 for s in shares) or sum(shares) > 1 + 1e-9:
        raise ValueError(f"shares are each 0 or more and add up to at most 1, not {shares!r}")
    edges = np.array([bound(min(1.0, e)) for e in np.cumsum(shares)], dtype=np.uint64)
    edges.flags.writeable = False
    return edges


def arms_of(user_ids: Sequence[int] | Any, salt: str, shares: Sequence[float]) -> Any:
    """Each user's arm (its position in `shares`), or -1 for a user in none (when the shares
    add up to less than 1), as an int array. The arms take the range in order."""
    total = sum(shares)
    edges = _edges(tuple(shares))
    hashes = keyed_hashes(user_ids, salt)
    arms = np.searchsorted(edges, hashes, side="right").astype(np.int64)
    if total >= 1 - 1e-12:
        return np.minimum(arms, len(shares) - 1)
    arms[arms >= len(shares)] = -1
    return arms


@dataclass(frozen=True, slots=True)
class HoldoutView:
    """The group as the gate reads it."""

    share: float
    salt: str
    exclude_segments: frozenset[str]
    exclude_tags: frozenset[str]

    def held(
        self, user_ids: Sequence[int], segments: Sequence[str | None], tags: Iterable[str]
    ) -> Any:
        """Per user, whether they are held out of a marketing send carrying `tags` (their
        segments as resolved: read only when the group excludes some), as a bool array; None
        when nobody is (no group, an excluded tag, or none of them in it)."""
        if self.share <= 0 or not user_ids or self.exclude_tags.intersection(tags):
            return None
        inside = in_share(np.asarray(user_ids, dtype=np.uint64), self.salt, self.share)
        if not inside.any():
            return None
        if self.exclude_segments:
            for k, segment in enumerate(segments):
                if inside[k] and segment in self.exclude_segments:
                    inside[k] = False
        return inside
