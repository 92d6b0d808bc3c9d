"""The suppression list: users who must get no marketing on a channel (or on any: `all`).

A user lands on it by opting out (the unsubscribe link, limits/people/unsubscribe.py), by an address
that bounced for good or a complaint (the email providers' tracking webhooks), or by hand
(admin, REST, an imported file). The gate asks it before the caps: a suppressed user's
marketing send is refused with reason `suppressed` and charged nothing.

Writes go through `suppress` and `unsuppress` only. Each takes SuppressionLock first, changes
the rows and journals every change in SuppressionChange, in one transaction: the journal's
ids then commit in order, so a reader that has seen change N has seen every change before it.

Reads cost no Redis and no database per batch: every process keeps the list in memory, one
roaring bitmap per channel (`SuppressionCache`), loaded once, then brought up to date by
reading the journal after its last change every GATEKEEPER_SUPPRESSION_TTL_SECONDS (2 s by
default; at once in the process that made the change). A million suppressed users take a few
megabytes; a batch of 5,000 is looked up in about half a millisecond, nothing at all when the
list is empty.
"""

import logging
import secrets
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from functools import cache
from hashlib import blake2b
from typing import Any

import numpy as np
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from pyroaring import BitMap64

from gatekeeper.lib.accounts import account_acting
from gatekeeper.lib.ids import max_user_id, out_of_bounds
from gatekeeper.lib.instants import instant_or_now
from gatekeeper.lib.leases import writers_locked
from limits.channels import ALL, validate_scope
from limits.models.people import Suppression, SuppressionChange, SuppressionLock
from limits.models.privacy import ErasedPerson, ErasureKey
from limits.people.journaled import JournaledCache
from limits.studies.measures import outcomes_noted
from segments.parsing import ListSummary, UserListError, iter_ids

logger = logging.getLogger(__name__)

REASONS = tuple(Suppression.Reason.values)
_BATCH = 5_000  # ids per query or insert: below every engine's limit on parameters
JOURNAL_DAYS = 30  # changes kept; processes only read the last few seconds of it


def validate_reason(value: str) -> None:
    if value not in REASONS:
        raise ValidationError(
            f"Unknown suppression reason '{str(value)[:40]}'. Choose one of: {', '.join(REASONS)}.",
            code="reason",
        )


def suppression_checked(channel: str, reason: str | None = None) -> None:
    """The channel (or `all`) and reason, or a ValidationError naming the field (`channel`,
    `reason`): the writes below and the REST views' parameters check by this."""
    try:
        validate_scope(channel)
    except ValidationError as exc:
        raise ValidationError({"channel": exc.messages}) from None
    if reason is not None:
        try:
            validate_reason(reason)
        except ValidationError as exc:
            raise ValidationError({"reason": exc.messages}) from None


def _journal(
    action: str, channel: str, user_ids: Sequence[int], reason: str, source: str, who: Any
) -> None:
    SuppressionChange.objects.bulk_create(
        SuppressionChange(
            channel=channel,
            user_id=user_id,
            action=action,
            reason=reason,
            source=source[:64],
            by=who,
        )
        for user_id in user_ids
    )


