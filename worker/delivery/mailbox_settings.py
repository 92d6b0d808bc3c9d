"""Mailbox providers and warm-up plans in the one write path (limits/policy/authored.py): made,
changed and deleted from the admin and the REST API, each change checked whole by its kind's one
rule (worker.delivery.mailboxes.mailbox_problems, worker.delivery.warmup.warmup_problems) and
recorded in the one history; a brake's pause and a person's resume are changes like any other
(actions `paused`, `resumed`).

Once a change commits, this process reads the groups and plans again; the others within
GROUPS_TTL (5 s). A resumed group's waiting email is handed out at once, as is a deleted
group's.
"""

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import asdict
from datetime import date, datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from gatekeeper.lib.conflicts import Conflict
from gatekeeper.lib.problems import Problem, Problems
from limits.models.policy import SettingChange
from limits.policy.authored import SettingKind, deleted
from worker.delivery.brakes import brake_figures, brake_forget, brake_tripped
from worker.delivery.deliverability import WARMUP, brake_hold
from worker.delivery.mailboxes import (
    GROUPS_MAX,
    OTHER,
    PERIODS,
    mailbox_problems,
    mailboxes_forget,
    rates_normalised,
)
from worker.delivery.warmup import DEFAULT_RAMP, warmup_forget, warmup_problems
from worker.models import MailboxProvider, SendChunk, WarmupPlan, chunks_waiting

logger = logging.getLogger(__name__)
Action = SettingChange.Action
Kind = SettingChange.Kind
MAILBOX_FIELDS = ("slug", "name", "domains", "mx_hosts", "rates")
WARMUP_FIELDS = ("domain", "time_zone", "starts_on", "volumes")


def mailbox_shown(row: MailboxProvider) -> dict[str, Any]:
    """A group as the REST API shows it (and the history keeps it)."""
    return {
        "slug": row.slug,
        "name": row.name,
        "domains": list(row.domains),
        "mx_hosts": list(row.mx_hosts),
        "rates": rates_normalised(row.rates),
        "paused": row.paused_at is not None,
        "paused_at": row.paused_at.isoformat() if row.paused_at else None,
        "paused_why": row.paused_why if row.paused_at else None,
        "resumed_at": row.resumed_at.isoformat() if row.resumed_at else None,
    }


def rate_words(entry: Mapping[str, Any]) -> str:
    """A rates entry in words: "10 a second and 500 a minute through smtp"."""
    periods = [f"{entry[name]:g} a {name[4:]}" for name, _ in PERIODS if entry.get(name)]
    through = "every dispatcher" if entry["dispatcher"] == "*" else entry["dispatcher"]
    return f"{' and '.join(periods)} through {through}"


def mailbox_words(action: str, before: Any, after: Any) -> str:
    """A group's change in words."""
    if action == Action.CREATED:
        return f"Created {after['name']}: {', '.join(after['domains']) or 'no domain'}."
    if action == Action.DELETED:
        return f"Deleted {before['name']}: its domains are in 'other' now."
    if action == Action.PAUSED:
        return f"Paused by the brake: {(after.get('paused_why') or {}).get('words', '')}".strip()
    if action == Action.RESUMED:
        return "Resumed: its waiting email is handed out again."
    lines = []
    for key in ("name", "domains", "mx_hosts"):
        if before.get(key) != after.get(key):
            lines.append(f"{key}: {before.get(key)} → {after.get(key)}")
    if before.get("rates") != after.get("rates"):
        rates = "; ".join(map(rate_words, after["rates"])) or "none"
        lines.append(f"rates: {rates}")
    return "; ".join(lines) or "Nothing visible changed."


def _after_commit() -> None:
    """This process reads the groups and plans again: at its next read, and once the change
    committed (a read in between would see them as they were)."""
    for forget in (mailboxes_forget, warmup_forget):
        forget()
        transaction.on_commit(forget)


