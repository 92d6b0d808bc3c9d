"""Cap experiments: the users of one segment (or of every segment) split into 2 to 5 arms by a
keyed hash of their id under the experiment's own salt (limits.engine.assignment, as the control
group), each arm with its own rules, from a start to an end (DESIGN.md, "Topics, preferences,
holdouts, experiments"). The gate applies each user's arm (limits.engine.table.ArmView): its rules
replace the segment's own rules on the channels they name (`replace`: "3 a week" against
"5 a week"), or are added to them (`add`). Classic caps and every-segment rules still apply
to a segment's experiment: it replaces only what the segment has of its own.

The one rule for an experiment is `experiment_problems` (REST and admin): 2 to 5 arms, each
with a share above 0 (together at most 100 %: the rest of the users keep the segment's rules
and are in no arm) and at least one valid rule; a start before the end; no other live
experiment on the same users at the same time (on the same segment, or one of them on every
segment), so that a user is in one arm at most.

Its life (`status`): scheduled until it starts, running, ended once past its end; stopped by a
person at any time (the arms no longer apply); concluded by promoting one arm's rules to the
segment (its rules created, the segment's own rules they replace disabled: each change audited
as any rule's). While it is scheduled anything may change; once it has started only its name
and end, so that a report never mixes two experiments. Every change is kept
in the one history of settings (the kind `EXPERIMENTS` of limits/policy/authored.py; its arms
are kept with it, as child rows of its JSON), with who made it, how, and what it did in words.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from gatekeeper.lib.accounts import account_acting
from gatekeeper.lib.conflicts import Conflict
from limits.channels import ALL
from limits.models.policy import Holdout, Rule
from limits.models.studies import Experiment, ExperimentArm
from limits.policy.authored import Action, Kind, SettingKind
from limits.policy.holdout import holdout_read, new_salt
from limits.policy.rules import rule_fields_of_json, rule_problems
from limits.policy.services import RULES
from segments.models import Segment

ARMS_MIN, ARMS_MAX = 2, 5
ARM_RULES_MAX = 20  # rules in one arm
LONGEST = timedelta(days=366)
MODES = ("replace", "add")
SCHEDULED, RUNNING, ENDED = "scheduled", "running", "ended"
STOPPED, CONCLUDED = Experiment.State.STOPPED.value, Experiment.State.CONCLUDED.value
STATUSES = (SCHEDULED, RUNNING, ENDED, STOPPED, CONCLUDED)
# Once started, only these may change.
CHANGEABLE_RUNNING = frozenset({"name", "ends_at"})


class NotNow(Conflict):
    """What cannot be done in the experiment's status (stop a concluded one): REST's 409,
    naming `status`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="status")


@dataclass
class ArmFields:
    name: str
    share: float
    rules: list[dict[str, Any]] = field(default_factory=list)  # the REST API's rule shape
    mode: str = "replace"


@dataclass
class ExperimentFields:
    """An experiment as a caller gives it (REST, admin) and as it is stored."""

    name: str
    segment: str | None  # a slug; None: every segment
    arms: list[ArmFields]
    starts_at: datetime
    ends_at: datetime
    salt: str = ""


def status_of(state: str, starts_at: datetime, ends_at: datetime, now: datetime) -> str:
    """What an experiment is doing at `now`: scheduled, running, ended, stopped or concluded."""
    if state != Experiment.State.ACTIVE:
        return state
    if now < starts_at:
        return SCHEDULED
    return RUNNING if now < ends_at else ENDED


def _overlaps(segment: str | None, starts: datetime, ends: datetime, other: Experiment) -> bool:
    other_segment = other.segment.slug if other.segment is not None else None
    same_users = segment is None or other_segment is None or segment == other_segment
    return same_users and starts < other.ends_at and other.starts_at < ends


