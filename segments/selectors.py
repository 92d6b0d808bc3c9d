"""Reads of the segments app."""

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug

from segments.models import Build, Segment
from segments.store import (
    CURRENT,
    MANIFEST,
    NotFound,
    SnapshotStore,
    snapshot_key,
    store_from_settings,
)


def snapshot_live_version(*, store: SnapshotStore | None = None) -> str | None:
    store = store or store_from_settings()
    try:
        return store.get(CURRENT).decode().strip()
    except NotFound:
        return None


def snapshot_versions(*, store: SnapshotStore | None = None) -> list[dict[str, Any]]:
    """Complete versions in the store, newest first, with their manifests' figures."""
    store = store or store_from_settings()
    live = snapshot_live_version(store=store)
    versions = []
    for version in reversed(store.list_versions()):
        try:
            manifest = json.loads(store.get(snapshot_key(version, MANIFEST)))
        except (NotFound, ValueError):
            continue
        segments = manifest.get("segments", [])
        versions.append(
            {
                "version": version,
                "is_live": version == live,
                "created_at": manifest.get("created_at"),
                "build_id": manifest.get("build_id"),
                "users": sum(s.get("cardinality") or 0 for s in segments),
                "bytes": sum(s.get("bytes") or 0 for s in segments),
                "segments": {s["slug"]: s.get("cardinality") for s in segments},
            }
        )
    return versions


def build_latest() -> Build | None:
    return Build.objects.order_by("-created_at", "-id").first()


def segment_by_slug(slug: str) -> Segment | None:
    """The segment named `slug`, or None; text that cannot be a slug (a NUL, a space) names
    no segment and is not sent to the database."""
    try:
        validate_slug(slug)
    except ValidationError:
        return None
    return Segment.objects.filter(slug=slug).first()


def build_active() -> Build | None:
    """The build queued or running within its lease, if any (a dead worker's build is not)."""
    for build in Build.objects.filter(status__in=[Build.Status.QUEUED, Build.Status.RUNNING]):
        if build.is_alive():
            return build
    return None