MAILBOXES: SettingKind[MailboxProvider] = SettingKind(
    kind=Kind.MAILBOX_PROVIDER,
    model=MailboxProvider,
    as_json=mailbox_shown,
    label=lambda row: row.slug,
    worded=mailbox_words,
    invalidates=False,
)


def _others(slug: str | None) -> dict[str, list[str]]:
    return {
        s: list(domains)
        for s, domains in MailboxProvider.objects.exclude(slug=slug or "").values_list(
            "slug", "domains"
        )
    }


def _checked(fields: Mapping[str, Any], *, slug: str | None) -> dict[str, Any]:
    problems = mailbox_problems(fields, others=_others(slug))
    if problems:
        raise Problems(problems)
    return {**fields, "rates": rates_normalised(fields.get("rates", []))}


def mailbox_create(
    fields: Mapping[str, Any], *, by: Any = None, via: str = "api"
) -> MailboxProvider:
    """A new group. Problems names each bad field; nothing is made then."""
    fields = {name: fields.get(name, [] if name != "name" else "") for name in MAILBOX_FIELDS}
    checked = _checked(fields, slug=None)
    if MailboxProvider.objects.filter(slug=checked["slug"]).exists():
        raise Problem(f"There is a group {checked['slug']!r} already.", field="slug")
    if MailboxProvider.objects.count() >= GROUPS_MAX:
        raise Problem(f"At most {GROUPS_MAX} groups.", field="slug")

    def made(_: MailboxProvider | None) -> MailboxProvider:
        return MailboxProvider.objects.create(**checked)

    _after_commit()
    row = MAILBOXES.write(Action.CREATED, locate=lambda: None, change=made, user=by, via=via)
    assert row is not None
    return row


def mailbox_change(
    row: MailboxProvider, changes: Mapping[str, Any], *, by: Any = None, via: str = "api"
) -> MailboxProvider:
    """Change some of a group's fields (name, domains, mx_hosts, rates; its slug stays);
    checked whole."""
    if "slug" in changes and changes["slug"] != row.slug:
        raise Problem("A group's slug cannot change: make a new group.", field="slug")

    def changed(locked: MailboxProvider | None) -> MailboxProvider:
        assert locked is not None
        fields = {name: getattr(locked, name) for name in MAILBOX_FIELDS}
        checked = _checked({**fields, **changes}, slug=locked.slug)
        for name in MAILBOX_FIELDS[1:]:
            setattr(locked, name, checked[name])
        locked.save()
        return locked

    _after_commit()
    saved = MAILBOXES.write(
        Action.CHANGED,
        locate=lambda: MailboxProvider.objects.select_for_update().get(pk=row.pk),
        change=changed,
        user=by,
        via=via,
    )
    assert saved is not None
    return saved


def mailbox_undeletable(row: MailboxProvider) -> str | None:
    """Why the group cannot be deleted, in words; None when it can."""
    if row.slug == OTHER:
        return "'other' takes every domain no group names: it cannot be deleted."
    plans = [p.domain for p in WarmupPlan.objects.all() if row.slug in p.volumes]
    if plans:
        return f"The warm-up plan of {', '.join(plans)} names {row.slug!r}: change the plan first."
    return None


def mailbox_delete(row: MailboxProvider, *, by: Any = None, via: str = "api") -> None:
    """Delete a group: its domains fall in `other`, its waiting email is handed out. `other`
    stays, and a group a warm-up plan names stays until the plan stops naming it (a Problem
    naming `slug`)."""
    problem = mailbox_undeletable(row)
    if problem is not None:
        raise Problem(problem, field="slug")
    _after_commit()
    MAILBOXES.write(Action.DELETED, locate=lambda: row, change=deleted, user=by, via=via)
    _handed_out(row.slug)