def experiment_problems(
    fields: ExperimentFields,
    *,
    segments: Iterable[str],
    others: Iterable[Experiment] = (),
    now: datetime | None = None,
) -> dict[str, list[str]]:
    """What is wrong with an experiment, by field (the REST API's names: `arms.1.share`,
    `arms.0.rules.2.window.seconds`); empty when nothing is. `others`: the live experiments
    (active, not this one) it must not overlap; `now`: when given, a start before it (by more
    than a minute) is refused (a new experiment, or a scheduled one moved)."""
    problems: dict[str, list[str]] = {}

    def add(name: str, message: str) -> None:
        problems.setdefault(name, []).append(message)

    name = fields.name.strip()
    if not name or len(name) > 100:
        add("name", '1 to 100 characters, in your words: "3 or 5 a week for Active".')
    known = list(segments)
    if fields.segment is not None and fields.segment not in known:
        add("segment", f"No segment '{fields.segment[:70]}'. Known: {', '.join(known) or 'none'}.")
    if not fields.salt.strip() or len(fields.salt) > 64:
        add("salt", "1 to 64 characters: the arms are drawn from it.")
    if fields.ends_at <= fields.starts_at:
        add("ends_at", "After the start.")
    elif fields.ends_at - fields.starts_at > LONGEST:
        add("ends_at", "At most a year after the start.")
    if now is not None and fields.starts_at < now - timedelta(minutes=1):
        add("starts_at", "Now or later: an experiment cannot start in the past.")
    if not ARMS_MIN <= len(fields.arms) <= ARMS_MAX:
        add("arms", f"{ARMS_MIN} to {ARMS_MAX} arms; {len(fields.arms)} given.")
    shares = [arm.share for arm in fields.arms]
    if all(math.isfinite(s) for s in shares) and sum(shares) > 1 + 1e-9:
        add("arms", f"The arms' shares add up to {sum(shares):.1%}: at most 100 %.")
    names: set[str] = set()
    for n, arm in enumerate(fields.arms):
        where = f"arms.{n}"
        arm_name = arm.name.strip()
        if not arm_name or len(arm_name) > 100:
            add(f"{where}.name", '1 to 100 characters: "3 a week".')
        elif arm_name in names:
            add(f"{where}.name", f"'{arm_name}' names another arm: each its own name.")
        names.add(arm_name)
        if not (math.isfinite(arm.share) and 0 < arm.share <= 1):
            add(f"{where}.share", f"Above 0 and at most 1 (100 %); {arm.share} is not.")
        if arm.mode not in MODES:
            add(f"{where}.mode", f"Choose one of: {', '.join(MODES)}.")
        if not arm.rules:
            add(f"{where}.rules", "At least one rule: an arm is the rules it tries.")
        elif len(arm.rules) > ARM_RULES_MAX:
            add(f"{where}.rules", f"At most {ARM_RULES_MAX} rules; {len(arm.rules)} given.")
        for m, rule in enumerate(arm.rules[:ARM_RULES_MAX]):
            own = rule_fields_of_json(rule)
            own.segment = None  # the experiment's: checked once, above
            for key, messages in rule_problems(own, segments=known).items():
                for message in messages:
                    add(f"{where}.rules.{m}.{key}", message)
    if "ends_at" not in problems:
        for other in others:
            if _overlaps(fields.segment, fields.starts_at, fields.ends_at, other):
                on = f"segment '{other.segment.slug}'" if other.segment else "every segment"
                add("segment", f"Experiment {other.pk} ('{other.name}') runs on {on} from "
                    f"{other.starts_at:%Y-%m-%d %H:%M} to {other.ends_at:%Y-%m-%d %H:%M} UTC: "
                    "a user is in one experiment at a time.")  # fmt: skip
    return problems


def experiment_as_json(row: Experiment, *, now: datetime | None = None) -> dict[str, Any]:
    """An experiment as the REST API shows it (and as its history keeps it)."""
    now = now or timezone.now()
    return {
        "id": row.pk,
        "name": row.name,
        "segment": row.segment.slug if row.segment is not None else None,
        "arms": [
            {"name": arm.name, "share": arm.share, "mode": arm.mode, "rules": list(arm.rules)}
            for arm in row.arms.all()
        ],
        "starts_at": row.starts_at,
        "ends_at": row.ends_at,
        "status": status_of(row.state, row.starts_at, row.ends_at, now),
        "stopped_at": row.stopped_at,
        "concluded_arm": row.concluded_arm or None,
        "salt": row.salt,
    }


def _recorded(row: Experiment) -> dict[str, Any]:
    """As the history keeps it: the JSON, times as text, without the status (which the clock
    moves)."""
    data = experiment_as_json(row)
    data.pop("status")
    for key in ("starts_at", "ends_at", "stopped_at"):
        data[key] = data[key].isoformat() if data[key] is not None else None
    return data


def experiment_fields(row: Experiment) -> ExperimentFields:
    """A stored experiment's fields (the base of a partial change)."""
    return ExperimentFields(
        name=row.name,
        segment=row.segment.slug if row.segment is not None else None,
        arms=[ArmFields(a.name, a.share, list(a.rules), a.mode) for a in row.arms.all()],
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        salt=row.salt,
    )


def _live_others(pk: int | None) -> list[Experiment]:
    live = Experiment.objects.filter(state=Experiment.State.ACTIVE).select_related("segment")
    return list(live if pk is None else live.exclude(pk=pk))


def _checked(fields: ExperimentFields, *, pk: int | None, now: datetime | None) -> Segment | None:
    slugs = list(Segment.objects.values_list("slug", flat=True))
    problems = experiment_problems(fields, segments=slugs, others=_live_others(pk), now=now)
    if problems:
        raise ValidationError(problems)
    return Segment.objects.get(slug=fields.segment) if fields.segment is not None else None


