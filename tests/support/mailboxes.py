"""Deliverability in tests: the mailbox providers every install starts with (the migration's,
made again after a transactional test's flush) and a send job's email waiting for a hold."""

import importlib
from datetime import datetime, timedelta

from django.utils import timezone

from tests.support.sends import make_job
from worker.models import MailboxProvider, SendChunk, SendJob

_MIGRATION = importlib.import_module("worker.migrations.0022_deliverability")


def default_groups() -> list[str]:
    """The five default groups, as the migration makes them (a flushed database has none)."""
    for slug, name, domains, mx_hosts in _MIGRATION.DEFAULT_GROUPS:
        MailboxProvider.objects.get_or_create(
            slug=slug, defaults={"name": name, "domains": domains, "mx_hosts": mx_hosts}
        )
    return sorted(slug for slug, *_ in _MIGRATION.DEFAULT_GROUPS)


def waiting_chunk(
    held: str, size: int, *, job: SendJob | None = None, not_before: datetime | None = None
) -> SendChunk:
    """A queued waiting chunk of `size` recipients held as `held` (a job of its own unless
    given), as a chunk run leaves one."""
    job = job or make_job(*range(1, size + 1))
    return SendChunk.objects.create(
        job=job,
        kind=SendChunk.Kind.DEFERRED,
        recipients=[{"user_id": i, "address": f"u{i}@example.com"} for i in range(1, size + 1)],
        size=size,
        held=held,
        not_before=not_before or timezone.now() + timedelta(hours=1),
    )
