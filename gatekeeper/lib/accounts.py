"""The account a command acts as (`--by USERNAME`): its changes are journaled as made by it."""

from typing import TYPE_CHECKING, Any, TypeAlias

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

Actor: TypeAlias = "AbstractBaseUser | AnonymousUser | None"
"""Who makes a change: a request's user (anonymous included), a command's account (as
account_named finds it), or None (a command without one, beat)."""


def account_named(username: str | None) -> Any:
    """The account of `username`; None when none is named; CommandError when none has it."""
    if not username:
        return None
    account = get_user_model().objects.filter(username=username).first()
    if account is None:
        raise CommandError(f"No user '{username}'.")
    return account


def account_acting(user: Actor) -> Any:
    """The account to record as the one who made a change (a row's `..._by`, a foreign key to
    the user model): None for nobody known (a command, an anonymous caller)."""
    return user if user is not None and user.is_authenticated else None
