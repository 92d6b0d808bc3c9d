"""Sending domains as people add, change and delete them: through the one write path (each
change in the settings' history, with who made it and in words), checked by the one rule for
their fields (worker/delivery/dns_checks.py, `sending_domain_problems`). What DNS says of one
is read when asked (`domain_checked`), never stored."""

from typing import Any

from django.db import IntegrityError

from gatekeeper.lib.problems import Problems
from limits.policy.authored import Action, Kind, SettingKind, deleted
from worker.delivery.dns_checks import SendingDomainFields, sending_domain_problems
from worker.models import SendingDomain


class SendingDomainInvalid(Problems):
    """A sending domain's fields that break its rule, every one named by field."""


def sending_domain_recorded(row: SendingDomain) -> dict[str, Any]:
    """A sending domain as the history keeps it (its list copied: the history's `before` stays
    as it was whatever the change does to the row)."""
    return {
        "id": row.pk,
        "domain": row.domain,
        "dkim_selectors": list(row.dkim_selectors),
        "return_path": row.return_path,
    }


def _described(record: dict[str, Any]) -> str:
    selectors = ", ".join(record.get("dkim_selectors") or []) or "none"
    return_path = record.get("return_path") or "the domain itself"
    return f"{record['domain']}, DKIM selectors {selectors}, return path {return_path}"


def sending_domain_change_words(action: str, before: Any, after: Any) -> str:
    if action == Action.CREATED:
        return f"Created: {_described(after)}."
    if action == Action.DELETED:
        return f"Deleted: {before['domain']} is no longer checked."
    names = {"domain": "domain", "dkim_selectors": "DKIM selectors", "return_path": "return path"}
    changed = [
        f"{label}: {_value(before.get(key))} → {_value(after.get(key))}"
        for key, label in names.items()
        if before.get(key) != after.get(key)
    ]
    return "; ".join(changed) or "Nothing visible changed."


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value) if value else "none"


# Sending domains in the one write path. Nothing the gate decides by reads them: no cache to drop.
SENDING_DOMAINS: SettingKind[SendingDomain] = SettingKind(
    kind=Kind.SENDING_DOMAIN,
    model=SendingDomain,
    as_json=sending_domain_recorded,
    label=lambda row: row.domain,
    worded=sending_domain_change_words,
    invalidates=False,
)


def sending_domain_checked(
    fields: SendingDomainFields, *, row_id: int | None = None
) -> SendingDomainFields:
    """The fields as stored, checked: their rule, and no other sending domain (than `row_id`,
    the one being changed) of that name. SendingDomainInvalid names every bad field."""
    fields = SendingDomainFields(
        domain=fields.domain,
        dkim_selectors=tuple(fields.dkim_selectors),
        return_path=fields.return_path,
    )
    problems = sending_domain_problems(fields)
    taken = SendingDomain.objects.filter(domain=fields.domain)
    if row_id is not None:
        taken = taken.exclude(pk=row_id)
    if "domain" not in problems and taken.exists():
        problems["domain"] = [f"{fields.domain} is a sending domain already."]
    if problems:
        raise SendingDomainInvalid(problems)
    return fields


def _put(row: SendingDomain, fields: SendingDomainFields) -> SendingDomain:
    row.domain, row.return_path = fields.domain, fields.return_path
    row.dkim_selectors = list(fields.dkim_selectors)
    try:
        row.save()
    except IntegrityError:  # another person added the same domain meanwhile
        raise SendingDomainInvalid(
            {"domain": [f"{fields.domain} is a sending domain already."]}
        ) from None
    return row


def sending_domain_create(
    *, fields: SendingDomainFields, by: Any = None, via: str = "admin"
) -> SendingDomain:
    """A new sending domain. SendingDomainInvalid names the bad fields; nothing is made then."""
    fields = sending_domain_checked(fields)
    made = SENDING_DOMAINS.write(
        Action.CREATED,
        locate=lambda: None,
        change=lambda _: _put(SendingDomain(), fields),
        user=by,
        via=via,
    )
    assert made is not None
    return made


def sending_domain_change(
    row: SendingDomain, *, fields: SendingDomainFields, by: Any = None, via: str = "admin"
) -> SendingDomain:
    """Change a sending domain's fields (checked whole). SendingDomainInvalid names the bad
    ones; nothing changes then."""
    fields = sending_domain_checked(fields, row_id=row.pk)

    def changed(locked: SendingDomain | None) -> SendingDomain:
        assert locked is not None
        return _put(locked, fields)

    saved = SENDING_DOMAINS.write(
        Action.CHANGED,
        locate=lambda: SendingDomain.objects.select_for_update().get(pk=row.pk),
        change=changed,
        user=by,
        via=via,
    )
    assert saved is not None
    return saved


def sending_domain_delete(row: SendingDomain, *, by: Any = None, via: str = "admin") -> None:
    SENDING_DOMAINS.write(Action.DELETED, locate=lambda: row, change=deleted, user=by, via=via)