def _batches(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for start in range(0, len(ids), _BATCH):
        yield ids[start : start + _BATCH]


def suppress(
    *,
    channel: str,
    user_ids: Iterable[int],
    reason: str,
    source: str,
    by: Any = None,
    note: str = "",
) -> int:
    """Put users on the list for `channel` (a channel or `all`); returns how many were not
    on it already. Users already on it keep their first reason. All or nothing."""
    suppression_checked(channel, reason)
    ids = sorted(set(user_ids))
    who = account_acting(by)
    added = 0
    with transaction.atomic():
        writers_locked(SuppressionLock)  # see the module's docstring
        for part in _batches(ids):
            known = set(
                Suppression.objects.filter(channel=channel, user_id__in=part).values_list(
                    "user_id", flat=True
                )
            )
            new = [user_id for user_id in part if user_id not in known]
            if not new:
                continue
            Suppression.objects.bulk_create(
                [
                    Suppression(
                        channel=channel,
                        user_id=user_id,
                        reason=reason,
                        source=source[:64],
                        note=note[:300],
                        created_by=who,
                    )
                    for user_id in new
                ]
            )
            _journal(SuppressionChange.Action.ADDED, channel, new, reason, source, who)
            # Unsubscribes and complaints count for the studies the users are in.
            outcomes_noted(new, kind=reason, at=timezone.now())
            added += len(new)
        if added:
            _read_after_commit()
    return added


def unsuppress(
    *,
    channel: str,
    user_ids: Iterable[int],
    source: str,
    by: Any = None,
    only_from: Collection[str] | None = None,
) -> int:
    """Take users off the list for `channel`; returns how many were on it. With `only_from`,
    only the entries those sources made (a provider lifting its own opt-outs, never a
    marketer's), chosen under the same lock as the removal."""
    suppression_checked(channel)
    ids = sorted(set(user_ids))
    who = account_acting(by)
    removed = 0
    with transaction.atomic():
        writers_locked(SuppressionLock)  # see the module's docstring
        for part in _batches(ids):
            rows = Suppression.objects.filter(channel=channel, user_id__in=part)
            if only_from is not None:
                rows = rows.filter(source__in=only_from)
            gone = sorted(rows.values_list("user_id", flat=True))
            if not gone:
                continue
            rows.delete()
            _journal(SuppressionChange.Action.REMOVED, channel, gone, "", source, who)
            removed += len(gone)
        if removed:
            _read_after_commit()
    return removed


def suppression_import(
    *, channel: str, fileobj: Any, reason: str, source: str, by: Any = None
) -> dict[str, int]:
    """Add a user-list file's ids (read as segments read user lists: text or gzip, a header
    line, blank lines and repeats allowed; UserListError names the first bad line, and then
    nothing is added). Returns {"added", "already", "lines"}."""
    suppression_checked(channel, reason)
    summary = ListSummary()
    ids = ids_file_read(fileobj, summary)
    added = suppress(channel=channel, user_ids=ids, reason=reason, source=source, by=by)
    return {"added": added, "already": len(ids) - added, "lines": summary.lines}


def ids_file_read(fileobj: Any, summary: ListSummary | None = None) -> list[int]:
    """A file of user ids, sorted, each once: read as segments read user lists (text or gzip,
    a header line, blank lines and repeats allowed, the lists' size limits); UserListError
    names the first bad line."""
    chunks = list(
        iter_ids(
            fileobj,
            width=int(settings.GATEKEEPER_ID_WIDTH),
            summary=summary or ListSummary(),
            max_bytes=int(settings.GATEKEEPER_USER_LIST_MAX_BYTES),
            max_lines=int(settings.GATEKEEPER_USER_LIST_MAX_LINES),
        )
    )
    ids: list[int] = np.unique(np.concatenate(chunks)).tolist() if chunks else []
    too_large = [user_id for user_id in ids[-1:] if user_id > max_user_id()]
    if too_large:
        raise UserListError(f"{out_of_bounds(too_large[0], max_user_id())} (in the file)")
    return ids


def _read_after_commit() -> None:
    """This process reads its own change once committed (and not before: a change rolled back
    must not reach the list)."""
    transaction.on_commit(suppression_cache().read_now)


def journal_prune(*, now: datetime | None = None) -> int:
    """Drop journal entries older than JOURNAL_DAYS (upkeep); the rows themselves stay."""
    before = instant_or_now(now) - timedelta(days=JOURNAL_DAYS)
    deleted, _ = SuppressionChange.objects.filter(at__lt=before).delete()
    return deleted


_ERASURE_KEY: list[str] = []  # this process's, once read (it never changes)


def erasure_key() -> str:
    """GATEKEEPER_ERASURE_KEY, else the one the database keeps (made at random when first
    needed: never derived from SECRET_KEY, whose rotation would forget every erasure)."""
    if settings.GATEKEEPER_ERASURE_KEY:
        return str(settings.GATEKEEPER_ERASURE_KEY)
    if not _ERASURE_KEY:
        made = secrets.token_hex(32)
        try:
            row, _ = ErasureKey.objects.get_or_create(pk=1, defaults={"key": made})
        except IntegrityError:  # another process made it first
            row = ErasureKey.objects.get(pk=1)
        _ERASURE_KEY.append(row.key)
    return _ERASURE_KEY[0]


def erasure_key_forget() -> None:
    """Read the key again at its next use (tests, whose database is emptied between them)."""
    _ERASURE_KEY.clear()


@cache
def _erasure_hash(key: str) -> Any:
    """The keyed BLAKE2b state erased people's ids are hashed from (a copy per id: keying it
    once costs what hashing an id does)."""
    return blake2b(key=blake2b(key.encode(), digest_size=32).digest(), digest_size=8)


def erased_keys(user_ids: Sequence[int]) -> list[int]:
    """The keyed hashes erased people are kept as (63 bits, a signed column's): a person's id
    cannot be read back from one without the key, and the gate can still tell them."""
    base = _erasure_hash(erasure_key())

    def digest(user_id: int, base: Any = base) -> bytes:
        state = base.copy()
        state.update(user_id.to_bytes(8, "big"))
        return state.digest()

    keys: list[int] = (np.frombuffer(b"".join(map(digest, user_ids)), dtype=">u8") >> 1).tolist()
    return keys


def erased_add(user_ids: Sequence[int]) -> None:
    """Keep `user_ids` as erased people (refused on every channel from then on); again is
    nothing."""
    ErasedPerson.objects.bulk_create(
        [ErasedPerson(key=k) for k in erased_keys(user_ids)], ignore_conflicts=True, batch_size=5000
    )
    _read_after_commit()


class SuppressionUnavailable(Exception):
    """The list has never been read in this process (the database is away): nobody can be
    told not suppressed, so the gate refuses marketing as `unavailable` (fail closed)."""


class SuppressionCache(JournaledCache):
    """The list in memory: per scope (a channel, or `all`) a bitmap of user ids."""

    what = "Suppression list"
    unavailable = SuppressionUnavailable

    def _reset(self) -> None:
        self._scopes: dict[str, BitMap64] = {}
        self._erased: BitMap64 = BitMap64()  # erased people's keys (erased_keys)
        self._last_erased = 0

    @classmethod
    def holding(cls, **scopes: BitMap64) -> "SuppressionCache":
        """A list that always answers `scopes` (channel -> user ids), never the database
        (benchmarks)."""
        cache = cls(ttl=float("inf"))
        cache._scopes = dict(scopes)
        cache._loaded_now()
        return cache

    def suppressed(self, channel: str, user_ids: Sequence[int]) -> list[bool] | None:
        """Per user id, whether it is suppressed on `channel` (or on all channels); None when
        nobody of them is (the usual case, and free when the list is empty). Raises
        SuppressionUnavailable while the list has never been read."""
        scopes = self._current()
        own, every = scopes.get(channel), scopes.get(ALL)
        lists = [bitmap for bitmap in (own, every) if bitmap]
        if not lists or not user_ids:
            return None
        if len(lists) == 1:
            answers = list(map(lists[0].__contains__, user_ids))
        else:
            first, second = lists
            answers = [user_id in first or user_id in second for user_id in user_ids]
        return answers if any(answers) else None

    def erased(self, user_ids: Sequence[int]) -> list[bool] | None:
        """Per user id, whether the person was erased (refused on every channel); None when
        nobody of them was (free while nobody ever was). Raises SuppressionUnavailable while
        the list has never been read."""
        self._current()
        if not self._erased or not user_ids:
            return None
        answers = list(map(self._erased.__contains__, erased_keys(user_ids)))
        return answers if any(answers) else None

    def count(self, channel: str) -> int:
        return len(self._current().get(channel, ()))

    def _current(self) -> dict[str, BitMap64]:
        self._fresh()
        return self._scopes

    def _read_all(self) -> None:
        # The journal's end first: changes committed while the rows are read are read again
        # afterwards, and applying a change twice gives the same list.
        last = SuppressionChange.objects.order_by("-id").values_list("id", flat=True).first()
        scopes: dict[str, BitMap64] = {}
        rows = Suppression.objects.order_by().values_list("channel", "user_id")
        for channel, user_id in rows.iterator(chunk_size=50_000):
            bitmap = scopes.get(channel)
            if bitmap is None:
                bitmap = scopes[channel] = BitMap64()
            bitmap.add(user_id)
        self._scopes, self._last_change = scopes, last or 0
        self._erased, self._last_erased = BitMap64(), 0
        self._read_changes()

    def _read_changes(self) -> None:
        changes = (
            SuppressionChange.objects.filter(id__gt=self._last_change)
            .order_by("id")
            .values_list("id", "channel", "user_id", "action")
        )
        scopes = self._scopes
        for change_id, channel, user_id, action in changes.iterator(chunk_size=50_000):
            bitmap = scopes.get(channel)
            if bitmap is None:
                bitmap = scopes[channel] = BitMap64()
            if action == SuppressionChange.Action.ADDED:
                bitmap.add(user_id)
            else:
                bitmap.discard(user_id)
            self._last_change = change_id
        erased = (
            ErasedPerson.objects.filter(id__gt=self._last_erased)
            .order_by("id")
            .values_list("id", "key")
        )
        for erased_id, key in erased.iterator(chunk_size=50_000):
            self._erased.add(key)
            self._last_erased = erased_id


@cache
def suppression_cache() -> SuppressionCache:
    """This process's copy of the suppression list (one per process)."""
    return SuppressionCache(ttl=settings.GATEKEEPER_SUPPRESSION_TTL_SECONDS)