def _write_arms(row: Experiment, arms: Sequence[ArmFields]) -> None:
    row.arms.all().delete()
    ExperimentArm.objects.bulk_create(
        ExperimentArm(
            experiment=row,
            position=n,
            name=arm.name.strip(),
            share=arm.share,
            mode=arm.mode,
            rules=list(arm.rules),
        )
        for n, arm in enumerate(arms)
    )


def _writers_locked() -> None:
    """Take the experiments' writers' lock for the rest of the transaction: one writer at a
    time checks for overlaps and writes, even when no live experiment exists to lock (the
    control group's one row serves: it always exists once read)."""
    holdout_read()
    Holdout.objects.select_for_update().filter(pk=1).exists()


def _locked(row: Experiment) -> Experiment:
    return (
        Experiment.objects.select_for_update(of=("self",)).select_related("segment").get(pk=row.pk)
    )


# Experiments in the one write path: one writer at a time (the writers' lock), each change
# recorded with its arms (the JSON `_recorded`), stop and conclude as named actions.
EXPERIMENTS: SettingKind[Experiment] = SettingKind(
    kind=Kind.EXPERIMENT,
    model=Experiment,
    as_json=lambda row: _recorded(row),
    label=lambda row: row.name,
    lock=_writers_locked,
    invalidates=False,
)


def experiment_create(
    fields: ExperimentFields, *, user: Any = None, via: str = "api", now: datetime | None = None
) -> Experiment:
    """Make an experiment, checked whole (a ValidationError by field, nothing made)."""
    now = now or timezone.now()
    if not fields.salt:
        fields.salt = new_salt()

    def made(_: Experiment | None) -> Experiment:
        segment = _checked(fields, pk=None, now=now)
        row = Experiment.objects.create(
            name=fields.name.strip(),
            segment=segment,
            salt=fields.salt,
            starts_at=fields.starts_at,
            ends_at=fields.ends_at,
            created_by=account_acting(user),
        )
        _write_arms(row, fields.arms)
        return row

    # The writers' lock (EXPERIMENTS.lock): two overlapping ones cannot both pass.
    row = EXPERIMENTS.write(
        Action.CREATED, locate=lambda: None, change=made, user=user, via=via,
        words=experiment_words,
    )  # fmt: skip
    assert row is not None
    return row


def experiment_change(
    row: Experiment,
    changes: Mapping[str, Any],
    *,
    user: Any = None,
    via: str = "api",
    now: datetime | None = None,
) -> Experiment:
    """Change some fields (ExperimentFields' names), checked whole. Once it has started only
    the name and the end may change (and the end not to before now): a ValidationError naming
    the field otherwise, and nothing changed."""
    now = now or timezone.now()

    def changed(locked: Experiment | None) -> Experiment:
        assert locked is not None
        status = status_of(locked.state, locked.starts_at, locked.ends_at, now)
        before = experiment_fields(locked)
        fields = ExperimentFields(**{**before.__dict__, **changes})
        if status != SCHEDULED:
            why = (
                f"Fixed once the experiment is {status}: a report must not mix two experiments. "
                "Stop it and start another."
            )
            fixed = {
                name: [why]
                for name in changes
                if name not in CHANGEABLE_RUNNING and changes[name] != getattr(before, name)
            }
            ended = status in (STOPPED, CONCLUDED, ENDED)
            if ended and changes.get("ends_at", before.ends_at) != before.ends_at:
                fixed["ends_at"] = [f"The experiment is {status}: its end is past."]
            if status == RUNNING and fields.ends_at < now:
                fixed.setdefault("ends_at", []).append("Now or later: stop it to end it now.")
            if fixed:
                raise ValidationError(fixed)
        elif (locked.starts_at - now).total_seconds() < settings.GATEKEEPER_CAPS_TTL_SECONDS + 1:
            soon = {
                name: [
                    "It starts in a moment: every process must know its arms before it "
                    "starts. Move its start first, or stop it and start another."
                ]
                for name in changes
                if name not in CHANGEABLE_RUNNING
                and changes[name] != getattr(before, name)
                and name != "starts_at"
            }
            if soon:
                raise ValidationError(soon)
        moved = "starts_at" in changes and changes["starts_at"] != before.starts_at
        segment = _checked(fields, pk=locked.pk, now=now if moved else None)
        locked.name, locked.segment, locked.salt = fields.name.strip(), segment, fields.salt
        locked.starts_at, locked.ends_at = fields.starts_at, fields.ends_at
        locked.save(update_fields=["name", "segment", "salt", "starts_at", "ends_at"])
        if fields.arms != before.arms:
            _write_arms(locked, fields.arms)
        return locked

    saved = EXPERIMENTS.write(
        Action.CHANGED, locate=lambda: _locked(row), change=changed, user=user, via=via,
        words=experiment_words,
    )  # fmt: skip
    assert saved is not None
    return saved


