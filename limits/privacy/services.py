"""Erasures made: the people kept as erased at once, the run queued
(limits/privacy/erasure.py does the work)."""

from collections.abc import Sequence

from django.db import transaction

from gatekeeper.lib.accounts import Actor, account_acting
from limits.models.privacy import Erasure
from limits.people.suppression import erased_add
from limits.privacy.erasure import users_packed
from limits.privacy.tasks import users_erase

# --- erasures ---------------------------------------------------------------------------------


def erasure_start(*, user_ids: Sequence[int], via: str, by: Actor = None) -> Erasure:
    """An erasure of `user_ids` (each once), queued once committed; beat takes it up should the
    task be lost. The people are kept as erased in the same transaction: from its commit the
    gate refuses them. Idempotent in effect: erasing someone again removes nothing more."""
    ids = sorted(set(user_ids))
    with transaction.atomic():
        erased_add(ids)
        erasure = Erasure.objects.create(
            requested_by=account_acting(by), via=via, count=len(ids), users=users_packed(ids)
        )
        transaction.on_commit(lambda: users_erase.delay(erasure.pk))
    return erasure
