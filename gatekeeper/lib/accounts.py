"""The account a command acts as (`--by USERNAME`): its changes are journaled as made by it."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError


def account_named(username: str | None) -> Any:
    """The account of `username`; None when none is named; CommandError when none has it."""
    if not username:
        return None
    account = get_user_model().objects.filter(username=username).first()
    if account is None:
        raise CommandError(f"No user '{username}'.")
    return account
