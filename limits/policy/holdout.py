"""The global control group: a share of users (0.1 % to 20 %, or 0 for none) who get no
marketing at all, so that what marketing (and capping it) brings can be measured against them
(DESIGN.md, "Topics, preferences, holdouts, ..."). Chosen by a keyed hash of the user id under
the group's salt (limits.engine.assignment): no list is kept, and a user stays in or out across
snapshots, segment changes, restarts and processes. Users of the excluded segments, and sends
carrying an excluded tag, are never held out; transactional sends always pass.

The one rule for the group is `holdout_problems` (REST and admin); `holdout_set` writes it and
its history (the kind `HOLDOUT`, a singleton of the one write path:
limits/policy/authored.py) in one transaction and says what the change does: a share that
grows keeps everyone who was out still out (the hash's bound only moves up); one that shrinks
lets back exactly the users between the two bounds; a new salt draws a new group.
"""

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from gatekeeper.lib.accounts import account_acting
from limits.engine.assignment import CONTROL_GROUP
from limits.models.policy import Holdout
from limits.models.studies import StudyDay, StudyEvent, StudyMember
from limits.policy.authored import Action, Kind, SettingKind
from limits.policy.rules import validate_tag

SHARE_MIN, SHARE_MAX = 0.001, 0.2  # 0.1 % to 20 %; 0: no group


@dataclass
class HoldoutFields:
    """The group as a caller gives it (REST, admin) and as it is stored."""

    share: float = 0.0
    salt: str = ""
    exclude_segments: list[str] = field(default_factory=list)
    exclude_tags: list[str] = field(default_factory=list)


def holdout_problems(fields: HoldoutFields, *, segments: Iterable[str]) -> dict[str, list[str]]:
    """What is wrong with the group, by field; empty when nothing is."""
    problems: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    if fields.share != 0 and not SHARE_MIN <= fields.share <= SHARE_MAX:
        add("share", f"From {SHARE_MIN} (0.1 %) to {SHARE_MAX} (20 %), or 0 for no group; "
            f"{fields.share} is not.")  # fmt: skip
    if not fields.salt.strip() or len(fields.salt) > 64:
        add("salt", "1 to 64 characters: the group is drawn from it.")
    known = set(segments)
    for n, slug in enumerate(fields.exclude_segments):
        if slug not in known:
            listed = ", ".join(sorted(known)) or "none"
            add(f"exclude_segments.{n}", f"No segment '{slug[:70]}'. Known: {listed}.")
    for n, tag in enumerate(fields.exclude_tags):
        if (why := validate_tag(tag)) is not None:
            add(f"exclude_tags.{n}", why)
    for name, values in (("exclude_segments", fields.exclude_segments),
                         ("exclude_tags", fields.exclude_tags)):  # fmt: skip
        if len(set(values)) != len(values):
            add(name, "Each once.")
    return problems


def holdout_as_json(fields: HoldoutFields) -> dict[str, Any]:
    return {
        "share": fields.share,
        "salt": fields.salt,
        "exclude_segments": sorted(fields.exclude_segments),
        "exclude_tags": sorted(fields.exclude_tags),
    }


def holdout_read() -> HoldoutFields:
    """The group as it stands (when never set: made, a share of 0 and a salt of its own, so
    that the salt read is the one a later change keeps)."""
    row, _ = Holdout.objects.get_or_create(pk=1, defaults={"salt": new_salt()})
    return _fields(row)


def _fields(row: Holdout) -> HoldoutFields:
    return HoldoutFields(
        share=row.share,
        salt=row.salt,
        exclude_segments=list(row.exclude_segments or []),
        exclude_tags=list(row.exclude_tags or []),
    )


def new_salt() -> str:
    return secrets.token_hex(16)


def holdout_change_words(before: HoldoutFields, after: HoldoutFields) -> str:
    """What a change does to who is held out, in plain words."""
    if before.salt != after.salt and before.share and after.share:
        return (
            f"A new salt draws a new group: {after.share:.1%} of users, about "
            f"{before.share * (1 - after.share):.1%} of them coming back and as many newly "
            "held out."
        )
    if after.share > before.share:
        return (
            f"The group grows from {before.share:.1%} to {after.share:.1%} of users: everyone "
            f"held out stays out, and {after.share - before.share:.1%} of users join them."
        )
    if after.share < before.share:
        return (
            f"The group shrinks from {before.share:.1%} to {after.share:.1%} of users: "
            f"{before.share - after.share:.1%} of users come back (those whose hash lies "
            "between the two bounds); everyone else held out stays out."
        )
    return "Who is held out is unchanged."


def _change_words(action: str, before: Any, after: Any) -> str:
    return holdout_change_words(HoldoutFields(**before), HoldoutFields(**after))


def _locked() -> Holdout:
    holdout_read()  # the row, made when never set
    return Holdout.objects.select_for_update().get(pk=1)


# The control group: a singleton (no object id in its history); the gate's cache of it follows
# within the cache's TTL, as before.
HOLDOUT: SettingKind[Holdout] = SettingKind(
    kind=Kind.CONTROL_GROUP,
    model=Holdout,
    as_json=lambda row: holdout_as_json(_fields(row)),
    label=lambda row: "control group",
    worded=_change_words,
    invalidates=False,
    singleton=True,
)


def holdout_set(
    fields: HoldoutFields, *, segments: Iterable[str], via: str, by: Any = None
) -> tuple[HoldoutFields, str]:
    """Set the group, checked whole: a ValidationError by field and nothing changed for
    anything wrong. Returns it as stored and what the change does, in words."""
    problems = holdout_problems(fields, segments=segments)
    if problems:
        raise ValidationError(problems)
    found: list[HoldoutFields] = []

    def set_whole(row: Holdout | None) -> Holdout:
        assert row is not None
        before = _fields(row)
        found.append(before)
        after = holdout_as_json(fields)
        if holdout_as_json(before) == after:
            return row
        if (before.share, before.salt) != (fields.share, fields.salt):
            control_group_reset()  # who is in it changed: its report starts afresh
        row.share, row.salt = fields.share, fields.salt
        row.exclude_segments, row.exclude_tags = after["exclude_segments"], after["exclude_tags"]
        row.changed_by = account_acting(by)
        row.save()
        return row

    HOLDOUT.write(Action.CHANGED, locate=_locked, change=set_whole, user=by, via=via)
    (before,) = found
    if holdout_as_json(before) == holdout_as_json(fields):
        return before, holdout_change_words(before, fields)
    return fields, holdout_change_words(before, fields)


def control_group_reset() -> None:
    """Start the control group's report afresh (its share or salt changed)."""
    for model in (StudyMember, StudyDay, StudyEvent):
        model.objects.filter(study=CONTROL_GROUP).delete()