def mailbox_pause(
    row: MailboxProvider, why: dict[str, Any], *, now: datetime | None = None
) -> MailboxProvider | None:
    """The brake stops a group's email (`why`: the figures it read, with `words`). None when it
    is paused already."""
    now = now or timezone.now()
    if MailboxProvider.objects.filter(pk=row.pk, paused_at__isnull=False).exists():
        return None  # one brake check at a time (the beat leader's): no race to lose

    def paused(locked: MailboxProvider | None) -> MailboxProvider | None:
        assert locked is not None
        locked.paused_at, locked.paused_why = now, why
        locked.save(update_fields=["paused_at", "paused_why", "changed_at"])
        return locked

    _after_commit()
    return MAILBOXES.write(
        Action.PAUSED,
        locate=lambda: MailboxProvider.objects.select_for_update().get(pk=row.pk),
        change=paused,
        via="brake",
        words=f"Paused by the brake: {why.get('words', '')}".strip(),
    )


def mailbox_resume(
    row: MailboxProvider, *, by: Any = None, via: str = "api", now: datetime | None = None
) -> MailboxProvider:
    """A person resumes a paused group: its waiting email is handed out at once, and the brake
    counts only mail sent from now on. A Conflict naming `paused` when it is not paused."""
    now = now or timezone.now()

    def resumed(locked: MailboxProvider | None) -> MailboxProvider:
        assert locked is not None
        if locked.paused_at is None:
            raise Conflict(
                f"{locked.slug!r} is not paused: there is nothing to resume.", field="paused"
            )
        locked.paused_at, locked.resumed_at = None, now
        locked.save(update_fields=["paused_at", "resumed_at", "changed_at"])
        return locked

    _after_commit()
    saved = MAILBOXES.write(
        Action.RESUMED,
        locate=lambda: MailboxProvider.objects.select_for_update().get(pk=row.pk),
        change=resumed,
        user=by,
        via=via,
    )
    assert saved is not None
    brake_forget(saved.slug)  # the brake counts from now on
    _handed_out(saved.slug, now=now)
    return saved


def braked_waiting(slug: str) -> "QuerySet[SendChunk]":
    """A group's email waiting for its brake."""
    return chunks_waiting().filter(held=brake_hold(slug))


def _handed_out(slug: str, *, now: datetime | None = None) -> None:
    """The group's waiting email due now (beat's send_chunks_due queues it)."""
    braked_waiting(slug).update(not_before=now or timezone.now(), queued_at=None)


# --- warm-up plans -----------------------------------------------------------------------------


def warmup_shown(row: WarmupPlan) -> dict[str, Any]:
    return {
        "id": row.pk,
        "domain": row.domain,
        "time_zone": row.time_zone,
        "starts_on": row.starts_on.isoformat(),
        "volumes": {group: list(ramp) for group, ramp in row.volumes.items()},
        "ended": dict(row.ended),
    }


def warmup_words(action: str, before: Any, after: Any) -> str:
    if action == Action.CREATED:
        groups = ", ".join(f"{g} ({len(r)} days)" for g, r in after["volumes"].items())
        return f"Warm-up of {after['domain']} from {after['starts_on']}: {groups}."
    if action == Action.DELETED:
        return f"Deleted the warm-up of {before['domain']}: nothing is held for it any more."
    lines = [
        f"{key}: {before.get(key)} → {after.get(key)}"
        for key in ("domain", "time_zone", "starts_on")
        if before.get(key) != after.get(key)
    ]
    for group in sorted(set(before["volumes"]) | set(after["volumes"])):
        old, new = before["volumes"].get(group), after["volumes"].get(group)
        if old != new:
            lines.append(f"{group}: {new if new is not None else 'not held'}")
    return "; ".join(lines) or "Nothing visible changed."


WARMUPS: SettingKind[WarmupPlan] = SettingKind(
    kind=Kind.WARMUP,
    model=WarmupPlan,
    as_json=warmup_shown,
    label=lambda row: row.domain,
    worded=warmup_words,
    invalidates=False,
)


def warmup_default(groups: list[str]) -> dict[str, list[int]]:
    """The ramp offered: DEFAULT_RAMP for every group but `other`."""
    return {group: list(DEFAULT_RAMP) for group in groups if group != OTHER}