def experiment_stop(
    row: Experiment, *, user: Any = None, via: str = "api", now: datetime | None = None
) -> Experiment:
    """Stop it now: its arms no longer apply (every user back on the segment's rules). A
    scheduled experiment stopped never starts. NotNow when it is already stopped or concluded."""
    now = now or timezone.now()

    def stopped(locked: Experiment | None) -> Experiment:
        assert locked is not None
        if locked.state != Experiment.State.ACTIVE:
            raise NotNow(f"The experiment is already {locked.state}.")
        locked.state, locked.stopped_at = Experiment.State.STOPPED, now
        locked.save(update_fields=["state", "stopped_at"])
        return locked

    saved = EXPERIMENTS.write(
        Action.STOPPED, locate=lambda: _locked(row), change=stopped, user=user, via=via,
        words="Stopped: every user is back on the segment's rules.",
    )  # fmt: skip
    assert saved is not None
    return saved


def experiment_conclude(
    row: Experiment, arm: str, *, user: Any = None, via: str = "api", now: datetime | None = None
) -> tuple[Experiment, str]:
    """Promote arm `arm`'s rules to the experiment's segment (or to every segment): its rules
    made rules of the segment, and (an arm that replaces) the segment's own rules on the
    channels they name disabled, each change recorded as any rule's (via `experiment`); the
    experiment ends. Returns it and what was done, in words. NotNow for a scheduled or
    already concluded one; a ValidationError naming `arm` for an arm it does not have."""
    now = now or timezone.now()
    said: list[str] = []

    def concluded(locked: Experiment | None) -> Experiment:
        assert locked is not None
        status = status_of(locked.state, locked.starts_at, locked.ends_at, now)
        if status in (SCHEDULED, CONCLUDED):
            raise NotNow(
                f"The experiment is {status}: nothing to conclude yet."
                if status == SCHEDULED
                else "Already concluded."
            )
        arms = {a.name: a for a in locked.arms.all()}
        chosen = arms.get(arm)
        if chosen is None:
            raise ValidationError({"arm": [f"No arm '{arm[:100]}'. Arms: {', '.join(arms)}."]})
        slug = locked.segment.slug if locked.segment is not None else None
        disabled: list[str] = []
        if chosen.mode == ExperimentArm.Mode.REPLACE:
            named = {rule.get("channel") for rule in chosen.rules}
            replaced = Rule.objects.filter(segment=locked.segment, enabled=True, cap__isnull=True)
            if ALL not in named:
                replaced = replaced.filter(Q(channel__in=named))
            for rule in replaced.select_related("segment"):
                RULES.update(row=rule, changes={"enabled": False}, user=user, via="experiment")
                disabled.append(rule.name)
        made = []
        for rule in chosen.rules:
            fields = rule_fields_of_json(rule)
            fields.segment = slug
            made.append(RULES.create(fields=fields, user=user, via="experiment").name)
        locked.state, locked.concluded_arm = Experiment.State.CONCLUDED, chosen.name
        if locked.stopped_at is None and now < locked.ends_at:
            locked.stopped_at = now
        locked.save(update_fields=["state", "concluded_arm", "stopped_at"])
        where = f"segment '{slug}'" if slug else "every segment"
        words = f"Concluded: arm '{chosen.name}' promoted to {where}: made " + ", ".join(
            f"'{n}'" for n in made
        )
        if disabled:
            words += "; disabled " + ", ".join(f"'{n}'" for n in disabled)
        words += "."
        said.append(words)
        return locked

    saved = EXPERIMENTS.write(
        Action.CONCLUDED, locate=lambda: _locked(row), change=concluded, user=user, via=via,
        words=lambda _: said[0],
    )  # fmt: skip
    assert saved is not None
    return saved, said[0]


def experiment_words(row: Experiment) -> str:
    """An experiment in plain words."""
    where = f"segment '{row.segment.slug}'" if row.segment is not None else "every segment"
    arms = "; ".join(
        f"'{a.name}' {a.share:.0%} ({'replacing' if a.mode == 'replace' else 'adding to'} its "
        f"rules: {', '.join(str(r.get('name', '')) for r in a.rules)})"
        for a in row.arms.all()
    )
    return (
        f"On {where}, from {row.starts_at:%Y-%m-%d %H:%M} to {row.ends_at:%Y-%m-%d %H:%M} UTC: "
        f"{arms}."
    )
