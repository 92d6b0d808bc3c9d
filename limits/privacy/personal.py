"""What Gatekeeper holds about one person, place by place: the export a person may ask for
(GDPR article 15, CCPA's right to know), `GET /api/v1/users/<id>/export/`.

A place is one store of personal data with its own shape in the export: the ledger's decisions,
the cap log in Redis, the suppression list and its journal, preferences and their journal,
quota resets, control-group and experiment memberships (this app's: limits/privacy/places.py); a
send job's recipients, dead addresses and SMS numbers (the worker's: worker/personal.py, which
names its own tables). Each app's ready() registers its places. One registry, so that the export,
the docs and the test that every table with a user id is some place's all read the same list.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Model
from rest_framework import serializers

EXPORT_FORMAT = 1  # the document's `format`: raised when a place changes shape incompatibly


@dataclass(frozen=True)
class Place:
    """One store of personal data: `key` names it in the export document, `words` says what it
    holds (the schema and docs/api.md), `export` reads one person's part of it (JSON-ready),
    `shape` makes the field that describes it in the schema, `tables` are the models it covers
    (each user id column of the database is some place's), `erase` removes many people's part
    of it (idempotent; None: the place is the company's own input, see docs/api.md)."""

    key: str
    words: str
    export: Callable[[int], Any]
    shape: Callable[[], serializers.Field]
    tables: tuple[type[Model], ...] = ()
    erase: "Callable[[list[int]], Erased] | None" = None


@dataclass(frozen=True)
class Erased:
    """What a place's erase did: rows, entries or records `removed`, and those `waiting` (a
    send being made to them now: erased on a later try)."""

    removed: int
    waiting: int = 0


ERASE_BATCH = 5000  # ids per DELETE (SQLite takes at most 32,766 parameters a statement)


def rows_deleted(model: type[Model]) -> "Callable[[list[int]], Erased]":
    """A place's erase that deletes `model`'s rows of the users (its `user_id` column)."""

    def erase(user_ids: list[int]) -> Erased:
        removed = 0
        for first in range(0, len(user_ids), ERASE_BATCH):
            batch = user_ids[first : first + ERASE_BATCH]
            removed += model._default_manager.filter(user_id__in=batch).delete()[0]
        return Erased(removed)

    return erase


_PLACES: dict[str, Place] = {}


def place_register(place: Place) -> None:
    """Adds a place (once per key: registering a key again replaces it, as ready() may run more
    than once)."""
    _PLACES[place.key] = place


def places() -> list[Place]:
    """Every registered place, in the order registered."""
    return list(_PLACES.values())


def person_export(user_id: int, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything held about `user_id`, one key per place. Raises what a place raises when its
    store does not answer (limits.policy.quota.Unavailable for Redis): an export is whole or
    none."""
    document: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "user_id": user_id,
        "exported_at": (now or datetime.now(UTC)).astimezone(UTC),
    }
    for place in places():
        document[place.key] = place.export(user_id)
    return document