def _warmup_checked(fields: Mapping[str, Any], *, pk: int | None) -> dict[str, Any]:
    fields = dict(fields)
    if isinstance(fields.get("starts_on"), str):
        with contextlib.suppress(ValueError):  # named by the rule
            fields["starts_on"] = date.fromisoformat(fields["starts_on"])
    groups = list(MailboxProvider.objects.values_list("slug", flat=True))
    problems = warmup_problems(fields, groups=groups)
    others = WarmupPlan.objects.filter(domain=fields["domain"])
    if not problems and others.exclude(pk=pk or 0).exists():
        problems = {"domain": [f"{fields['domain']} has a warm-up plan already."]}
    if problems:
        raise Problems(problems)
    return fields


def warmup_create(fields: Mapping[str, Any], *, by: Any = None, via: str = "api") -> WarmupPlan:
    """A new plan (volumes: the default ramp when not given). Problems names each bad field."""
    given = {
        "time_zone": "UTC",
        "starts_on": timezone.now().date(),
        **{k: v for k, v in fields.items() if k in WARMUP_FIELDS},
    }
    if "volumes" not in given:
        given["volumes"] = warmup_default(
            list(MailboxProvider.objects.values_list("slug", flat=True))
        )
    checked = _warmup_checked(given, pk=None)

    def made(_: WarmupPlan | None) -> WarmupPlan:
        return WarmupPlan.objects.create(**checked)

    _after_commit()
    row = WARMUPS.write(Action.CREATED, locate=lambda: None, change=made, user=by, via=via)
    assert row is not None
    return row


def warmup_change(
    row: WarmupPlan, changes: Mapping[str, Any], *, by: Any = None, via: str = "api"
) -> WarmupPlan:
    """Change some of a plan's fields; checked whole. A group whose ramp changed starts again
    (its `ended` is dropped)."""

    def changed(locked: WarmupPlan | None) -> WarmupPlan:
        assert locked is not None
        fields = {name: getattr(locked, name) for name in WARMUP_FIELDS}
        checked = _warmup_checked({**fields, **changes}, pk=locked.pk)
        for name in WARMUP_FIELDS:
            setattr(locked, name, checked[name])
        locked.ended = {
            g: day
            for g, day in locked.ended.items()
            if g in checked["volumes"] and checked["volumes"][g] == fields["volumes"].get(g)
        }
        locked.save()
        return locked

    _after_commit()
    saved = WARMUPS.write(
        Action.CHANGED,
        locate=lambda: WarmupPlan.objects.select_for_update().get(pk=row.pk),
        change=changed,
        user=by,
        via=via,
    )
    assert saved is not None
    _warmup_handed_out(row.domain)
    return saved


def warmup_delete(row: WarmupPlan, *, by: Any = None, via: str = "api") -> None:
    """Delete a plan: its domain's email is held no more (what waits goes at its time)."""
    _after_commit()
    WARMUPS.write(Action.DELETED, locate=lambda: row, change=deleted, user=by, via=via)
    _warmup_handed_out(row.domain)


def _warmup_handed_out(domain: str) -> None:
    """A changed or deleted plan's waiting email due now: looked at again under what it says."""
    chunks_waiting().filter(held__startswith=f"{WARMUP}:{domain}:").update(
        not_before=timezone.now(), queued_at=None
    )


# --- the brakes' check -----------------------------------------------------------------------


def brakes_check(*, now: datetime | None = None) -> list[str]:
    """Pause every group a brake trips (beat's `mailbox_brakes`). Returns the groups paused."""
    now = now or timezone.now()
    paused = []
    for row in MailboxProvider.objects.filter(paused_at__isnull=True):
        figures = brake_figures(row.slug, now=now)
        words = brake_tripped(figures)
        if words is None:
            continue
        why = {
            **asdict(figures),
            "delivered": figures.delivered,
            "complaint_rate": round(figures.complaint_rate, 6),
            "bounce_rate": round(figures.bounce_rate, 6),
            "words": words,
        }
        if mailbox_pause(row, why, now=now) is not None:
            logger.warning("Mailbox provider %s paused by its brake: %s", row.slug, words)
            paused.append(row.slug)
    return paused
