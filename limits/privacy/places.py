"""This app's places of personal data (limits.privacy.personal): the ledger's decisions, the cap
log and the reservations in Redis, the suppression list and preferences with their journals,
quota resets and study memberships. Registered by the app's ready()."""

from typing import Any

import numpy as np
from rest_framework import serializers

from gatekeeper.lib.redis_client import REDIS_DOWN
from limits.engine.limiter import get_limiter
from limits.engine.reservations import holds_cache, holds_without_users
from limits.ledger.drain import ledger_drain_all
from limits.ledger.history import user_decisions
from limits.ledger.serializers import HistoryDecisionSerializer
from limits.models.ledger import LedgerEntry
from limits.models.people import Preference, PreferenceChange, Suppression, SuppressionChange
from limits.models.policy import QuotaReset
from limits.models.studies import StudyMember
from limits.people.preferences import preferences_as_json, preferences_read
from limits.policy.quota import redis_unavailable
from limits.policy.selectors import topics_read
from limits.privacy.personal import Erased, Place, place_register, rows_deleted
from limits.privacy.serializers import (
    ExportLogEntrySerializer,
    ExportPreferenceChangeSerializer,
    ExportPreferencesSerializer,
    ExportQuotaResetSerializer,
    ExportSegmentSerializer,
    ExportStudySerializer,
    ExportSuppressionChangeSerializer,
    ExportSuppressionSerializer,
)
from segments.index import get_index


def _hex(value: bytes) -> str | None:
    return value.hex() if value.strip(b"\0") else None


def _send_log(user_id: int) -> list[dict[str, Any]]:
    """The user's cap log in Redis as stored (counted sends, and a send job's transactional
    sends in the uncounted log): hashes, not the texts, are what it keeps."""
    limiter = get_limiter()
    try:
        found = [(True, e) for e in limiter.entries(user_id)]
        found += [(False, e) for e in limiter.entries(user_id, uncounted=True)]
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc
    return [
        {
            "at": entry.at,
            "channel": entry.channel,
            "counted": counted,
            "message_hash": entry.message.hex(),
            "campaign_hash": _hex(entry.campaign),
            "tag_hashes": [tag.hex() for tag in entry.tags],
            "priority": entry.priority,
            "job_holder": entry.holder or None,
        }
        for counted, entry in sorted(found, key=lambda pair: -pair[1].at_ms)
    ]


def _segment(user_id: int) -> dict[str, Any] | None:
    """The segment the loaded snapshot puts the user in (from the user lists that name them);
    null when no snapshot is loaded."""
    index = get_index()
    if index is None:
        return None
    return {"slug": index.resolve(user_id), "snapshot_version": index.version}


def _suppression(user_id: int) -> list[dict[str, Any]]:
    rows = Suppression.objects.filter(user_id=user_id).order_by("channel")
    return [
        {
            "channel": row.channel,
            "reason": row.reason,
            "source": row.source,
            "note": row.note,
            "created_at": row.created_at,
        }
        for row in rows
    ]


def _suppression_journal(user_id: int) -> list[dict[str, Any]]:
    rows = SuppressionChange.objects.filter(user_id=user_id).order_by("-at", "-id")
    return [
        {
            "channel": row.channel,
            "action": row.action,
            "reason": row.reason or None,
            "source": row.source or None,
            "at": row.at,
        }
        for row in rows
    ]


def _preferences(user_id: int) -> dict[str, Any] | None:
    if not Preference.objects.filter(user_id=user_id).exists():
        return None
    shown = preferences_as_json(user_id, preferences_read(user_id, topics=topics_read()))
    del shown["user_id"]
    return shown


def _preference_journal(user_id: int) -> list[dict[str, Any]]:
    rows = PreferenceChange.objects.filter(user_id=user_id).order_by("-changed_at", "-id")
    return [
        {"before": row.before, "after": row.after, "source": row.source, "at": row.changed_at}
        for row in rows
    ]


def _quota_resets(user_id: int) -> list[dict[str, Any]]:
    rows = QuotaReset.objects.filter(user_id=user_id).order_by("-reset_at", "-id")
    return [
        {"segment": row.segment_slug, "usage": row.usage, "reason": row.reason, "at": row.reset_at}
        for row in rows
    ]


