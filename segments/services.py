"""Writes of the segments app: segments, user-list uploads, and starting builds.

Admin actions, REST views and management commands call these; the background work they start
(a build, the validation of a large list) is queued here, on commit, and done in
`segments.publishing` and `segments.user_lists` by the tasks.
"""

from typing import Any

from django.db import IntegrityError, transaction

from gatekeeper.lib.accounts import Actor, account_acting
from gatekeeper.lib.conflicts import Conflict
from segments import tasks
from segments.models import Build, DefaultSegmentProtected, Segment, UserList
from segments.publishing import BuildInProgress, build_give_up
from segments.user_lists import user_list_store


class SegmentConflict(Conflict):
    """The change conflicts with another segment (its slug or priority is taken) or with what
    a segment is (the default one cannot be deleted): the REST API answers 409. `field` names
    the field at fault, if one is."""


def _taken(segment: Segment) -> None:
    others = Segment.objects.exclude(pk=segment.pk)
    if others.filter(slug=segment.slug).exists():
        raise SegmentConflict(
            f"The slug '{segment.slug}' is taken by another segment.", field="slug"
        )
    if others.filter(priority=segment.priority).exists():
        raise SegmentConflict(
            f"The priority {segment.priority} is taken by another segment; each has its own "
            "(lower wins).",
            field="priority",
        )


def _saved(segment: Segment, *, update_fields: list[str] | None = None) -> Segment:
    """Save after checking what is taken; a concurrent request that took it between the check
    and the write is a conflict too, not an IntegrityError."""
    _taken(segment)
    try:
        with transaction.atomic():
            segment.save(update_fields=update_fields)
    except IntegrityError as exc:
        raise SegmentConflict(
            f"A segment with the slug '{segment.slug}' or the priority {segment.priority} was "
            "saved at the same moment; look at the segments and try again."
        ) from exc
    return segment


def segment_create(
    *, slug: str, name: str, priority: int, description: str = "", time_zone: str = ""
) -> Segment:
    """A new segment. Raises ValidationError naming a bad field, SegmentConflict when its slug
    or priority is taken. `time_zone`: "" for GATEKEEPER_DEFAULT_TIME_ZONE."""
    segment = Segment(
        slug=slug, name=name, priority=priority, description=description, time_zone=time_zone
    )
    segment.full_clean(validate_unique=False)
    return _saved(segment)


def segment_change(*, segment: Segment, **changes: object) -> Segment:
    """Change a segment's name, priority, description or time zone. Its slug never changes: it
    names the segment in published snapshots, and caps are matched to users by it, so a renamed
    segment would lose its caps until the next build."""
    unknown = set(changes) - {"name", "priority", "description", "time_zone"}
    if unknown:
        raise ValueError(f"cannot change {', '.join(sorted(unknown))}")
    if not changes:
        return segment
    for field, value in changes.items():
        setattr(segment, field, value)
    segment.full_clean(validate_unique=False)
    return _saved(segment, update_fields=[*changes, "updated_at"])


def segment_delete(*, segment: Segment) -> None:
    """Delete a segment with its lists and caps. Raises SegmentConflict for the default one,
    which holds everyone in no list."""
    try:
        with transaction.atomic():
            segment.delete()
    except DefaultSegmentProtected as exc:
        raise SegmentConflict(exc.messages[0]) from exc


def user_list_import(  # type: ignore[explicit-any]  # an upload, a file or a command's stream
    *,
    segment: Segment,
    fileobj: Any,
    name: str,
    replace: bool = False,
    user: Actor = None,
    inline_bytes: int | None = None,
) -> UserList:
    """Validate a user-list file and store it as one of the segment's lists (see
    `segments.user_lists.user_list_store`). The web process passes `inline_bytes`
    (GATEKEEPER_USER_LIST_INLINE_BYTES): a longer list is stored as `validating` and its
    validation queued once the transaction commits; None validates everything here."""
    with transaction.atomic():
        user_list = user_list_store(
            segment=segment,
            fileobj=fileobj,
            name=name,
            replace=replace,
            user=user,
            inline_bytes=inline_bytes,
        )
        if user_list.status == UserList.Status.VALIDATING:
            # robust: a broker outage leaves the list for beat's `user_lists_stalled`, not a
            # 500 after it was stored.
            transaction.on_commit(lambda: tasks.user_list_validate.delay(user_list.pk), robust=True)
    return user_list


def build_start(*, user: Actor = None, queue: bool = True) -> Build:
    """Queue a build. Refused (BuildInProgress) while another build is queued or running.

    `queue=False` only creates the row, for a caller that runs `build_run` itself."""
    with transaction.atomic():
        active = Build.objects.select_for_update().filter(
            status__in=[Build.Status.QUEUED, Build.Status.RUNNING]
        )
        for build in active:
            if build.is_alive():
                raise BuildInProgress(build)
            build_give_up(
                build, "The worker running this build stopped reporting; it was given up."
            )
        build = Build.objects.create(requested_by=account_acting(user))
        if queue:
            transaction.on_commit(lambda: tasks.build_snapshot.delay(build.pk))
    return build
