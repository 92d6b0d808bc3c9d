"""Uploaded files kept in the media storage: the name one is stored under, and its removal once
a transaction has committed."""

from collections.abc import Callable
from typing import Any


def storage_name(name: str, default: str) -> str:
    """A file name fit for the storage: the last part of `name`, letters, digits, `.`, `_` and
    `-` kept, anything else `_`, at most 100 characters (the end kept); `default` when nothing
    is left."""
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in name.rsplit("/", 1)[-1])
    return base[-100:] or default


def remover(field_file: Any) -> Callable[[], None]:
    """What removes a stored file, for transaction.on_commit: a rolled-back change must not lose
    the file of a row that stays."""
    storage, name = field_file.storage, field_file.name
    return lambda: storage.delete(name) if name else None