def _studies(user_id: int) -> list[dict[str, Any]]:
    rows = StudyMember.objects.filter(user_id=user_id).order_by("study")
    return [
        {
            "experiment": row.study or None,
            "arm": row.arm,
            "entered": row.entered,
        }
        for row in rows
    ]


def _reservations(user_id: int) -> list[int]:
    """The scheduled jobs whose reservation holds a send of the user's."""
    limiter = get_limiter()
    try:
        holds = holds_cache().get(limiter.client, limiter.prefix)
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc
    places = holds.owners[holds.users == np.uint64(user_id)]
    return sorted({holds.jobs[place].id for place in places.tolist()})


def _decisions_erase(user_ids: list[int]) -> Erased:
    """The users' decisions: deleted (not kept under a hash): the reports count from the hourly
    counts, which name no one, so they stay whole. The ledger's stream is drained first, so
    that decisions still in Redis are in the table to delete."""
    ledger_drain_all()
    return rows_deleted(LedgerEntry)(user_ids)


def _send_log_erase(user_ids: list[int]) -> Erased:
    try:
        return Erased(get_limiter().forget(user_ids))
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc


def _reservations_erase(user_ids: list[int]) -> Erased:
    limiter = get_limiter()
    try:
        return Erased(holds_without_users(limiter.client, limiter.prefix, user_ids))
    except REDIS_DOWN as exc:
        raise redis_unavailable(exc) from exc


def _many(serializer: type[serializers.Serializer]) -> Any:
    return lambda: serializer(many=True)


def places_register() -> None:
    for place in (
        Place(
            "segment",
            "The segment the loaded snapshot puts them in (from the user lists that name them); "
            "null: no snapshot loaded.",
            _segment,
            lambda: ExportSegmentSerializer(allow_null=True),
        ),
        Place(
            "decisions",
            "Every gate decision the send ledger keeps (GATEKEEPER_LEDGER_DAYS), newest first, "
            "with its outcome: as GET /api/v1/users/<id>/history/ shows them.",
            user_decisions,
            _many(HistoryDecisionSerializer),
            (LedgerEntry,),
            _decisions_erase,
        ),
        Place(
            "send_log",
            "The cap log in Redis: each recorded send's time, channel and hashes of its "
            "message id, campaign and tags, newest first.",
            _send_log,
            _many(ExportLogEntrySerializer),
            erase=_send_log_erase,
        ),
        Place(
            "reservations",
            "The scheduled jobs whose reservation holds one of their sends (job ids).",
            _reservations,
            lambda: serializers.ListField(child=serializers.IntegerField()),
            erase=_reservations_erase,
        ),
        Place(
            "suppression",
            "The channels they are suppressed on, why and since when.",
            _suppression,
            _many(ExportSuppressionSerializer),
            (Suppression,),
            rows_deleted(Suppression),
        ),
        Place(
            "suppression_journal",
            "Every addition to and removal from the suppression list, newest first.",
            _suppression_journal,
            _many(ExportSuppressionChangeSerializer),
            (SuppressionChange,),
            rows_deleted(SuppressionChange),
        ),
        Place(
            "preferences",
            "Their preferences as GET /api/v1/users/<id>/preferences/ answers them (without "
            "user_id); null: they never said any.",
            _preferences,
            lambda: ExportPreferencesSerializer(allow_null=True),
            (Preference,),
            rows_deleted(Preference),
        ),
        Place(
            "preference_journal",
            "Every change of their preferences, before and after, newest first.",
            _preference_journal,
            _many(ExportPreferenceChangeSerializer),
            (PreferenceChange,),
            rows_deleted(PreferenceChange),
        ),
        Place(
            "quota_resets",
            "The times an operator forgot their cap log, with the usage before, newest first.",
            _quota_resets,
            _many(ExportQuotaResetSerializer),
            (QuotaReset,),
            rows_deleted(QuotaReset),
        ),
        Place(
            "studies",
            "The global control group and the cap experiments they are in, their arm, and the "
            "UTC day they entered.",
            _studies,
            _many(ExportStudySerializer),
            (StudyMember,),
            rows_deleted(StudyMember),
        ),
    ):
        place_register(place)
